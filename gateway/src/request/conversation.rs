//! A conversation made ready for the workers: the chat API's request
//! (and any API that converts to it) checked against the model, its
//! images and videos fetched and preprocessing (each in its own task),
//! the chat template rendered and tokenized, placeholders expanded, the
//! output plan chosen and the worker request built ([`ReadyConversation`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::FutureExt;
use iris_openai::{ApiError, ChatCompletionRequest, ImageUrl, VideoUrl};
use iris_proto::scheduler::{GenerateRequest, MultimodalInputs};

use super::Input;
use crate::http::errors::{image_failure, route_error};
use crate::http::generate::generate_request;
use crate::http::record::ImageCount;
use crate::http::{Failure, Ledger, INLINE_PROMPT_BYTES};
use crate::metrics::{Metrics, Outcome, Stage};
use crate::mm::items::{expand_placeholders, fill_pixels, multimodal_inputs};
use crate::mm::pending::{Loaded, PendingImages};
use crate::mm::pixels::ItemLayout;
use crate::output::OutputPlan;
use crate::router::Generation;
use crate::served::Served;

/// A conversation ready to send: its model, prompt and options.
pub struct ReadyConversation {
    pub served: Arc<Served>,
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
    /// The request's images: their pixels as they become ready (EPD sends
    /// each image's Encode as soon as it is), and the memory of the tensors
    /// preprocessed for this request, given back once the request has been
    /// handed to the workers (dropped).
    pub pending: PendingImages,
}

impl ReadyConversation {
    /// Starts the request on workers. The preprocessed tensors' memory is
    /// given back once the workers have them (or the request failed).
    pub async fn start(&mut self) -> Result<Generation, Failure> {
        let mut generate = std::mem::take(&mut self.generate);
        generate.lora_id = self.served.lora_id();
        let images = std::mem::take(&mut self.pending);
        let started = self.served.router.start_with(generate, &images).await;
        drop(images);
        started.map_err(route_error)
    }
}

impl Input for ChatCompletionRequest {
    type Ready = ReadyConversation;

    /// Checks and tokenizes the conversation; `ledger` gets its images as
    /// soon as they are loaded (for the log line, even when a later step
    /// fails), then its prompt tokens.
    async fn prepare(
        self,
        served: Arc<Served>,
        ledger: &mut Ledger,
    ) -> Result<ReadyConversation, Failure> {
        let request = self;
        let client = |e: ApiError| (e, Outcome::ClientError);
        iris_openai::validate::check_token_ids(&request, served.prompter.vocab_size())
            .map_err(client)?;
        let max_new_tokens = request.sampling().max_new_tokens;
        // Before any image is fetched or any text rendered or tokenized.
        served
            .prompter
            .limits()
            .check_text(&request.messages, max_new_tokens)
            .map_err(client)?;
        let (images, counted, timestamps) = load_media(&served, &ledger.metrics, &request).await?;
        ledger.images = counted;
        let tokenize_start = Instant::now();
        let (input_ids, prompt_text) = if ledger.body_bytes <= INLINE_PROMPT_BYTES {
            build_prompt(&served, &request, images.layouts(), &timestamps)
        } else {
            let (served, request) = (served.clone(), request.clone());
            let layouts = images.layouts().to_vec();
            super::off_runtime("prompt", move || {
                build_prompt(&served, &request, &layouts, &timestamps)
            })
            .await?
        }
        .map_err(client)?;
        ledger
            .metrics
            .stage(Stage::Tokenize, tokenize_start.elapsed());
        let (input_ids, mut mm_inputs) =
            place_images(&served, input_ids, images.layouts()).map_err(client)?;
        // In EPD the router takes the request while its images are still
        // being preprocessed: each image's Encode leaves once that image is
        // ready (the Generate legs carry no pixels). Elsewhere the pixels
        // travel inside the Generate request, so every image is awaited first.
        if let Some(mm_inputs) = mm_inputs.as_mut().filter(|_| !served.router.mode.encodes()) {
            let entries = images.all().await.map_err(image_failure)?;
            for (item, entry) in mm_inputs.items.iter_mut().zip(&entries) {
                fill_pixels(item, entry);
            }
        }
        served
            .prompter
            .limits()
            .check_tokens(input_ids.len(), max_new_tokens)
            .map_err(client)?;
        let mut sampling = request.sampling();
        let output = OutputPlan::new(&served.parsers, &request, &mut sampling, &prompt_text);
        let mut generate = generate_request(&ledger.id, input_ids, &sampling, request.is_stream());
        generate.mm_inputs = mm_inputs;
        ledger.prompt_tokens = generate
            .tokenized
            .as_ref()
            .map(|t| t.input_ids.len() as u32)
            .unwrap_or(0);
        Ok(ReadyConversation {
            served,
            request,
            generate,
            stop: sampling.stop,
            n: sampling.n,
            logprobs: sampling.logprobs.is_some(),
            output,
            pending: images,
        })
    }
}

