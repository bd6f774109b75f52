//! `POST /v1/chat/completions`: read and validate the body, build the
//! prompt, start the request on workers, then answer as SSE
//! ([`stream`]) or as one JSON body ([`complete`]). However it ends, the
//! request is counted and logged once ([`record`]).

mod choice;
mod complete;
pub(crate) mod errors;
mod logprobs;
pub(crate) mod record;
mod stream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use futures::future::BoxFuture;
use futures::FutureExt;
use iris_openai::{ApiError, ChatCompletionRequest, Constraint, ImageUrl, Sampling, VideoUrl};
use iris_proto::scheduler::{
    sampling_params, GenerateRequest, MultimodalInputs, SamplingParams, TokenizedInput,
};
use tracing::Instrument;

pub use errors::error_response;

use crate::metrics::{Outcome, Stage};
use crate::mm::items::{expand_placeholders, fill_pixels, multimodal_inputs};
use crate::mm::pending::{Loaded, PendingImages};
use crate::mm::pixels::ItemLayout;
use crate::output::OutputPlan;
use crate::router::Mode;
use crate::server::AppState;
use choice::ChoiceText;
use record::{ImageCount, RequestLine, CHAT};

/// Bodies larger than this are prompt-built on the blocking pool.
pub(crate) const INLINE_PROMPT_BYTES: usize = 16 << 10;

/// A request ready to send: its id, prompt and options.
pub struct Prepared {
    pub id: String,
    pub request: ChatCompletionRequest,
    pub generate: GenerateRequest,
    /// Stop strings, matched by the gateway on the decoded text.
    pub stop: Vec<String>,
    /// Choices asked (`n`).
    pub n: u32,
    /// Whether the choices carry log probabilities.
    pub logprobs: bool,
    /// How the text becomes content, reasoning and tool calls.
    pub output: OutputPlan,
    pub prompt_tokens: u32,
    pub started: Instant,
    /// The request's images: their pixels as they become ready (EPD sends
    /// each image's Encode as soon as it is), and the memory of the tensors
    /// preprocessed for this request, given back once the request has been
    /// handed to the workers (dropped).
    pub pending: PendingImages,
    pub images: ImageCount,
}

impl Prepared {
    /// The text state of each choice, in index order.
    fn choices(&self, state: &AppState) -> Vec<ChoiceText> {
        (0..self.n)
            .map(|_| {
                let tokenizer = state.prompter.tokenizer().clone();
                ChoiceText::new(tokenizer, self.stop.clone(), self.logprobs)
            })
            .collect()
    }

    /// Counts and logs the request's end ([`RequestLine::record`]); once.
    fn record(
        &self,
        state: &AppState,
        status: u16,
        outcome: Outcome,
        completion_tokens: u32,
        error: Option<&str>,
    ) {
        RequestLine {
            endpoint: CHAT,
            id: &self.id,
            started: self.started,
            status,
            outcome,
            prompt_tokens: self.prompt_tokens,
            completion_tokens,
            images: self.images,
            user: self.request.user.as_deref(),
            error,
        }
        .record(&state.metrics);
    }
}

pub async fn handle(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let id = iris_openai::new_completion_id();
    // Every log line of the request (routing, retries, failures) carries its id.
    let span = tracing::info_span!("chat", request_id = %id);
    respond(state, request, id).instrument(span).await
}

async fn respond(state: Arc<AppState>, request: Request, id: String) -> Response {
    let started = Instant::now();
    let mut images = ImageCount::default();
    match prepare(
        &state,
        request.into_body(),
        id.clone(),
        started,
        &mut images,
    )
    .await
    {
        Ok(prepared) if prepared.request.is_stream() => stream::respond(state, prepared).await,
        Ok(prepared) => complete::respond(state, prepared).await,
        Err((error, outcome)) => {
            RequestLine {
                endpoint: CHAT,
                id: &id,
                started,
                status: error.status,
                outcome,
                prompt_tokens: 0,
                completion_tokens: 0,
                images,
                user: None,
                error: Some(&error.message),
            }
            .record(&state.metrics);
            let mut response = error_response(&error);
            if error.status == 408 {
                // The rest of the body is not read: the connection ends.
                response.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
            }
            response
        }
    }
}

