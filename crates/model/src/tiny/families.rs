//! Tiny model directories for the vision-language families Iris serves
//! besides Qwen2-VL: LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision, Gemma 3,
//! Idefics3 / SmolVLM, Pixtral, InternVL 3 / 3.5, Llama 4 and
//! Phi-4-multimodal.
//!
//! Each family's directory has the tiny byte-level BPE with one merge
//! added (`\n\n`, at [`NEWLINES_ID`], so that blank lines written next to
//! message text tokenize differently from blank lines tokenized apart, as
//! in the real vocabularies) followed by the family's special tokens; the
//! family's real chat template (`templates/`, sources in its README);
//! `preprocessor_config.json` and `processor_config.json` as the public
//! checkpoints ship them; a `config.json` with the family's `model_type`,
//! architecture and token ids and a small `vision_config`. No weights:
//! the reference engine needs none, and `iris-encoder`'s tower is
//! Qwen-shaped. [`Family::Qwen2Vl`] is the tiny Qwen2-VL model of
//! [`super::write_tiny_qwen2_vl`].

use std::fmt;
use std::fs;
use std::path::Path;
use std::str::FromStr;

use serde_json::{json, Value};

use super::{bpe, words::WORDS, HIDDEN_SIZE, MAX_CONTEXT, ORDINARY_VOCAB_SIZE, SPECIAL_TOKENS};
use crate::ModelError;

/// The `\n\n` merge's token (`ĊĊ`), right after the ordinary tokens.
pub const NEWLINES_ID: u32 = ORDINARY_VOCAB_SIZE;

/// Files a family's directory holds ([`write_family`]).
pub const FAMILY_FILES: &[&str] = &[
    "chat_template.jinja",
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
];

/// A vision-language family with a tiny model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Qwen2Vl,
    Llava,
    LlavaNext,
    LlavaOnevision,
    Gemma3,
    Idefics3,
    Pixtral,
    Internvl,
    Llama4,
    Phi4Multimodal,
}

impl Family {
    /// Every family, the default first.
    pub const ALL: [Family; 10] = [
        Family::Qwen2Vl,
        Family::Llava,
        Family::LlavaNext,
        Family::LlavaOnevision,
        Family::Gemma3,
        Family::Idefics3,
        Family::Pixtral,
        Family::Internvl,
        Family::Llama4,
        Family::Phi4Multimodal,
    ];

    /// The name `iris tiny-model --family` takes.
    pub fn name(self) -> &'static str {
        match self {
            Family::Qwen2Vl => "qwen2_vl",
            Family::Llava => "llava",
            Family::LlavaNext => "llava_next",
            Family::LlavaOnevision => "llava_onevision",
            Family::Gemma3 => "gemma3",
            Family::Idefics3 => "idefics3",
            Family::Pixtral => "pixtral",
            Family::Internvl => "internvl",
            Family::Llama4 => "llama4",
            Family::Phi4Multimodal => "phi4_multimodal",
        }
    }

    /// The family's directory contents; `None` for [`Family::Qwen2Vl`],
    /// whose tiny model [`super::write_tiny_qwen2_vl`] writes.
    pub fn spec(self) -> Option<FamilySpec> {
        match self {
            Family::Qwen2Vl => None,
            Family::Llava => Some(llava(false)),
            Family::LlavaNext => Some(llava(true)),
            Family::LlavaOnevision => Some(llava_onevision()),
            Family::Gemma3 => Some(gemma3()),
            Family::Idefics3 => Some(idefics3()),
            Family::Pixtral => Some(pixtral()),
            Family::Internvl => Some(internvl()),
            Family::Llama4 => Some(llama4()),
            Family::Phi4Multimodal => Some(phi4_multimodal()),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Family {
    type Err = ModelError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let names: Vec<&str> = Family::ALL.iter().map(|f| f.name()).collect();
        Family::ALL
            .into_iter()
            .find(|f| f.name() == name)
            .ok_or_else(|| ModelError::Tiny {
                message: format!(
                    "no tiny model for the family {name:?} (one of: {})",
                    names.join(", ")
                ),
            })
    }
}

/// What a family's model directory holds.
#[derive(Debug, Clone)]
pub struct FamilySpec {
    /// `config.json`'s `model_type` and architecture.
    pub model_type: &'static str,
    pub architecture: &'static str,
    /// Special tokens, in id order from `NEWLINES_ID + 1`.
    pub specials: Vec<String>,
    /// The tokens the template writes as `bos_token` / `eos_token`.
    pub bos: &'static str,
    pub eos: &'static str,
    /// The image token (`image_token_id`).
    pub image_token: &'static str,
    /// The chat template's source.
    pub template: String,
    pub preprocessor: Value,
    /// `processor_config.json`: the model processor's placeholder counts.
    pub processor_config: Value,
}

impl FamilySpec {
    /// The id of special token `token`.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        let index = self.specials.iter().position(|s| s == token)?;
        Some(special_id(index))
    }

    /// The image token's id.
    pub fn image_token_id(&self) -> Result<u32, ModelError> {
        self.token_id(self.image_token)
            .ok_or_else(|| tiny_error(format!("{} is not special", self.image_token)))
    }

    fn vocab_size(&self) -> u32 {
        special_id(self.specials.len())
    }
}

