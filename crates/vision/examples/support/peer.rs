//! The peer gateway's (smg's) preprocessing, the published `llm-multimodal`
//! crate, for the examples that set it beside Iris: its processor for a
//! family of the parity reference, and its decode + preprocess of one
//! image's bytes with float32 out.
//!
//! A family smg serves is resolved the way its gateway resolves it, by model
//! id through `VisionProcessorRegistry::with_defaults()`, and is handed the
//! reference's preprocessor config at each call. Pixtral's and
//! Phi-4-multimodal's processors exist in the crate but are not in that
//! registry; they are built from the same config with their
//! `from_preprocessor_config`.
//!
//! The placeholder-token count is the one smg writes into the prompt: its
//! `ModelRegistry` spec for the model (matched by id and `model_type`, with
//! the image-token ids of the model's config.json) expands the image from
//! the processor's output. Pixtral and Phi-4 have no spec there, so no
//! prompt to count in (their processors' `feature_token_counts` count
//! encoder features, not Hugging Face's prompt positions).

use std::collections::HashMap;
use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, OnceLock};

use llm_multimodal::vision::processors::{Phi4VisionProcessor, PixtralProcessor};
use llm_multimodal::{
    EncoderDtype, EncoderInput, ImageDetail, ImageFrame, ImageSize, ImageSource, ModelMetadata,
    ModelRegistry, PreProcessorConfig, PreprocessedEncoderInputs, Tokenizer, TransparencyPolicy,
    VisionPreProcessor, VisionProcessorRegistry,
};
use serde_json::{json, Value};

/// A family's processor in the peer and how it was obtained.
pub struct PeerProcessor {
    pub processor: &'static dyn VisionPreProcessor,
    pub config: PreProcessorConfig,
    /// How it was resolved, for the report.
    pub how: String,
    /// The model id and config.json its prompt spec is looked up by, for a
    /// family smg serves.
    model: Option<(&'static str, Value)>,
}

/// The peer's output for one image: its tensor as float32 and its count of
/// placeholder tokens in smg's prompt (`None` for a family smg does not
/// serve: it has no prompt for it).
pub struct PeerOutput {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
    pub tokens: Option<usize>,
}

/// The model smg serves each parity family as: its id (what the registries
/// match) and the parts of its config.json the prompt spec reads (the
/// image-token ids and vision geometry of the published checkpoints), or
/// `None` for a processor smg does not serve.
fn served_model(family: &str) -> Option<(&'static str, Value)> {
    let clip = json!({"patch_size": 14, "image_size": 336});
    Some(match family {
        "llava" => (
            "llava-hf/llava-1.5-7b-hf",
            json!({"model_type": "llava", "image_token_index": 32000, "vision_config": clip}),
        ),
        "llava_next" => (
            "llava-hf/llava-v1.6-mistral-7b-hf",
            json!({"model_type": "llava_next", "image_token_index": 32000, "vision_config": clip}),
        ),
        "llama4" => (
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            json!({"model_type": "llama4", "image_token_index": 200092, "vision_config":
                {"patch_size": 14, "image_size": 336, "pixel_shuffle_ratio": 0.5}}),
        ),
        "qwen2_vl" => (
            "Qwen/Qwen2-VL-7B-Instruct",
            json!({"model_type": "qwen2_vl", "vision_token_id": 151654, "image_token_id": 151655}),
        ),
        "qwen3_vl" => (
            "Qwen/Qwen3-VL-8B-Instruct",
            json!({"model_type": "qwen3_vl", "image_token_id": 151655, "video_token_id": 151656}),
        ),
        _ => return None,
    })
}

fn registry() -> &'static VisionProcessorRegistry {
    static REGISTRY: OnceLock<VisionProcessorRegistry> = OnceLock::new();
    REGISTRY.get_or_init(VisionProcessorRegistry::with_defaults)
}

/// The peer's processor for `family` with the reference's preprocessor
/// `config`; `Err` says why the peer has none.
pub fn processor(family: &str, config: &serde_json::Value) -> Result<PeerProcessor, String> {
    let config = PreProcessorConfig::from_value(config.clone())
        .map_err(|e| format!("llm-multimodal refuses the config: {e}"))?;
    let (processor, how): (&'static dyn VisionPreProcessor, String) =
        if let Some((id, _)) = served_model(family) {
            let found = registry()
                .find(id, None)
                .ok_or_else(|| format!("no processor registered for {id}"))?;
            (found, format!("registry: `{id}` → {}", found.model_name()))
        } else {
            match family {
                "pixtral" => (
                    Box::leak(Box::new(PixtralProcessor::from_preprocessor_config(
                        &config,
                    ))),
                    "`PixtralProcessor::from_preprocessor_config` (not registered)".into(),
                ),
                "phi4_multimodal" => (
                    Box::leak(Box::new(Phi4VisionProcessor::from_preprocessor_config(
                        &config,
                    ))),
                    "`Phi4VisionProcessor::from_preprocessor_config` (not registered)".into(),
                ),
                _ => return Err(format!("llm-multimodal 1.14.0 has no {family} processor")),
            }
        };
    Ok(PeerProcessor {
        processor,
        config,
        how,
        model: served_model(family),
    })
}

/// The peer's decode of `bytes` as its media connector makes it: the header
/// read for the size, then `ImageFrame`'s decode (libjpeg-turbo for a JPEG
/// when the library is present, libwebp for a still WebP, the `image` crate
/// otherwise), the alpha channel dropped as Pillow's `convert("RGB")` does.
fn decode(bytes: &[u8]) -> Result<ImageFrame, String> {
    let (width, height) = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| e.to_string())?
        .into_dimensions()
        .map_err(|e| e.to_string())?;
    let frame = ImageFrame::encoded(
        bytes::Bytes::copy_from_slice(bytes),
        ImageDetail::Auto,
        ImageSource::InlineBytes,
        String::new(),
        ImageSize::new(width, height),
        None,
    )
    .with_transparency(TransparencyPolicy::DropAlpha);
    frame.image().map_err(|e| e.to_string())?;
    Ok(frame)
}