/// Reads, checks and tokenizes the request; `images` counts its images as
/// soon as they are loaded (for the log line, even when a later step fails).
async fn prepare(
    state: &Arc<AppState>,
    body: Body,
    id: String,
    started: Instant,
    images_seen: &mut ImageCount,
) -> Result<Prepared, (ApiError, Outcome)> {
    let client = |e: ApiError| (e, Outcome::ClientError);
    let bytes = read_body(state, body).await.map_err(client)?;
    let request =
        iris_openai::parse_chat_request_with(&bytes, &state.parse_options).map_err(client)?;
    if !state.serves(&request.model) {
        return Err(client(ApiError::model_not_found(&request.model)));
    }
    iris_openai::validate::check_token_ids(&request, state.prompter.vocab_size())
        .map_err(client)?;
    let max_new_tokens = request.sampling().max_new_tokens;
    // Before any image is fetched or any text rendered or tokenized.
    state
        .prompter
        .limits()
        .check_text(&request.messages, max_new_tokens)
        .map_err(client)?;
    state.metrics.stage(Stage::Parse, started.elapsed());
    let (images, cache_hits, timestamps) = start_media(state, &request).await?;
    *images_seen = ImageCount {
        images: images.len(),
        cache_hits,
    };
    let tokenize_start = Instant::now();
    let (input_ids, prompt_text) = if bytes.len() <= INLINE_PROMPT_BYTES {
        build_prompt(state, &request, &timestamps)
    } else {
        let (state, request) = (state.clone(), request.clone());
        tokio::task::spawn_blocking(move || build_prompt(&state, &request, &timestamps))
            .await
            .map_err(|e| {
                (
                    ApiError::internal(format!("prompt task failed: {e}")),
                    Outcome::UpstreamError,
                )
            })?
    }
    .map_err(client)?;
    state
        .metrics
        .stage(Stage::Tokenize, tokenize_start.elapsed());
    let (input_ids, mut mm_inputs) =
        place_images(state, input_ids, images.layouts()).map_err(client)?;
    if let Some(mm_inputs) = mm_inputs.as_mut().filter(|_| !pipelines(state)) {
        let entries = images.all().await.map_err(image_failure)?;
        for (item, entry) in mm_inputs.items.iter_mut().zip(&entries) {
            fill_pixels(item, entry);
        }
    }
    state
        .prompter
        .limits()
        .check_tokens(input_ids.len(), max_new_tokens)
        .map_err(client)?;
    let mut sampling = request.sampling();
    let output = OutputPlan::new(state.parsers, &request, &mut sampling, &prompt_text);
    let mut generate = generate_request(&id, input_ids, &sampling, request.is_stream());
    generate.mm_inputs = mm_inputs;
    let prompt_tokens = generate
        .tokenized
        .as_ref()
        .map(|t| t.input_ids.len() as u32)
        .unwrap_or(0);
    Ok(Prepared {
        id,
        request,
        generate,
        stop: sampling.stop,
        n: sampling.n,
        logprobs: sampling.logprobs.is_some(),
        output,
        prompt_tokens,
        started,
        pending: images,
        images: *images_seen,
    })
}

/// The whole request body, within the payload limit (413) and the
/// body-read deadline (408: a client trickling its body does not hold a
/// connection and its buffer for longer).
pub(crate) async fn read_body(state: &AppState, body: Body) -> Result<bytes::Bytes, ApiError> {
    let limit = state.max_payload;
    let deadline = state.body_read_timeout;
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) => Err(ApiError::payload_too_large(format!(
            "request body could not be read within the {limit} byte limit: {e}"
        ))),
        Err(_) => Err(ApiError::new(
            408,
            iris_openai::ErrorKind::InvalidRequest,
            format!(
                "the request body did not arrive within {} s (--body-read-timeout-secs)",
                deadline.as_secs_f64()
            ),
        )
        .with_code("request_timeout")),
    }
}

/// Fetches the request's images and videos and starts preprocessing each
/// (none: no work); also says how many the pixel cache held when the
/// request came, and each video's timestamps (Qwen3-VL).
async fn start_media(
    state: &Arc<AppState>,
    request: &ChatCompletionRequest,
) -> Result<(PendingImages, usize, Vec<Option<Vec<String>>>), (ApiError, Outcome)> {
    let images: Vec<(String, &ImageUrl)> = request.image_parts().collect();
    let videos: Vec<(String, &VideoUrl)> = request.video_parts().collect();
    let Some((first, _)) = request.media_parts().next() else {
        return Ok((PendingImages::default(), 0, Vec::new()));
    };
    let Some(mm) = state.multimodal.as_ref() else {
        return Err((
            ApiError::bad_field(
                first.as_str(),
                format!("{first}: this model takes no image or video inputs (its directory has no preprocessor_config.json or config.json has no image_token_id)"),
            ),
            Outcome::ClientError,
        ));
    };
    let begun = Instant::now();
    let kwargs = request.mm_processor_kwargs.as_ref();
    let (images, videos) = mm
        .start_media(&images, &videos, kwargs, &state.metrics)
        .await
        .map_err(image_failure)?;
    let cache_hits =
        images.iter().filter(|s| s.cached).count() + videos.iter().filter(|v| v.cached).count();
    let timestamps = videos.iter().map(|v| v.timestamps.clone()).collect();
    // The `images` stage ends when the request's last item is ready.
    let remaining = Arc::new(AtomicUsize::new(images.len() + videos.len()));
    let track = |layout: ItemLayout, load: BoxFuture<'static, Result<Loaded, ApiError>>| {
        let (state, remaining) = (state.clone(), remaining.clone());
        let load = async move {
            let loaded = load.await;
            if remaining.fetch_sub(1, Ordering::Relaxed) == 1 {
                state.metrics.stage(Stage::Images, begun.elapsed());
            }
            loaded
        };
        (layout, load.boxed())
    };
    let mut loads = Vec::with_capacity(images.len() + videos.len());
    for image in images {
        let (mm, state) = (mm.clone(), state.clone());
        let layout = image.layout.clone();
        let load = async move { mm.preprocess_image(image, &state.metrics).await };
        loads.push(track(layout, load.boxed()));
    }
    for video in videos {
        let (mm, state) = (mm.clone(), state.clone());
        let layout = video.layout.clone();
        let load = async move { mm.preprocess_video(video, &state.metrics).await };
        loads.push(track(layout, load.boxed()));
    }
    Ok((PendingImages::start(loads), cache_hits, timestamps))
}

