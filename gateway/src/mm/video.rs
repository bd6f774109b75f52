//! Video inputs of chat requests (docs/video.md). A video is fetched like
//! an image (its own byte limit and `data:` types, the same SSRF rules),
//! hashed and probed from its container header ([`iris_video::probe`]:
//! frame count, fps, size, checked against the `--mm-max-video-*` limits)
//! off the async runtime; its frames are sampled as the model's video
//! processor does ([`iris_vision::VideoProcessor::sample_indices`], with
//! the request's `mm_processor_kwargs`), which fixes its layout — grid,
//! tokens, Qwen2.5-VL's seconds per temporal patch — before any frame is
//! decoded. Preprocessing (decoding the sampled frames, resizing,
//! patching) runs on the CPU pool through the same pixel cache and
//! in-flight memory budget as images, keyed by the file's hash and the
//! options' fingerprint.

use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use iris_media::{MediaFetcher, MediaKind};
use iris_model::ModelDir;
use iris_openai::{ApiError, MmProcessorKwargs, VideoUrl};
use iris_video::{DecodeOptions, VideoError, VideoInfo, VideoLimits};
use iris_vision::{OutputDtype, Sampling, VideoLayout, VideoOptions, VideoProcessor, VisionError};

use super::budget::Reservation;
use super::pixels::{content_hash, image_hash, ItemLayout, PixelEntry};
use super::{fetch_bytes, on_cpu_pool, relabel, InFlight, Multimodal};
use crate::config::{MediaSettings, VideoSettings};
use crate::metrics::Metrics;

/// The gateway's video pipeline for one model.
pub struct VideoPipeline {
    fetcher: MediaFetcher,
    processor: Arc<VideoProcessor>,
    limits: VideoLimits,
    settings: VideoSettings,
    dtype: OutputDtype,
    /// The token the chat template renders once per video.
    pub token_id: u32,
}

impl VideoPipeline {
    /// The pipeline for `dir`'s model, or `None` when it takes no videos
    /// (no video processor of the Qwen2-VL family, or no `video_token_id`).
    pub fn load(dir: &ModelDir, settings: &MediaSettings) -> anyhow::Result<Option<VideoPipeline>> {
        let Some(token_id) = dir.config.video_token_id else {
            return Ok(None);
        };
        let Some(processor) = iris_vision::video_processor_from_model_dir(&dir.root)
            .context("cannot build the video processor from the model's processor config")?
        else {
            return Ok(None);
        };
        let video = settings.video.clone();
        let fetch = iris_media::MediaConfig {
            max_bytes: video.max_bytes,
            kind: MediaKind::Video,
            ..settings.fetch.clone()
        };
        let fetcher = MediaFetcher::new(fetch)
            .map_err(|e| anyhow::anyhow!("video fetching settings: {e}"))?;
        Ok(Some(VideoPipeline {
            fetcher,
            processor: Arc::new(processor),
            limits: VideoLimits {
                max_duration_secs: video.max_duration_secs,
                max_frames: video.max_frames as usize,
                max_pixels: video.max_pixels,
                ..VideoLimits::default()
            },
            settings: video,
            dtype: settings.dtype,
            token_id,
        }))
    }

    /// Most videos one request may carry.
    pub fn per_request_limit(&self) -> usize {
        self.settings.per_request_limit
    }

    /// The request's video options: its `mm_processor_kwargs` over the
    /// model's config, the gateway's default rate when neither samples,
    /// and the frame cap (`--mm-max-video-frames`) over `max_frames`.
    pub fn options(&self, kwargs: Option<&MmProcessorKwargs>) -> Result<VideoOptions, ApiError> {
        let kw = kwargs.copied().unwrap_or_default();
        let cap = self.settings.max_frames;
        if let Some(n) = kw.num_frames.filter(|&n| n > cap) {
            return Err(kwarg_error(
                "num_frames",
                format!("{n} frames asked, more than the {cap} allowed per video (--mm-max-video-frames)"),
            ));
        }
        let config_max = self.processor.config().max_frames;
        let mut options = VideoOptions {
            fps: kw.fps,
            num_frames: kw.num_frames,
            min_frames: kw.min_frames,
            max_frames: Some(kw.max_frames.unwrap_or(config_max).min(cap)),
            min_pixels: kw.min_pixels,
            max_pixels: kw.max_pixels,
            total_pixels: kw.total_pixels,
            dtype: self.dtype,
        };
        let sampling = self
            .processor
            .sampling(&options)
            .map_err(|e| kwarg_error("", e.to_string()))?;
        if sampling == Sampling::EveryFrame {
            options.fps = Some(self.settings.default_fps);
        }
        Ok(options)
    }