/// Writes `family`'s tiny model into `dir` (created if needed; files of
/// the same names are overwritten).
pub fn write_tiny_model(dir: &Path, family: Family) -> Result<(), ModelError> {
    match family.spec() {
        Some(spec) => write_family(dir, &spec),
        None => super::write_tiny_qwen2_vl(dir),
    }
}

/// Writes the directory `spec` describes into `dir` ([`FAMILY_FILES`]).
pub fn write_family(dir: &Path, spec: &FamilySpec) -> Result<(), ModelError> {
    fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, "create directory", e))?;
    let files = [
        ("chat_template.jinja", spec.template.clone()),
        ("config.json", pretty(&config(spec)?)?),
        ("preprocessor_config.json", pretty(&spec.preprocessor)?),
        ("processor_config.json", pretty(&spec.processor_config)?),
        ("tokenizer.json", pretty(&tokenizer(spec)?)?),
        ("tokenizer_config.json", pretty(&tokenizer_config(spec))?),
    ];
    for (name, contents) in files {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|e| ModelError::io(&path, "write", e))?;
    }
    Ok(())
}

/// The id of the `index`-th special token of a family.
pub fn special_id(index: usize) -> u32 {
    NEWLINES_ID + 1 + index as u32
}

fn tiny_error(message: String) -> ModelError {
    ModelError::Tiny { message }
}

fn pretty(value: &Value) -> Result<String, ModelError> {
    serde_json::to_string_pretty(value)
        .map_err(|e| tiny_error(format!("cannot serialise JSON: {e}")))
}

