//! What every request carries: the OpenAI chat body (HTTP) and the
//! pre-tokenized `GenerateRequest` (gRPC), built once per run. The gRPC
//! prompt is the user message rendered with the model's chat template and
//! encoded with its tokenizer exactly as the gateway does, so both paths
//! send the engine the same token ids.

use std::path::Path;

use anyhow::Context;
use bytes::Bytes;
use iris_model::chat_template::ChatTemplate;
use iris_model::ModelDir;
use iris_proto::scheduler::{GenerateRequest, SamplingParams, TokenizedInput};
use serde_json::json;

/// The default user message: a short text chat.
pub const DEFAULT_PROMPT: &str = "Write one short sentence about the sea.";

/// The JSON body of `POST /v1/chat/completions`.
pub fn chat_body(model: &str, prompt: &str, max_tokens: u32, stream: bool) -> Bytes {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    });
    Bytes::from(body.to_string())
}

/// The prompt's token ids as the gateway computes them: the chat template
/// (with the generation prompt, `bos_token`/`eos_token` set), then the
/// tokenizer without added special tokens.
pub fn prompt_ids(model_path: &Path, prompt: &str) -> anyhow::Result<Vec<u32>> {
    let dir = ModelDir::load(model_path)
        .with_context(|| format!("cannot load the model at {}", model_path.display()))?;
    let source = dir
        .chat_template()
        .context("the model directory has no chat template")?;
    let template = ChatTemplate::new(source).context("the chat template does not compile")?;
    let tc = &dir.tokenizer_config;
    let extra = json!({
        "bos_token": tc.bos_token.clone().unwrap_or_default(),
        "eos_token": tc.eos_token.clone().unwrap_or_default(),
    });
    let messages = json!([{"role": "user", "content": prompt}]);
    let text = template
        .render(&messages, true, Some(&extra))
        .context("cannot render the chat template")?;
    let tokenizer = dir.load_tokenizer().context("cannot load the tokenizer")?;
    let encoding = tokenizer
        .encode(text.as_str(), false)
        .map_err(|e| anyhow::anyhow!("tokenization failed: {e}"))?;
    Ok(encoding.get_ids().to_vec())
}

/// The request the gateway would send for the chat (same sampling fields
/// as the gateway's `generate_request`); the caller sets `request_id`.
pub fn generate_template(input_ids: Vec<u32>, max_tokens: u32, stream: bool) -> GenerateRequest {
    GenerateRequest {
        request_id: String::new(),
        tokenized: Some(TokenizedInput {
            input_ids,
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            max_new_tokens: Some(max_tokens),
            ignore_eos: true,
            skip_special_tokens: true,
            n: 1,
            ..SamplingParams::default()
        }),
        stream,
        ..GenerateRequest::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_body_is_a_short_ignore_eos_chat() {
        let body = chat_body("tiny", "hi", 16, true);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["model"], "tiny");
        assert_eq!(v["max_tokens"], 16);
        assert_eq!(v["ignore_eos"], true);
        assert_eq!(v["stream"], true);
        assert_eq!(v["messages"][0]["content"], "hi");
    }

    #[test]
    fn tokenizes_with_the_tiny_model() {
        let dir = tempfile::tempdir().unwrap();
        iris_model::tiny::write_tiny_qwen2_vl(dir.path()).unwrap();
        let ids = prompt_ids(dir.path(), DEFAULT_PROMPT).unwrap();
        assert!(ids.len() > 5, "{ids:?}");
        let request = generate_template(ids.clone(), 16, false);
        assert_eq!(request.tokenized.unwrap().input_ids, ids);
        assert_eq!(request.sampling_params.unwrap().max_new_tokens, Some(16));
    }
}