/// Fetches the request's images and videos and starts preprocessing each
/// (none: no work); also says how many the pixel cache held when the
/// request came, and each video's timestamps (Qwen3-VL).
async fn load_media(
    served: &Served,
    metrics: &Arc<Metrics>,
    request: &ChatCompletionRequest,
) -> Result<(PendingImages, ImageCount, Vec<Option<Vec<String>>>), Failure> {
    let images: Vec<(String, &ImageUrl)> = request.image_parts().collect();
    let videos: Vec<(String, &VideoUrl)> = request.video_parts().collect();
    let Some((first, _)) = request.media_parts().next() else {
        return Ok((PendingImages::default(), ImageCount::default(), Vec::new()));
    };
    let Some(mm) = served.media.as_ref() else {
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
        .start_media(&images, &videos, kwargs, metrics)
        .await
        .map_err(image_failure)?;
    let counted = ImageCount {
        images: images.len() + videos.len(),
        cache_hits: images.iter().filter(|s| s.cached).count()
            + videos.iter().filter(|v| v.cached).count(),
        bytes: images.iter().map(|i| i.bytes()).sum(),
    };
    let timestamps = videos.iter().map(|v| v.timestamps.clone()).collect();
    // The `images` stage ends when the request's last item is ready.
    let remaining = Arc::new(AtomicUsize::new(images.len() + videos.len()));
    let track = |layout: ItemLayout, load: BoxFuture<'static, Result<Loaded, ApiError>>| {
        let (metrics, remaining) = (metrics.clone(), remaining.clone());
        let load = async move {
            let loaded = load.await;
            if remaining.fetch_sub(1, Ordering::Relaxed) == 1 {
                metrics.stage(Stage::Images, begun.elapsed());
            }
            loaded
        };
        (layout, load.boxed())
    };
    let mut loads = Vec::with_capacity(images.len() + videos.len());
    for image in images {
        let (mm, metrics) = (mm.clone(), metrics.clone());
        let layout = image.layout.clone();
        let load = async move { mm.preprocess_image(image, &metrics).await };
        loads.push(track(layout, load.boxed()));
    }
    for video in videos {
        let (mm, metrics) = (mm.clone(), metrics.clone());
        let layout = video.layout.clone();
        let load = async move { mm.preprocess_video(video, &metrics).await };
        loads.push(track(layout, load.boxed()));
    }
    Ok((PendingImages::start(loads), counted, timestamps))
}

/// Expands the image placeholders and builds the request's items (their
/// pixels not yet in). With a vision model this also runs for text-only
/// requests, so image tokens typed into the text cannot pose as images.
fn place_images(
    served: &Served,
    input_ids: Vec<u32>,
    images: &[ItemLayout],
) -> Result<(Vec<u32>, Option<MultimodalInputs>), ApiError> {
    let Some(mm) = served.media.as_ref() else {
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

/// The prompt's token ids and rendered text, the media marks rewritten
/// for `items` (images, then videos) and `videos`' timestamps.
fn build_prompt(
    served: &Served,
    request: &ChatCompletionRequest,
    items: &[ItemLayout],
    videos: &[Option<Vec<String>>],
) -> Result<(Vec<u32>, String), ApiError> {
    let (ids, text) = served.prompter.prompt_for(request, items, videos)?;
    if ids.is_empty() {
        return Err(ApiError::bad_field(
            "messages",
            "the rendered prompt is empty",
        ));
    }
    Ok((ids, text))
}
