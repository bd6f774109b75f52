//! Image inputs of chat requests. Each image is fetched ([`iris_media`]:
//! data:, http(s) with SSRF guards and limits, allowed local files),
//! hashed, and preprocessed with the model's processor ([`iris_vision`])
//! once per (image bytes, preprocessor) through the pixel cache
//! ([`iris_cache`]: byte-bounded LRU, `Arc`-shared, single-flight) —
//! hashing on the blocking pool and preprocessing on the fixed CPU pool
//! ([`cpu_pool`]), never on the async runtime. [`items`] then puts the images into the prompt and the request.

pub mod cpu_pool;
pub mod items;
pub mod pixels;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use iris_cache::{CacheStats, Lookup, SingleFlightCache};
use iris_media::{MediaConfig, MediaError, MediaFetcher};
use iris_model::ModelDir;
use iris_openai::{ApiError, ImageUrl};
use iris_vision::{DecodeLimits, OutputDtype, PreprocessOptions, Processor};

use crate::args::{InputDtype, MediaArgs};
use crate::metrics::{Metrics, Stage};
use pixels::{content_hash, image_hash, PixelEntry};

/// Images smaller than this are hashed inline rather than on the blocking pool.
const INLINE_HASH_BYTES: usize = 256 << 10;

/// Pixel cache key: (SHA-256 of the image bytes, preprocessor fingerprint).
type PixelKey = ([u8; 32], u64);

/// The gateway's image pipeline for one model.
pub struct Multimodal {
    fetcher: MediaFetcher,
    processor: Arc<dyn Processor>,
    options: PreprocessOptions,
    fingerprint: u64,
    cache: SingleFlightCache<PixelKey, PixelEntry, ApiError>,
    /// The token the chat template renders once per image (config.json's
    /// `image_token_id`), expanded to each image's token count.
    pub image_token_id: u32,
    per_request_limit: usize,
}