    /// Fetches one video, hashes and probes it, and plans its layout.
    async fn fetch_and_plan(
        &self,
        place: &str,
        url: &str,
        options: VideoOptions,
        metrics: &Metrics,
    ) -> Result<PlannedVideo, ApiError> {
        let bytes = fetch_bytes(&self.fetcher, place, url, metrics).await?;
        let (processor, limits) = (self.processor.clone(), self.limits);
        let place = place.to_owned();
        tokio::task::spawn_blocking(move || plan(&processor, &limits, place, bytes, options))
            .await
            .map_err(|e| ApiError::internal(format!("video probing task failed: {e}")))?
    }
}

/// A video fetched, probed and sampled: what preprocessing it needs.
pub(super) struct PlannedVideo {
    place: String,
    bytes: Bytes,
    hash: [u8; 32],
    info: VideoInfo,
    indices: Vec<u64>,
    options: VideoOptions,
    layout: VideoLayout,
}

/// Hashes, probes and samples `bytes` (on the blocking pool).
fn plan(
    processor: &VideoProcessor,
    limits: &VideoLimits,
    place: String,
    bytes: Bytes,
    options: VideoOptions,
) -> Result<PlannedVideo, ApiError> {
    let hash = image_hash(&bytes);
    let info = iris_video::probe(&bytes, limits).map_err(|e| video_error(&place, &e))?;
    let indices = processor
        .sample_indices(info.total_frames, info.fps, &options)
        .map_err(|e| vision_error(&place, &e))?;
    limits
        .check_requested(indices.len())
        .map_err(|e| video_error(&place, &e))?;
    let layout = processor
        .layout(&indices, info.width, info.height, info.fps, &options)
        .map_err(|e| vision_error(&place, &e))?;
    Ok(PlannedVideo {
        place,
        bytes,
        hash,
        info,
        indices,
        options,
        layout,
    })
}

/// A video fetched, its memory reserved and its layout planned
/// ([`Multimodal::start_media`]), to be preprocessed
/// ([`Multimodal::preprocess_video`]).
pub struct StartedVideo {
    video: Box<PlannedVideo>,
    share: Option<Reservation>,
    fingerprint: u64,
    /// The item's layout.
    pub layout: ItemLayout,
    /// The pixel cache held the video's tensor when the request arrived.
    pub cached: bool,
    /// Qwen3-VL: the prompt text before each temporal group
    /// ([`timestamp_videos`]).
    pub timestamps: Option<Vec<String>>,
}

impl Multimodal {
    /// Fetches, probes and plans every video of a request (concurrently);
    /// with each, the memory it needs (0 when the pixel cache holds it).
    pub(super) async fn plan_videos(
        &self,
        urls: &[(String, &VideoUrl)],
        kwargs: Option<&MmProcessorKwargs>,
        metrics: &Metrics,
    ) -> Result<(Vec<PlannedVideo>, Vec<u64>, u64), ApiError> {
        let Some(pipeline) = self.video.as_ref() else {
            return match urls.first() {
                Some((place, _)) => Err(ApiError::bad_field(
                    place.as_str(),
                    format!("{place}: this model takes no video inputs (no video processor of the Qwen2-VL family, or no video_token_id in config.json)"),
                )),
                None => Ok((Vec::new(), Vec::new(), 0)),
            };
        };
        if urls.len() > pipeline.per_request_limit() {
            return Err(ApiError::bad_field(
                "messages",
                format!(
                    "the request carries {} videos; at most {} are allowed per request (--mm-per-request-video-limit)",
                    urls.len(),
                    pipeline.per_request_limit()
                ),
            ));
        }
        if urls.is_empty() {
            return Ok((Vec::new(), Vec::new(), 0));
        }
        let options = pipeline.options(kwargs)?;
        let fingerprint = pipeline.processor.fingerprint(&options);
        let plans = urls
            .iter()
            .map(|(place, url)| pipeline.fetch_and_plan(place, &url.url, options, metrics));
        let videos = futures::future::try_join_all(plans).await?;
        let mut seen = std::collections::HashSet::new();
        let needs = videos
            .iter()
            .map(|v| match seen.insert(v.hash) {
                true => self.video_need(pipeline, v, fingerprint),
                false => Ok(0),
            })
            .collect::<Result<Vec<u64>, ApiError>>()?;
        Ok((videos, needs, fingerprint))
    }