/// The peer's decoded pixels of `bytes` as 8-bit RGB rows (what its
/// processors start from), or why it could not decode them.
pub fn decoded_rgb(bytes: &[u8]) -> Result<Vec<u8>, String> {
    catch_unwind(AssertUnwindSafe(|| {
        let frame = decode(bytes)?;
        let image = frame.image().map_err(|e| e.to_string())?;
        Ok(image.to_rgb8().into_raw())
    }))
    .unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&panic))))
}

impl PeerProcessor {
    /// Decode + preprocess of one image to float32, as timed: the processor's
    /// own float32 writer where it has one (`preprocess_wire`), else
    /// `preprocess` and its tensor as float32. A panic in the peer is caught
    /// and returned as an error.
    pub fn run(&self, bytes: &[u8]) -> Result<PreprocessedEncoderInputs, String> {
        catch_unwind(AssertUnwindSafe(|| self.run_unguarded(bytes)))
            .unwrap_or_else(|panic| Err(format!("panicked: {}", panic_message(&panic))))
    }

    fn run_unguarded(&self, bytes: &[u8]) -> Result<PreprocessedEncoderInputs, String> {
        let frame = decode(bytes)?;
        let images = std::slice::from_ref(frame.image().map_err(|e| e.to_string())?);
        let wire = self
            .processor
            .preprocess_wire(images, &self.config, EncoderDtype::Float32);
        let out = match wire {
            Some(result) => result,
            None => self.processor.preprocess(images, &self.config),
        }
        .map_err(|e| e.to_string())?;
        if let EncoderInput::U8 { .. } = out.encoder_input {
            // A destination that wants floats normalises the bytes: part of the work.
            std::hint::black_box(out.encoder_input.as_f32());
        }
        Ok(out)
    }

    /// [`run`](Self::run) with the tensor read out as float32 values.
    pub fn output(&self, bytes: &[u8]) -> Result<PeerOutput, String> {
        let out = self.run(bytes)?;
        let tokens = self.prompt_tokens(&out)?;
        Ok(PeerOutput {
            shape: out.encoder_input.shape().to_vec(),
            values: out.encoder_input.flat_f32().into_owned(),
            tokens,
        })
    }

    /// The image's placeholder tokens in smg's prompt (see the module docs).
    fn prompt_tokens(&self, out: &PreprocessedEncoderInputs) -> Result<Option<usize>, String> {
        let Some((model_id, config)) = &self.model else {
            return Ok(None);
        };
        let tokenizer = InterningTokenizer::default();
        let metadata = ModelMetadata {
            model_id,
            tokenizer: &tokenizer,
            config,
        };
        let registry = ModelRegistry::new();
        let spec = registry
            .lookup(&metadata)
            .ok_or_else(|| format!("no prompt spec for {model_id}"))?;
        let placeholder = spec
            .placeholder_token_id(&metadata)
            .map_err(|e| e.to_string())?;
        let replacements = spec
            .prompt_replacements(&metadata, out)
            .map_err(|e| e.to_string())?;
        let first = replacements.first().ok_or("no prompt replacement")?;
        Ok(Some(
            first.tokens.iter().filter(|&&t| t == placeholder).count(),
        ))
    }
}

/// A vocabulary for the prompt specs' structural tokens: each token string
/// asked for gets an id of its own (above any config's image-token id), and
/// only the count of the config's image-token id is read from the prompt.
#[derive(Default)]
struct InterningTokenizer(Mutex<HashMap<String, u32>>);

impl Tokenizer for InterningTokenizer {
    fn token_to_id(&self, token: &str) -> Option<u32> {
        let mut ids = self.0.lock().ok()?;
        let next = 1_000_000 + ids.len() as u32;
        Some(*ids.entry(token.to_string()).or_insert(next))
    }

    /// A config's token id that no string was asked for names itself.
    fn id_to_token(&self, id: u32) -> Option<String> {
        let ids = self.0.lock().ok()?;
        let known = ids.iter().find(|(_, &v)| v == id).map(|(k, _)| k.clone());
        Some(known.unwrap_or_else(|| format!("<|token_{id}|>")))
    }

    fn encode_text(&self, text: &str) -> Option<Vec<u32>> {
        Some(text.bytes().map(u32::from).collect())
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