/// An image that could not be fetched, admitted or preprocessed, with the
/// request's outcome: the client's (400), no room (retry later) or ours.
pub(crate) fn image_failure(error: ApiError) -> (ApiError, Outcome) {
    let outcome = match error.status {
        400 => Outcome::ClientError,
        _ if error.retry_after.is_some() => Outcome::Overloaded,
        _ => Outcome::UpstreamError,
    };
    (error, outcome)
}

/// Whether the router takes the request while its images are still being
/// preprocessed: in EPD each image's Encode leaves once that image is
/// ready (the Generate legs carry no pixels). Elsewhere the pixels travel
/// inside the Generate request, so every image is awaited first.
fn pipelines(state: &AppState) -> bool {
    matches!(state.router.mode, Mode::EncodePrefillDecode { .. })
}

/// Expands the image placeholders and builds the request's items (their
/// pixels not yet in). With a vision model this also runs for text-only
/// requests, so image tokens typed into the text cannot pose as images.
fn place_images(
    state: &AppState,
    input_ids: Vec<u32>,
    images: &[ItemLayout],
) -> Result<(Vec<u32>, Option<MultimodalInputs>), ApiError> {
    let Some(mm) = state.multimodal.as_ref() else {
        return Ok((input_ids, None));
    };
    let (ids, ranges) = expand_placeholders(&input_ids, mm.placeholders, images)?;
    if images.is_empty() {
        return Ok((ids, None));
    }
    Ok((
        ids,
        Some(multimodal_inputs(images, ranges, mm.placeholders)),
    ))
}

/// The prompt's token ids and rendered text.
fn build_prompt(
    state: &AppState,
    request: &ChatCompletionRequest,
    videos: &[Option<Vec<String>>],
) -> Result<(Vec<u32>, String), ApiError> {
    let (ids, text) = state.prompter.prompt_for(request, videos)?;
    if ids.is_empty() {
        return Err(ApiError::bad_field(
            "messages",
            "the rendered prompt is empty",
        ));
    }
    Ok((ids, text))
}

/// The Generate request for the workers; they stream only when the client
/// does (one answer message per request otherwise).
pub(crate) fn generate_request(
    id: &str,
    input_ids: Vec<u32>,
    s: &Sampling,
    stream: bool,
) -> GenerateRequest {
    GenerateRequest {
        request_id: id.to_owned(),
        tokenized: Some(TokenizedInput {
            input_ids,
            original_text: String::new(),
        }),
        sampling_params: Some(SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k.map(|k| i32::try_from(k).unwrap_or(i32::MAX)),
            min_p: s.min_p,
            frequency_penalty: s.frequency_penalty,
            presence_penalty: s.presence_penalty,
            repetition_penalty: s.repetition_penalty,
            max_new_tokens: s.max_new_tokens,
            min_new_tokens: s.min_new_tokens,
            stop: s.stop.clone(),
            ignore_eos: s.ignore_eos,
            skip_special_tokens: true,
            n: s.n,
            logit_bias: s
                .logit_bias
                .iter()
                .map(|&(id, bias)| (id.to_string(), bias))
                .collect(),
            stop_token_ids: s.stop_token_ids.clone(),
            sampling_seed: s.seed,
            constraint: s.constraint.as_ref().map(proto_constraint),
            ..SamplingParams::default()
        }),
        return_logprob: s.logprobs.is_some(),
        top_logprobs_num: s
            .logprobs
            .map_or(0, |k| i32::try_from(k).unwrap_or(i32::MAX)),
        stream,
        ..GenerateRequest::default()
    }
}

/// The worker protocol's form of a decoding constraint.
fn proto_constraint(c: &Constraint) -> sampling_params::Constraint {
    use sampling_params::Constraint as P;
    match c {
        Constraint::JsonSchema(s) => P::JsonSchema(s.clone()),
        Constraint::Regex(s) => P::Regex(s.clone()),
        Constraint::Ebnf(s) => P::EbnfGrammar(s.clone()),
        Constraint::StructuralTag(s) => P::StructuralTag(s.clone()),
    }
}