    /// Memory one video needs (0 when cached): its sampled frames, the
    /// decoder's working pictures and the preprocessing buffers.
    fn video_need(
        &self,
        pipeline: &VideoPipeline,
        video: &PlannedVideo,
        fingerprint: u64,
    ) -> Result<u64, ApiError> {
        if self.cache.peek(&(video.hash, fingerprint)).is_some() {
            return Ok(0);
        }
        let (info, n) = (&video.info, video.indices.len());
        let preprocess = pipeline
            .processor
            .memory_needed(n, info.width, info.height, &video.options)
            .map_err(|e| vision_error(&video.place, &e))?;
        // The decoder also copies the compressed stream (at most the file).
        let need = iris_video::decode_memory_bytes(info, n, 1)
            .saturating_add(preprocess)
            .saturating_add(video.bytes.len() as u64);
        self.check_need(&video.place, &video_name(&video.place, info, n), need)
    }

    pub(super) fn started_video(
        &self,
        video: PlannedVideo,
        share: Option<Reservation>,
        fingerprint: u64,
    ) -> Result<StartedVideo, ApiError> {
        let content = content_hash(&video.hash, fingerprint);
        let cached = self.cache.peek(&(video.hash, fingerprint)).is_some();
        let dtype = video.options.dtype;
        let layout = ItemLayout::video(&video.layout, dtype, content).map_err(|e| {
            ApiError::bad_field(video.place.as_str(), format!("{}: {e}", video.place))
        })?;
        let timestamps = video.layout.timestamps.as_ref().map(|t| {
            (0..t.len())
                .filter_map(|g| video.layout.timestamp_text(g))
                .collect()
        });
        Ok(StartedVideo {
            video: Box::new(video),
            share,
            fingerprint,
            layout,
            cached,
            timestamps,
        })
    }

    /// Decodes the video's sampled frames and preprocesses them through
    /// the pixel cache, within its share of the reservation.
    pub async fn preprocess_video(
        &self,
        started: StartedVideo,
        metrics: &Metrics,
    ) -> Result<super::pending::Loaded, ApiError> {
        let Some(pipeline) = self.video.as_ref() else {
            return Err(ApiError::internal("the model's video pipeline is gone"));
        };
        let StartedVideo {
            video,
            share,
            fingerprint,
            ..
        } = started;
        let key = (video.hash, fingerprint);
        let place = video.place.clone();
        let mut held = None;
        let slot = &mut held;
        let (entry, _) = self
            .cache
            .get_or_compute(key, || async move {
                let share = match share {
                    Some(share) => share,
                    None => {
                        let need = self.video_need(pipeline, &video, fingerprint)?;
                        let name = video_name(&video.place, &video.info, video.indices.len());
                        self.reserve_for(&video.place, &name, need).await?
                    }
                };
                let entry =
                    decode_and_preprocess(self, pipeline, *video, fingerprint, metrics).await?;
                *slot = Some(share.shrink_to(entry.weight() as u64));
                Ok(entry)
            })
            .await
            .map_err(|e| relabel(e, &place))?;
        Ok((entry, held))
    }
}