/// The tiny BPE plus `ĊĊ`, with the family's special tokens.
fn tokenizer(spec: &FamilySpec) -> Result<Value, ModelError> {
    let bpe = bpe::train(WORDS, ORDINARY_VOCAB_SIZE as usize)?;
    let qwen: Vec<&str> = SPECIAL_TOKENS.iter().map(|(t, _)| *t).collect();
    let text = bpe.tokenizer_json(&qwen)?;
    let mut tokenizer: Value = serde_json::from_str(&text)
        .map_err(|e| tiny_error(format!("tokenizer.json does not parse: {e}")))?;
    tokenizer["model"]["vocab"]["ĊĊ"] = json!(NEWLINES_ID);
    match tokenizer["model"]["merges"].as_array_mut() {
        Some(merges) => merges.insert(0, json!("Ċ Ċ")),
        None => return Err(tiny_error("tokenizer.json has no merges list".into())),
    }
    let added: Vec<Value> = spec
        .specials
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({"id": special_id(i), "content": content, "single_word": false,
                   "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    tokenizer["added_tokens"] = Value::Array(added);
    Ok(tokenizer)
}

fn tokenizer_config(spec: &FamilySpec) -> Value {
    json!({"bos_token": spec.bos, "eos_token": spec.eos,
           "model_max_length": MAX_CONTEXT, "tokenizer_class": "PreTrainedTokenizerFast"})
}

/// A small language model and vision tower, with the family's token ids
/// and the patch size of its preprocessor (14 unless it says otherwise).
fn config(spec: &FamilySpec) -> Result<Value, ModelError> {
    let patch = match &spec.preprocessor["patch_size"] {
        Value::Number(n) => n.as_u64().unwrap_or(14),
        Value::Object(o) => o.get("height").and_then(Value::as_u64).unwrap_or(14),
        _ => 14,
    };
    Ok(json!({
        "architectures": [spec.architecture],
        "model_type": spec.model_type,
        "bos_token_id": spec.token_id(spec.bos),
        "eos_token_id": spec.token_id(spec.eos),
        "image_token_id": spec.image_token_id()?,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": 128,
        "max_position_embeddings": MAX_CONTEXT,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "torch_dtype": "float32",
        "vision_config": {
            "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
            "num_hidden_layers": 2, "patch_size": patch,
        },
        "vocab_size": spec.vocab_size(),
    }))
}

fn strings(tokens: &[&str]) -> Vec<String> {
    tokens.iter().map(|s| s.to_string()).collect()
}

/// CLIP's normalisation, which the LLaVA-1.5/NeXT and Pixtral configs use.
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// LLaVA-1.5 (`CLIPImageProcessor`) or, with `anyres`, LLaVA-NeXT: the
/// image token repeated, 576 times or once per feature of the tiles.
fn llava(anyres: bool) -> FamilySpec {
    let mut preprocessor = json!({
        "image_processor_type": "CLIPImageProcessor",
        "crop_size": {"height": 336, "width": 336}, "do_center_crop": true,
        "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
        "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
        "resample": 3, "rescale_factor": 0.00392156862745098,
        "size": {"shortest_edge": 336},
    });
    let (mut model_type, mut architecture) = ("llava", "LlavaForConditionalGeneration");
    if anyres {
        (model_type, architecture) = ("llava_next", "LlavaNextForConditionalGeneration");
        preprocessor["image_processor_type"] = json!("LlavaNextImageProcessor");
        preprocessor["do_pad"] = json!(true);
        preprocessor["image_grid_pinpoints"] =
            json!([[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]);
    }
    FamilySpec {
        model_type,
        architecture,
        specials: strings(&["<s>", "</s>", "<image>"]),
        bos: "<s>",
        eos: "</s>",
        image_token: "<image>",
        template: include_str!("templates/llava.jinja").to_owned(),
        preprocessor,
        processor_config: json!({
            "patch_size": 14, "vision_feature_select_strategy": "default",
            "num_additional_image_tokens": 1,
        }),
    }
}

/// LLaVA-OneVision: `<image>` once per feature of the image's tiles
/// (anyres_max_9).
fn llava_onevision() -> FamilySpec {
    let pinpoints: Vec<[u32; 2]> = (1..=6)
        .flat_map(|i| (1..=6).map(move |j| [i * 384, j * 384]))
        .collect();
    FamilySpec {
        model_type: "llava_onevision",
        architecture: "LlavaOnevisionForConditionalGeneration",
        specials: strings(&["<|im_start|>", "<|im_end|>", "<image>", "<video>"]),
        bos: "<|im_start|>",
        eos: "<|im_end|>",
        image_token: "<image>",
        template: include_str!("templates/llava_onevision.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "LlavaOnevisionImageProcessor",
            "do_convert_rgb": true, "do_normalize": true, "do_pad": true,
            "do_rescale": true, "do_resize": true,
            "image_grid_pinpoints": pinpoints,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"height": 384, "width": 384},
        }),
        processor_config: json!({
            "num_image_tokens": 729, "vision_aspect_ratio": "anyres_max_9",
            "vision_feature_select_strategy": "full",
        }),
    }
}

/// Gemma 3: 256 `<image_soft_token>`s between `<start_of_image>` and
/// `<end_of_image>` per 896×896 crop (pan and scan off, as shipped).
fn gemma3() -> FamilySpec {
    FamilySpec {
        model_type: "gemma3",
        architecture: "Gemma3ForConditionalGeneration",
        specials: strings(&[
            "<bos>",
            "<eos>",
            "<start_of_turn>",
            "<end_of_turn>",
            "<start_of_image>",
            "<end_of_image>",
            "<image_soft_token>",
        ]),
        bos: "<bos>",
        eos: "<eos>",
        image_token: "<image_soft_token>",
        template: include_str!("templates/gemma3.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "Gemma3ImageProcessor",
            "processor_class": "Gemma3Processor",
            "do_convert_rgb": null, "do_normalize": true, "do_pan_and_scan": null,
            "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "image_seq_length": 256,
            "pan_and_scan_max_num_crops": null, "pan_and_scan_min_crop_size": null,
            "pan_and_scan_min_ratio_to_activate": null,
            "resample": 2, "rescale_factor": 0.00392156862745098,
            "size": {"height": 896, "width": 896},
        }),
        processor_config: json!({"image_seq_length": 256, "processor_class": "Gemma3Processor"}),
    }
}

