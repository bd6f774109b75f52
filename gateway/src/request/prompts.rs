//! Prompts made ready for the workers: the legacy completions API's
//! request — text prompts tokenized with the tokenizer's special tokens,
//! token-id prompts taken as they are, a batch of either — each checked
//! against the vocabulary, the model's media tokens and the context
//! ([`ReadyPrompts`]). One worker request per prompt, with `n` and the
//! log probability fields set, built by [`ReadyPrompts::generate`].

use std::sync::Arc;
use std::time::Instant;

use iris_openai::{ApiError, CompletionRequest, PromptInput};
use iris_proto::scheduler::GenerateRequest;
use tokenizers::Tokenizer;

use super::Input;
use crate::http::generate::generate_request;
use crate::http::{Failure, Ledger, INLINE_PROMPT_BYTES};
use crate::metrics::{Outcome, Stage};
use crate::served::Served;

/// One prompt of the batch, tokenized.
pub struct PromptRun {
    /// Token ids sent to the worker.
    pub ids: Vec<u32>,
    /// The prompt's text, for `echo` (empty without it).
    pub echo: String,
}

/// Prompts ready to send.
pub struct ReadyPrompts {
    pub served: Arc<Served>,
    pub request: CompletionRequest,
    pub prompts: Vec<PromptRun>,
}

impl ReadyPrompts {
    /// The worker request of prompt `p`; its id is the completion's
    /// (`id`), with `-p` for batches.
    pub fn generate(&self, id: &str, p: usize) -> GenerateRequest {
        let request_id = match self.request.prompt.is_batch() {
            false => id.to_owned(),
            true => format!("{id}-{p}"),
        };
        let sampling = self.request.sampling();
        let ids = self.prompts[p].ids.clone();
        let mut request = generate_request(&request_id, ids, &sampling, self.request.is_stream());
        request.lora_id = self.served.lora_id();
        request
    }
}

impl Input for CompletionRequest {
    type Ready = ReadyPrompts;

    /// Checks and tokenizes the prompts; `ledger` gets their token count.
    async fn prepare(
        self,
        served: Arc<Served>,
        ledger: &mut Ledger,
    ) -> Result<ReadyPrompts, Failure> {
        let request = self;
        let client = |e: ApiError| (e, Outcome::ClientError);
        check_vocabulary(&served, &request).map_err(client)?;
        let tokenize_start = Instant::now();
        let prompts = if request.prompt.text_bytes() <= INLINE_PROMPT_BYTES {
            tokenize_prompts(&served, &request)
        } else {
            let (served, request) = (served.clone(), request.clone());
            super::off_runtime("tokenization", move || tokenize_prompts(&served, &request)).await?
        }
        .map_err(client)?;
        ledger
            .metrics
            .stage(Stage::Tokenize, tokenize_start.elapsed());
        ledger.prompt_tokens = prompts
            .iter()
            .map(|p| u32::try_from(p.ids.len()).unwrap_or(u32::MAX))
            .fold(0u32, u32::saturating_add);
        Ok(ReadyPrompts {
            served,
            request,
            prompts,
        })
    }
}

/// Token ids the request names (`logit_bias`, `stop_token_ids`) must be
/// in the vocabulary.
fn check_vocabulary(served: &Served, request: &CompletionRequest) -> Result<(), ApiError> {
    iris_openai::validate::check_token_ids_in(
        request.logit_bias.as_ref(),
        request.stop_token_ids.as_deref(),
        served.prompter.vocab_size(),
    )
}

/// Token ids the tokenizer knows (special tokens included).
pub fn vocab_size(tokenizer: &Tokenizer) -> u32 {
    u32::try_from(tokenizer.get_vocab_size(true)).unwrap_or(u32::MAX)
}

/// Each prompt's token ids (and text for `echo`), checked against the
/// vocabulary, the image token and the context.
fn tokenize_prompts(
    served: &Served,
    request: &CompletionRequest,
) -> Result<Vec<PromptRun>, ApiError> {
    let tokenizer = served.prompter.tokenizer();
    let batch = request.prompt.is_batch();
    let max_new_tokens = request.sampling().max_new_tokens;
    let mut runs = Vec::with_capacity(request.prompt.len());
    for (p, input) in request.prompt.inputs().into_iter().enumerate() {
        let param = if batch {
            format!("prompt[{p}]")
        } else {
            "prompt".to_owned()
        };
        let run = tokenize_prompt(tokenizer, input, request.echo(), &param)?;
        check_prompt_ids(served, &run.ids, &param)?;
        served
            .prompter
            .limits()
            .check_tokens(run.ids.len(), max_new_tokens)
            .map_err(|e| e.with_param(param.clone()))?;
        runs.push(run);
    }
    Ok(runs)
}

/// One prompt's ids; its text when `echo` asks for it (token-id prompts
/// are detokenized, special tokens kept).
fn tokenize_prompt(
    tokenizer: &Tokenizer,
    input: PromptInput,
    echo: bool,
    param: &str,
) -> Result<PromptRun, ApiError> {
    let (ids, text) = match input {
        PromptInput::Text(text) => {
            let encoding = tokenizer
                .encode(text.as_str(), true)
                .map_err(|e| ApiError::internal(format!("tokenization failed: {e}")))?;
            (encoding.get_ids().to_vec(), text)
        }
        PromptInput::Tokens(ids) => {
            check_ids(tokenizer, &ids, param)?;
            let text = match echo {
                true => tokenizer.decode(&ids, false).map_err(|e| {
                    ApiError::bad_field(param, format!("{param}: cannot be detokenized: {e}"))
                })?,
                false => String::new(),
            };
            (ids, text)
        }
    };
    if ids.is_empty() {
        return Err(ApiError::bad_field(
            param,
            format!("{param}: tokenizes to no tokens"),
        ));
    }
    Ok(PromptRun {
        ids,
        echo: if echo { text } else { String::new() },
    })
}

/// Every id of a token-id prompt is in the vocabulary.
pub fn check_ids(tokenizer: &Tokenizer, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = vocab_size(tokenizer);
    match ids.iter().position(|&id| id >= vocab) {
        Some(i) => {
            let param = format!("{param}[{i}]");
            Err(ApiError::bad_field(
                param.clone(),
                format!(
                    "{param}: token id {} is outside the vocabulary (size {vocab})",
                    ids[i]
                ),
            ))
        }
        None => Ok(()),
    }
}

/// Completions are text only: a vision model's image or video token may
/// not appear in a prompt (no image or video could fill it).
fn check_prompt_ids(served: &Served, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let Some(mm) = served.media.as_ref() else {
        return Ok(());
    };
    let tokens = mm.placeholders;
    let found = [("image", Some(tokens.image)), ("video", tokens.video)]
        .into_iter()
        .find_map(|(kind, token)| token.filter(|t| ids.contains(t)).map(|t| (kind, t)));
    if let Some((kind, token)) = found {
        return Err(ApiError::bad_field(
            param,
            format!(
                "{param}: holds the {kind} token (id {token}); /v1/completions takes text only, send {kind}s to /v1/chat/completions"
            ),
        ));
    }
    Ok(())
}