/// Decodes the sampled frames and preprocesses them on the CPU pool (the
/// video counts as one item in flight there, like an image).
async fn decode_and_preprocess(
    mm: &Multimodal,
    pipeline: &VideoPipeline,
    video: PlannedVideo,
    fingerprint: u64,
    metrics: &Metrics,
) -> Result<PixelEntry, ApiError> {
    let processor = pipeline.processor.clone();
    let decode = DecodeOptions {
        limits: pipeline.limits,
        ..DecodeOptions::default()
    };
    let place = video.place.clone();
    let work = move |place: &str| {
        let v = video;
        let frames = iris_video::decode_frames(&v.bytes, &v.indices, &decode)
            .map_err(|e| video_error(place, &e))?;
        let output = processor
            .preprocess(
                &frames.data,
                &v.indices,
                frames.width,
                frames.height,
                v.info.fps,
                &v.options,
            )
            .map_err(|e| vision_error(place, &e))?;
        Ok(PixelEntry::from_video(
            output,
            content_hash(&v.hash, fingerprint),
        ))
    };
    on_cpu_pool(place, InFlight::enter(&mm.in_flight), metrics, work).await
}

/// The span a Qwen chat template renders once per video.
const VIDEO_SPAN: &str = "<|vision_start|><|video_pad|><|vision_end|>";

/// Qwen3-VL's prompt for videos, as its processor rewrites the rendered
/// text before tokenizing: each video's `<|vision_start|><|video_pad|><|vision_end|>`
/// (in order) becomes, per temporal group, its timestamp text followed by
/// a span of its own. Videos without timestamps (`None`: the other
/// families) keep their span. The text is tokenized afterwards, so the
/// timestamps tokenize in context as they do in Hugging Face's processor.
pub fn timestamp_videos(text: String, videos: &[Option<Vec<String>>]) -> Result<String, ApiError> {
    if videos.iter().all(Option::is_none) {
        return Ok(text);
    }
    let stamped: Vec<Option<String>> = videos
        .iter()
        .map(|stamps| {
            let stamps = stamps.as_ref()?;
            Some(stamps.iter().map(|s| format!("{s}{VIDEO_SPAN}")).collect())
        })
        .collect();
    let replacements: Vec<Option<&str>> = stamped.iter().map(Option::as_deref).collect();
    match super::items::rewrite_marks(&text, VIDEO_SPAN, &replacements) {
        Some((out, _)) => Ok(out),
        None => Err(ApiError::bad_field(
            "messages",
            format!(
                "the rendered prompt has fewer video spans ({VIDEO_SPAN}) than the request has videos"
            ),
        )),
    }
}

/// How messages name a video: its place, size, frame count and rate.
fn video_name(place: &str, info: &VideoInfo, sampled: usize) -> String {
    format!(
        "{place} ({}x{} {}, {sampled} sampled frames)",
        info.width, info.height, info.container
    )
}

/// A decoding or limit failure: the client's (400) unless the decoding
/// library itself failed.
fn video_error(place: &str, error: &VideoError) -> ApiError {
    let message = format!("{place}: {error}");
    match error {
        VideoError::Library(_) => ApiError::internal(message),
        _ => ApiError::bad_request(message),
    }
    .with_param(place)
}

fn vision_error(place: &str, error: &VisionError) -> ApiError {
    super::vision_error(place, error)
}

/// A 400 naming `mm_processor_kwargs.<key>` (the whole object for "").
fn kwarg_error(key: &str, reason: String) -> ApiError {
    let param = if key.is_empty() {
        "mm_processor_kwargs".to_owned()
    } else {
        format!("mm_processor_kwargs.{key}")
    };
    ApiError::bad_field(param.clone(), format!("{param}: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_timestamps_replace_each_video_span_in_order() {
        let text = format!("a{VIDEO_SPAN}b{VIDEO_SPAN}c");
        let videos = [
            None,
            Some(vec!["<0.5 seconds>".to_owned(), "<1.5 seconds>".to_owned()]),
        ];
        let out = timestamp_videos(text.clone(), &videos).unwrap();
        assert_eq!(
            out,
            format!("a{VIDEO_SPAN}b<0.5 seconds>{VIDEO_SPAN}<1.5 seconds>{VIDEO_SPAN}c")
        );
        assert_eq!(timestamp_videos(text.clone(), &[None, None]).unwrap(), text);
        let err = timestamp_videos("no span".to_owned(), &[Some(vec![])]).unwrap_err();
        assert_eq!(err.status, 400);
    }
}