/// Idefics3 / SmolVLM: 81 `<image>`s per 384×384 tile, each tile tagged
/// with its row and column, then the global image.
fn idefics3() -> FamilySpec {
    let mut specials = strings(&[
        "<|im_start|>",
        "<end_of_utterance>",
        "<fake_token_around_image>",
        "<image>",
        "<global-img>",
    ]);
    for row in 1..=6 {
        specials.extend((1..=6).map(|col| format!("<row_{row}_col_{col}>")));
    }
    FamilySpec {
        model_type: "idefics3",
        architecture: "Idefics3ForConditionalGeneration",
        specials,
        bos: "<|im_start|>",
        eos: "<end_of_utterance>",
        image_token: "<image>",
        template: include_str!("templates/smolvlm.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "Idefics3ImageProcessor",
            "processor_class": "Idefics3Processor",
            "do_convert_rgb": true, "do_image_splitting": true, "do_normalize": true,
            "do_pad": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "max_image_size": {"longest_edge": 384},
            "resample": 1, "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 1536},
        }),
        processor_config: json!({"image_seq_len": 81, "processor_class": "Idefics3Processor"}),
    }
}

/// Pixtral: one `[IMG]` per 16×16 patch, `[IMG_BREAK]` after each row and
/// `[IMG_END]` after the last.
fn pixtral() -> FamilySpec {
    FamilySpec {
        model_type: "llava",
        architecture: "LlavaForConditionalGeneration",
        specials: strings(&[
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[IMG]",
            "[IMG_BREAK]",
            "[IMG_END]",
        ]),
        bos: "<s>",
        eos: "</s>",
        image_token: "[IMG]",
        template: include_str!("templates/pixtral.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "PixtralImageProcessor",
            "processor_class": "PixtralProcessor",
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "image_mean": CLIP_MEAN, "image_std": CLIP_STD,
            "patch_size": {"height": 16, "width": 16},
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"longest_edge": 1024},
        }),
        processor_config: json!({
            "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
            "image_token": "[IMG]", "patch_size": 16, "processor_class": "PixtralProcessor",
        }),
    }
}

/// InternVL 3 / 3.5 (the HF-format checkpoints): `<img>`, 256
/// `<IMG_CONTEXT>`s per 448×448 tile (and per thumbnail), `</img>`.
fn internvl() -> FamilySpec {
    FamilySpec {
        model_type: "internvl",
        architecture: "InternVLForConditionalGeneration",
        specials: strings(&[
            "<|im_start|>",
            "<|im_end|>",
            "<img>",
            "</img>",
            "<IMG_CONTEXT>",
            "<video>",
        ]),
        bos: "<|im_start|>",
        eos: "<|im_end|>",
        image_token: "<IMG_CONTEXT>",
        template: include_str!("templates/internvl.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "GotOcr2ImageProcessorFast",
            "processor_class": "InternVLProcessor",
            "crop_to_patches": false, "do_convert_rgb": true, "do_normalize": true,
            "do_rescale": true, "do_resize": true,
            "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
            "max_patches": 12, "min_patches": 1,
            "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"height": 448, "width": 448},
        }),
        processor_config: json!({"image_seq_length": 256, "processor_class": "InternVLProcessor"}),
    }
}

