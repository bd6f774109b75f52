//! From chat messages to prompt token ids: the model's chat template
//! (minijinja) and its tokenizer.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use iris_model::chat_template::ChatTemplate;
use iris_model::ModelDir;
use iris_openai::ApiError;
use serde_json::Value;
use tokenizers::Tokenizer;

use crate::tokencache::SegmentTokenizer;

pub struct Prompter {
    template: ChatTemplate,
    tokenizer: Arc<Tokenizer>,
    segments: SegmentTokenizer,
    /// Variables HF templates expect besides the messages.
    extra: Value,
}

impl Prompter {
    /// Loads the tokenizer and the chat template (`template_file` wins over
    /// the model directory's own).
    pub fn load(
        dir: &ModelDir,
        template_file: Option<&Path>,
        cache_entries: usize,
    ) -> anyhow::Result<Prompter> {
        let tokenizer = Arc::new(dir.load_tokenizer().context("cannot load the tokenizer")?);
        let source = match template_file {
            Some(path) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read chat template {}", path.display()))?,
            None => dir
                .chat_template()
                .map(str::to_owned)
                .context("the model directory has no chat template; pass --chat-template FILE")?,
        };
        let template = ChatTemplate::new(&source).context("the chat template does not compile")?;
        let tc = &dir.tokenizer_config;
        let extra = serde_json::json!({
            "bos_token": tc.bos_token.clone().unwrap_or_default(),
            "eos_token": tc.eos_token.clone().unwrap_or_default(),
        });
        let segments = SegmentTokenizer::new(tokenizer.clone(), cache_entries);
        Ok(Prompter {
            template,
            tokenizer,
            segments,
            extra,
        })
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Renders `messages` (HF message dicts) with the generation prompt.
    pub fn render(&self, messages: &Value) -> Result<String, ApiError> {
        self.template
            .render(messages, true, Some(&self.extra))
            .map_err(|e| {
                ApiError::bad_request(format!("the chat template rejected these messages: {e}"))
            })
    }

    /// Token ids of rendered prompt text (the template already placed the
    /// special tokens, so none are added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.segments
            .encode(text)
            .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))
    }

    /// (hits, misses) of the segment cache.
    pub fn cache_stats(&self) -> (u64, u64) {
        self.segments.stats()
    }
}
