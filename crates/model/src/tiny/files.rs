//! The JSON and text files of the tiny model, rendered in memory.

use serde_json::{json, Value};

use super::bpe::{self, Bpe};
use super::template::CHAT_TEMPLATE;
use super::words::WORDS;
use super::*;
use crate::ModelError;

/// Every file as `(name, contents)`, in [`FILES`] order.
pub(super) fn render_all() -> Result<Vec<(&'static str, String)>, ModelError> {
    let bpe = bpe::train(WORDS, ORDINARY_VOCAB_SIZE as usize)?;
    let specials: Vec<&str> = SPECIAL_TOKENS.iter().map(|(t, _)| *t).collect();
    Ok(vec![
        ("config.json", pretty(&config())?),
        ("generation_config.json", pretty(&generation_config())?),
        ("merges.txt", bpe.merges_txt()),
        ("preprocessor_config.json", pretty(&preprocessor_config())?),
        ("special_tokens_map.json", pretty(&special_tokens_map())?),
        (
            "tokenizer.json",
            with_newline(bpe.tokenizer_json(&specials)?),
        ),
        ("tokenizer_config.json", pretty(&tokenizer_config())?),
        ("vocab.json", with_newline(vocab_json(&bpe)?)),
    ])
}

fn vocab_json(bpe: &Bpe) -> Result<String, ModelError> {
    bpe.vocab_json()
}

fn with_newline(mut s: String) -> String {
    s.push('\n');
    s
}

fn pretty(value: &Value) -> Result<String, ModelError> {
    serde_json::to_string_pretty(value)
        .map(with_newline)
        .map_err(|e| ModelError::Tiny {
            message: format!("cannot serialise JSON: {e}"),
        })
}

fn config() -> Value {
    json!({
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "attention_dropout": 0.0,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "hidden_act": "silu",
        "hidden_size": HIDDEN_SIZE,
        "image_token_id": IMAGE_PAD_ID,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": MAX_CONTEXT,
        "max_window_layers": 2,
        "model_type": "qwen2_vl",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_scaling": { "mrope_section": [2, 3, 3], "rope_type": "default", "type": "mrope" },
        "rope_theta": 1000000.0,
        "sliding_window": MAX_CONTEXT,
        "tie_word_embeddings": true,
        "torch_dtype": "float32",
        "use_cache": true,
        "use_sliding_window": false,
        "video_token_id": VIDEO_PAD_ID,
        "vision_config": {
            "depth": 2,
            "embed_dim": 32,
            "hidden_act": "quick_gelu",
            "hidden_size": HIDDEN_SIZE,
            "in_chans": 3,
            "mlp_ratio": 2,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "temporal_patch_size": 2,
        },
        "vision_end_token_id": VISION_END_ID,
        "vision_start_token_id": VISION_START_ID,
        "vision_token_id": VISION_PAD_ID,
        "vocab_size": VOCAB_SIZE,
    })
}

fn generation_config() -> Value {
    json!({
        "bos_token_id": ENDOFTEXT_ID,
        "do_sample": true,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
        "repetition_penalty": 1.05,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
    })
}

/// Qwen2-VL's image processor defaults: CLIP mean/std, 14-pixel patches,
/// 2×2 merge, 2-frame temporal patches, 3136..12845056 pixels.
fn preprocessor_config() -> Value {
    json!({
        "do_convert_rgb": true,
        "do_normalize": true,
        "do_rescale": true,
        "do_resize": true,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "Qwen2VLImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "max_pixels": 12845056,
        "merge_size": 2,
        "min_pixels": 3136,
        "patch_size": 14,
        "processor_class": "Qwen2VLProcessor",
        "resample": 3,
        "rescale_factor": 1.0 / 255.0,
        "size": { "longest_edge": 12845056, "shortest_edge": 3136 },
        "temporal_patch_size": 2,
    })
}

fn token_object(content: &str) -> Value {
    json!({
        "content": content,
        "lstrip": false,
        "normalized": false,
        "rstrip": false,
        "single_word": false,
    })
}

/// The special tokens other than `<|endoftext|>`, as Qwen2-VL lists them.
fn additional_special_tokens() -> Vec<&'static str> {
    SPECIAL_TOKENS[1..].iter().map(|(t, _)| *t).collect()
}

fn special_tokens_map() -> Value {
    json!({
        "additional_special_tokens": additional_special_tokens(),
        "eos_token": token_object("<|im_end|>"),
        "pad_token": token_object("<|endoftext|>"),
    })
}

fn tokenizer_config() -> Value {
    let mut decoder = serde_json::Map::new();
    for (content, id) in SPECIAL_TOKENS {
        let mut entry = token_object(content);
        entry["special"] = Value::Bool(true);
        decoder.insert(id.to_string(), entry);
    }
    json!({
        "add_bos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": additional_special_tokens(),
        "bos_token": null,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MAX_CONTEXT,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": null,
    })
}