/// Llama 4: `<|image_start|>`, 144 `<|patch|>`s per 336×336 tile with
/// the tile separators, `<|image|>` and the global tile's, `<|image_end|>`.
/// The image token (the features' place) is `<|patch|>`; the template's
/// mark is `<|image|>`.
fn llama4() -> FamilySpec {
    FamilySpec {
        model_type: "llama4",
        architecture: "Llama4ForConditionalGeneration",
        specials: strings(&[
            "<|begin_of_text|>",
            "<|eot|>",
            "<|header_start|>",
            "<|header_end|>",
            "<|image_start|>",
            "<|image_end|>",
            "<|image|>",
            "<|patch|>",
            "<|tile_x_separator|>",
            "<|tile_y_separator|>",
            "<|python_start|>",
            "<|python_end|>",
        ]),
        bos: "<|begin_of_text|>",
        eos: "<|eot|>",
        image_token: "<|patch|>",
        template: include_str!("templates/llama4.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "Llama4ImageProcessorFast",
            "processor_class": "Llama4Processor",
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "max_patches": 16, "resample": 2, "rescale_factor": 0.00392156862745098,
            "resize_to_max_canvas": false, "size": {"height": 336, "width": 336},
        }),
        processor_config: json!({
            "fake_image_token": "<|image|>", "image_token": "<|image|>", "patch_size": 14,
            "processor_class": "Llama4Processor",
        }),
    }
}

/// Phi-4-multimodal (microsoft/Phi-4-multimodal-instruct, the
/// transformers-native config): the template's `<|image|>` (200010 in
/// the real vocabulary, once `<|endoftext10|>`) repeated `num_img_tokens`
/// times; 448-pixel tiles, at most 36, and the global frame. The real
/// tokenizer's `eos_token` is `<|endoftext|>`; its generation config also
/// stops at `<|end|>`, the end of a turn, which is the tiny model's eos.
fn phi4_multimodal() -> FamilySpec {
    FamilySpec {
        model_type: "phi4_multimodal",
        architecture: "Phi4MultimodalForCausalLM",
        specials: strings(&[
            "<|endoftext|>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|end|>",
            "<|tool|>",
            "<|/tool|>",
            "<|image|>",
            "<|audio|>",
        ]),
        bos: "<|endoftext|>",
        eos: "<|end|>",
        image_token: "<|image|>",
        template: include_str!("templates/phi4_multimodal.jinja").to_owned(),
        preprocessor: json!({
            "image_processor_type": "Phi4MultimodalImageProcessorFast",
            "processor_class": "Phi4MultimodalProcessor",
            "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
            "dynamic_hd": 36, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "patch_size": 14, "resample": 3, "rescale_factor": 0.00392156862745098,
            "size": {"height": 448, "width": 448},
        }),
        processor_config: json!({"processor_class": "Phi4MultimodalProcessor"}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for family in Family::ALL {
            assert_eq!(family.name().parse::<Family>().ok(), Some(family));
        }
        let err = "blip2".parse::<Family>().err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("one of: qwen2_vl, llava")));
    }

    #[test]
    fn every_family_writes_a_loadable_directory() {
        for family in Family::ALL {
            let dir = tempfile::tempdir().expect("temp dir");
            write_tiny_model(dir.path(), family).expect("written");
            let model = crate::ModelDir::load(dir.path()).expect("loads");
            assert!(model.config.supports_vision(), "{family}");
            let Some(spec) = family.spec() else { continue };
            let image = spec.image_token_id().expect("image token");
            assert_eq!(model.config.image_token_id, Some(image), "{family}");
            let tokenizer = model.load_tokenizer().expect("tokenizer");
            assert_eq!(tokenizer.token_to_id(spec.image_token), Some(image));
            assert_eq!(tokenizer.token_to_id("ĊĊ"), Some(NEWLINES_ID));
        }
    }
}