impl Multimodal {
    /// The pipeline for `dir`'s model, or `None` when the model takes no
    /// images (no `preprocessor_config.json` or no `image_token_id`).
    pub fn load(dir: &ModelDir, args: &MediaArgs) -> anyhow::Result<Option<Multimodal>> {
        let (Some(_), Some(image_token_id)) =
            (dir.preprocessor_config.as_ref(), dir.config.image_token_id)
        else {
            return Ok(None);
        };
        let processor: Arc<dyn Processor> = iris_vision::processor_from_model_dir(&dir.root)
            .context("cannot build the image processor from preprocessor_config.json")?
            .into();
        let options = PreprocessOptions {
            dtype: match args.mm_encoder_input_dtype {
                InputDtype::Float32 => OutputDtype::F32,
                InputDtype::Bfloat16 => OutputDtype::Bf16,
            },
            limits: DecodeLimits {
                max_pixels: args.mm_max_image_pixels,
                ..DecodeLimits::default()
            },
            intra_image_parallel: true,
            ..PreprocessOptions::default()
        };
        let fetcher = MediaFetcher::new(media_config(args))
            .map_err(|e| anyhow::anyhow!("image fetching settings: {e}"))?;
        let capacity =
            usize::try_from(args.mm_pixel_cache_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
        Ok(Some(Multimodal {
            fetcher,
            fingerprint: processor.fingerprint(&options),
            processor,
            options,
            cache: SingleFlightCache::with_weigher(capacity, PixelEntry::weight),
            image_token_id,
            per_request_limit: args.mm_per_request_image_limit,
        }))
    }

    /// Fetches and preprocesses every image of a request, concurrently.
    pub async fn load_images(
        &self,
        urls: &[&ImageUrl],
        metrics: &Metrics,
    ) -> Result<Vec<Arc<PixelEntry>>, ApiError> {
        if urls.len() > self.per_request_limit {
            return Err(ApiError::bad_field(
                "messages",
                format!(
                    "the request carries {} images; at most {} are allowed per request",
                    urls.len(),
                    self.per_request_limit
                ),
            ));
        }
        let loads = urls
            .iter()
            .enumerate()
            .map(|(index, url)| self.load_one(index, &url.url, metrics));
        futures::future::try_join_all(loads).await
    }

    async fn load_one(
        &self,
        index: usize,
        url: &str,
        metrics: &Metrics,
    ) -> Result<Arc<PixelEntry>, ApiError> {
        let started = Instant::now();
        let fetched = self
            .fetcher
            .fetch(url)
            .await
            .map_err(|e| media_error(index, &e))?;
        metrics.stage(Stage::Fetch, started.elapsed());
        let bytes = fetched.bytes;
        let hash = hash_off_runtime(bytes.clone()).await?;
        let looked_up = Instant::now();
        let (entry, lookup) = self
            .cache
            .get_or_compute((hash, self.fingerprint), || {
                self.preprocess(index, bytes, hash, metrics)
            })
            .await?;
        if lookup != Lookup::Miss {
            metrics.stage(Stage::PixelCache, looked_up.elapsed());
        }
        Ok(entry)
    }

    /// Decodes and preprocesses on the CPU pool (one thread per core).
    async fn preprocess(
        &self,
        index: usize,
        bytes: Bytes,
        hash: [u8; 32],
        metrics: &Metrics,
    ) -> Result<PixelEntry, ApiError> {
        let started = Instant::now();
        let processor = self.processor.clone();
        let options = self.options;
        let content = content_hash(&hash, self.fingerprint);
        let entry = cpu_pool::run(move || {
            let output = processor
                .preprocess_bytes(&bytes, &options)
                .map_err(|e| vision_error(index, &e))?;
            PixelEntry::from_output(output, content)
                .map_err(|e| ApiError::bad_field("messages", format!("image {index}: {e}")))
        })
        .await
        .map_err(|e| ApiError::internal(format!("image {index}: preprocessing {e}")))??;
        metrics.stage(Stage::Preprocess, started.elapsed());
        Ok(entry)
    }

    /// The pixel cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }
}

fn media_config(args: &MediaArgs) -> MediaConfig {
    MediaConfig {
        allow_private_hosts: args.mm_allow_private_media_hosts,
        allowed_domains: args
            .mm_allowed_media_domains
            .iter()
            .map(|d| d.trim().to_owned())
            .filter(|d| !d.is_empty())
            .collect(),
        allowed_local_media_path: args.allowed_local_media_path.clone(),
        connect_timeout: Duration::from_millis(args.mm_fetch_connect_timeout_ms.max(1)),
        read_timeout: Duration::from_millis(args.mm_fetch_timeout_ms.max(1)),
        max_bytes: args.mm_max_image_bytes as u64,
        max_redirects: args.mm_max_redirects,
        ..MediaConfig::default()
    }
}

async fn hash_off_runtime(bytes: Bytes) -> Result<[u8; 32], ApiError> {
    if bytes.len() <= INLINE_HASH_BYTES {
        return Ok(image_hash(&bytes));
    }
    tokio::task::spawn_blocking(move || image_hash(&bytes))
        .await
        .map_err(|e| ApiError::internal(format!("hashing task failed: {e}")))
}

/// A fetch failure as the client sees it: 400 for a bad or refused
/// reference, 502/504 when the image host failed.
fn media_error(index: usize, error: &MediaError) -> ApiError {
    let message = format!("image {index}: {error}");
    match error.http_status() {
        502 => ApiError::bad_gateway(message),
        504 => ApiError::gateway_timeout(message),
        _ => ApiError::bad_field("messages", message),
    }
}

fn vision_error(index: usize, error: &iris_vision::VisionError) -> ApiError {
    if error.is_bad_input() {
        ApiError::bad_field("messages", format!("image {index}: {error}"))
    } else {
        ApiError::internal(format!("image {index}: {error}"))
    }
}
