//! Image inputs of chat requests. Each image is fetched ([`iris_media`]:
//! data:, http(s) with SSRF guards and limits, allowed local files),
//! hashed, and preprocessed with the model's processor ([`iris_vision`])
//! once per (image bytes, preprocessor) through the pixel cache
//! ([`iris_cache`]: byte-bounded LRU, `Arc`-shared, single-flight) —
//! hashing on the blocking pool and preprocessing on the fixed CPU pool
//! ([`cpu_pool`]), never on the async runtime. Before a miss is decoded,
//! the memory it will take is reserved from the in-flight [`budget`].
//! Each image's layout is planned from its header, so [`items`] puts the
//! images into the prompt and the request while [`pending`] images are
//! still being preprocessed.

pub mod budget;
pub mod cpu_pool;
pub mod items;
pub mod pending;
pub mod pixels;
pub mod video;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use bytes::Bytes;
use iris_cache::{CacheStats, Lookup, SingleFlightCache};
use iris_media::{MediaError, MediaFetcher};
use iris_model::ModelDir;
use iris_openai::{ApiError, ImageUrl, MmProcessorKwargs, VideoUrl};
use iris_vision::{DecodeLimits, ImageInfo, PreprocessOptions, Processor, VisionError};

use crate::config::MediaSettings;
use crate::metrics::{Metrics, Stage};
use budget::{BudgetError, MemoryBudget, Reservation};
use items::Placeholders;
use pending::Loaded;
use pixels::{content_hash, image_hash, ItemLayout, PixelEntry};
use video::{StartedVideo, VideoPipeline};

/// Images smaller than this are hashed (and their header read) inline
/// rather than on the blocking pool.
const INLINE_HASH_BYTES: usize = 256 << 10;

/// Pixel cache key: (SHA-256 of the image bytes, preprocessor fingerprint).
type PixelKey = ([u8; 32], u64);

/// Seconds a client refused for lack of image memory is told to wait.
const RETRY_AFTER_SECS: u32 = 1;

const MIB: u64 = 1 << 20;

/// The gateway's image pipeline for one model.
pub struct Multimodal {
    fetcher: MediaFetcher,
    processor: Arc<dyn Processor>,
    options: PreprocessOptions,
    fingerprint: u64,
    cache: SingleFlightCache<PixelKey, PixelEntry, ApiError>,
    /// The tokens the chat template renders once per image and per video
    /// (config.json's `image_token_id`, `video_token_id`), expanded to each
    /// item's token count.
    pub placeholders: Placeholders,
    per_request_limit: usize,
    budget: MemoryBudget,
    /// Images being decoded and preprocessed (or waiting for the pool).
    in_flight: Arc<AtomicUsize>,
    /// Video inputs, when the model takes them.
    video: Option<VideoPipeline>,
}

/// The image processor family with pan and scan (`do_pan_and_scan`).
const PAN_AND_SCAN_FAMILY: &str = "gemma3";

/// The image processor family that treats the images of a prompt with
/// several differently ([`PreprocessOptions::multi_image`]).
const MULTI_IMAGE_FAMILY: &str = "llava_onevision";

/// How a request's images are preprocessed: the options and their pixel
/// cache fingerprint ([`Multimodal::image_variant`]).
#[derive(Clone, Copy)]
struct ImageVariant {
    options: PreprocessOptions,
    fingerprint: u64,
}

/// The families whose prompts the gateway builds as their Hugging Face
/// processors do: each image's mark in the rendered template replaced by
/// its [`iris_vision::PlaceholderLayout`] — the image token repeated
/// (Qwen-VL, LLaVA-1.5, LLaVA-NeXT, LLaVA-OneVision), Gemma 3's
/// `<start_of_image>` blocks (pan-and-scan crops included), Idefics3 /
/// SmolVLM's tagged tiles and global image, Pixtral's rows of `[IMG]`
/// broken by `[IMG_BREAK]` and ended by `[IMG_END]`, InternVL's
/// `<IMG_CONTEXT>` run between `<img>` and `</img>`, Llama 4's
/// `<|patch|>` tiles with their separators and global tile,
/// Phi-4-multimodal's `<|image|>` repeated `num_img_tokens` times
/// (gateway/tests/mm_prompts.rs compares them with the processors').
const PROMPTS_BUILT: [&str; 11] = [
    "qwen2_vl",
    "qwen3_vl",
    "clip",
    "llava_next",
    "llava_onevision",
    "gemma3",
    "idefics3",
    "pixtral",
    "internvl",
    "llama4",
    "phi4_multimodal",
];

/// Refuses a family whose images the vision crate preprocesses but whose
/// prompt the gateway has not been checked to build as the family's
/// processor does: serving it could send the model wrong placeholder
/// tokens.
fn check_prompts_built(family: &str) -> anyhow::Result<()> {
    if PROMPTS_BUILT.contains(&family) {
        return Ok(());
    }
    anyhow::bail!(
        "the model's image processor ({family}) is supported for preprocessing, but Iris does not build its prompts yet (its image placeholders are not known to match its Hugging Face processor's); models served: {}",
        PROMPTS_BUILT.join(", ")
    )
}

/// The image processor families whose tensors `iris-encoder`'s vision
/// tower (Qwen-VL-shaped: flattened patches with `image_grid_thw`) encodes.
const ENCODER_FAMILIES: &[&str] = &["qwen2_vl", "qwen3_vl"];

/// Refuses EPD (`--epd-disaggregation`) for a model whose images the
/// encode workers' tower cannot encode: the other families' pixels
/// (tiles, crops, unflattened images) would reach it as wrong tensors.
pub fn check_epd_family(multimodal: Option<&Multimodal>) -> anyhow::Result<()> {
    let Some(family) = multimodal.map(|m| m.processor.name()) else {
        return Ok(());
    };
    if ENCODER_FAMILIES.contains(&family) {
        return Ok(());
    }
    anyhow::bail!(
        "--epd-disaggregation is not available for this model: its image processor ({family}) makes tensors iris-encoder's Qwen-VL-shaped vision tower cannot encode (EPD families: {}); serve it aggregated or with --pd-disaggregation, where the prefill workers encode images",
        ENCODER_FAMILIES.join(", ")
    )
}

/// Why a model directory that holds an image processor's config takes no
/// images (`config.json` names no `image_token_id`), said at start;
/// `None` when it has no such config.
fn images_refused(dir: &ModelDir) -> Option<String> {
    if dir.preprocessor_config.is_none() || dir.config.image_token_id.is_some() {
        return None;
    }
    let mut why = String::from(
        "preprocessor_config.json is present but config.json names no image_token_id: \
         image and video inputs will be refused",
    );
    if dir.config.model_type == "internvl_chat" {
        why.push_str(
            " (model_type internvl_chat is InternVL's remote-code format, whose image tiling \
             and prompt are Python code in the repository, not its preprocessor_config.json's \
             CLIP settings; serve the transformers-format conversion, the -hf checkpoint)",
        );
    }
    Some(why)
}

impl Multimodal {
    /// The pipeline for `dir`'s model, or `None` when the model takes no
    /// images (no `preprocessor_config.json` or no `image_token_id`).
    pub fn load(dir: &ModelDir, settings: &MediaSettings) -> anyhow::Result<Option<Multimodal>> {
        let (Some(_), Some(image_token_id)) =
            (dir.preprocessor_config.as_ref(), dir.config.image_token_id)
        else {
            if let Some(why) = images_refused(dir) {
                tracing::warn!(model_type = %dir.config.model_type, "{why}");
            }
            return Ok(None);
        };
        let processor: Arc<dyn Processor> = iris_vision::processor_from_model_dir(&dir.root)
            .context("cannot build the image processor from preprocessor_config.json")?
            .into();
        check_prompts_built(processor.name())?;
        let options = PreprocessOptions {
            dtype: settings.dtype,
            limits: DecodeLimits {
                max_pixels: settings.max_image_pixels,
                ..DecodeLimits::default()
            },
            // Decided per image ([`split_alone`]).
            intra_image_parallel: false,
            ..PreprocessOptions::default()
        };
        let fetcher = MediaFetcher::new(settings.fetch.clone())
            .map_err(|e| anyhow::anyhow!("image fetching settings: {e}"))?;
        let video = VideoPipeline::load(dir, settings)?;
        if settings.prepare_pixel_memory {
            // In the background: the first images then find their
            // tensors' memory already faulted in, and the CPU pool's
            // threads their scratch.
            iris_vision::prepare_tensor_memory(settings.pixel_cache_bytes);
            warm_up_in_background(processor.clone(), options);
        }
        Ok(Some(Multimodal {
            fetcher,
            fingerprint: processor.fingerprint(&options),
            processor,
            options,
            cache: SingleFlightCache::with_weigher(settings.pixel_cache_bytes, PixelEntry::weight),
            placeholders: Placeholders {
                image: image_token_id,
                video: video.as_ref().map(|v| v.token_id),
            },
            per_request_limit: settings.per_request_image_limit,
            budget: MemoryBudget::new(settings.inflight_bytes, settings.inflight_wait),
            in_flight: Arc::new(AtomicUsize::new(0)),
            video,
        }))
    }

    /// Fetches every image and video of a request (concurrently), reads
    /// each one's header and plans its layout; each then preprocesses on
    /// its own ([`Multimodal::preprocess_image`],
    /// [`Multimodal::preprocess_video`], [`pending::PendingImages`]).
    ///
    /// Before anything is decoded, the memory of all the request's misses
    /// is reserved at once (a request never holds part of the budget while
    /// waiting for the rest, so requests cannot block each other). Each
    /// item's share shrinks to its tensor when preprocessed; the tensors
    /// stay reserved until the request's items are dropped (once the
    /// request has been handed to the workers).
    ///
    /// Each image and video comes with its place in the request
    /// (`messages[2].content[1]`, [`iris_openai::ChatCompletionRequest::media_parts`]),
    /// which an error about it names in `param` and its message.
    pub async fn start_media(
        &self,
        images: &[(String, &ImageUrl)],
        videos: &[(String, &VideoUrl)],
        kwargs: Option<&MmProcessorKwargs>,
        metrics: &Metrics,
    ) -> Result<(Vec<StartedImage>, Vec<StartedVideo>), ApiError> {
        let variant = self.image_variant(kwargs, images.len())?;
        if images.len() > self.per_request_limit {
            return Err(ApiError::bad_field(
                "messages",
                format!(
                    "the request carries {} images; at most {} are allowed per request",
                    images.len(),
                    self.per_request_limit
                ),
            ));
        }
        let fetches = images
            .iter()
            .map(|(place, url)| self.fetch_one(place, &url.url, metrics));
        let (images, (videos, video_needs, fingerprint)) = futures::future::try_join(
            futures::future::try_join_all(fetches),
            self.plan_videos(videos, kwargs, metrics),
        )
        .await?;
        let mut needs = self.image_needs(&images, &variant)?;
        let image_count = needs.len();
        needs.extend(video_needs);
        let mut shares = self.reserve_needs(needs, "image or video").await?;
        let video_shares = shares.split_off(image_count);
        let images = images
            .into_iter()
            .zip(shares)
            .map(|(image, share)| {
                let (layout, cached) = self.layout(&image, &variant)?;
                Ok(StartedImage {
                    image: Box::new(image),
                    share,
                    variant,
                    layout,
                    cached,
                })
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let videos = videos
            .into_iter()
            .zip(video_shares)
            .map(|(video, share)| self.started_video(video, share, fingerprint))
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok((images, videos))
    }

    /// An image's layout: its cached entry's (and `true`), else planned
    /// from its header.
    fn layout(
        &self,
        image: &FetchedImage,
        variant: &ImageVariant,
    ) -> Result<(ItemLayout, bool), ApiError> {
        if let Some(entry) = self.cache.peek(&(image.hash, variant.fingerprint)) {
            return Ok((entry.layout.clone(), true));
        }
        let place = image.place.as_str();
        let info = image.info.as_ref().map_err(|e| vision_error(place, e))?;
        let planned = self
            .processor
            .planned_layout(info, &variant.options)
            .map_err(|e| vision_error(place, &e))?;
        let content = content_hash(&image.hash, variant.fingerprint);
        let placement = pixels::placement(self.processor.as_ref(), &planned);
        let layout = ItemLayout::new(planned, placement, variant.options.dtype, content)
            .map_err(|e| ApiError::bad_field(place, format!("{place}: {e}")))?;
        Ok((layout, false))
    }

    /// How this request's `images` images are preprocessed: the model's
    /// options, with `mm_processor_kwargs.do_pan_and_scan` over the
    /// config's for Gemma 3, and LLaVA-OneVision's multi-image mode when
    /// the prompt holds more than one image (each a different fingerprint,
    /// so their tensors are cached apart).
    fn image_variant(
        &self,
        kwargs: Option<&MmProcessorKwargs>,
        images: usize,
    ) -> Result<ImageVariant, ApiError> {
        let pan_and_scan = self.pan_and_scan(kwargs)?;
        let multi_image = images > 1 && self.processor.name() == MULTI_IMAGE_FAMILY;
        if pan_and_scan.is_none() && !multi_image {
            return Ok(ImageVariant {
                options: self.options,
                fingerprint: self.fingerprint,
            });
        }
        let options = PreprocessOptions {
            pan_and_scan,
            multi_image,
            ..self.options
        };
        Ok(ImageVariant {
            options,
            fingerprint: self.processor.fingerprint(&options),
        })
    }

    /// The request's `do_pan_and_scan` for Gemma 3 (`None`: the config's).
    /// `true` for a processor without pan and scan is a 400; `false` asks
    /// for what it does anyway.
    fn pan_and_scan(&self, kwargs: Option<&MmProcessorKwargs>) -> Result<Option<bool>, ApiError> {
        let Some(pans) = kwargs.and_then(|k| k.do_pan_and_scan) else {
            return Ok(None);
        };
        let family = self.processor.name();
        if family == PAN_AND_SCAN_FAMILY {
            return Ok(Some(pans));
        }
        if !pans {
            return Ok(None);
        }
        let param = "mm_processor_kwargs.do_pan_and_scan";
        Err(ApiError::bad_field(
            param,
            format!(
                "{param}: the model's image processor ({family}) has no pan and scan (Gemma 3's)"
            ),
        ))
    }

    /// Preprocesses a started image through the pixel cache.
    pub async fn preprocess_image(
        &self,
        started: StartedImage,
        metrics: &Metrics,
    ) -> Result<Loaded, ApiError> {
        let (entry, share, _) = self
            .load_one(*started.image, started.share, &started.variant, metrics)
            .await?;
        Ok((entry, share))
    }

    /// Fetches one image, hashes it and reads its header.
    async fn fetch_one(
        &self,
        place: &str,
        url: &str,
        metrics: &Metrics,
    ) -> Result<FetchedImage, ApiError> {
        let bytes = fetch_bytes(&self.fetcher, place, url, metrics).await?;
        hash_and_probe_off_runtime(place.to_owned(), bytes).await
    }

    /// Memory one image needs, from its header: 400 for an unreadable
    /// header, a size beyond the limits or more than the whole budget.
    fn need(
        &self,
        place: &str,
        info: &Result<ImageInfo, VisionError>,
        options: &PreprocessOptions,
    ) -> Result<u64, ApiError> {
        let info = info.as_ref().map_err(|e| vision_error(place, e))?;
        let need = self
            .processor
            .memory_needed(info, options)
            .map_err(|e| vision_error(place, &e))?;
        self.check_need(place, &image_name(place, info), need)
    }

    /// `need` if it fits the whole budget, else a 400 naming the item.
    fn check_need(&self, place: &str, name: &str, need: u64) -> Result<u64, ApiError> {
        let budget = self.budget.total_bytes();
        if need > budget {
            return Err(
                budget_error(name, &BudgetError::TooLarge { need, budget }).with_param(place)
            );
        }
        Ok(need)
    }

    /// The memory each image needs: 0 when the pixel cache holds it or an
    /// earlier image of the request is the same.
    fn image_needs(
        &self,
        images: &[FetchedImage],
        variant: &ImageVariant,
    ) -> Result<Vec<u64>, ApiError> {
        let mut seen = std::collections::HashSet::new();
        images
            .iter()
            .map(|image| {
                let cached = self
                    .cache
                    .peek(&(image.hash, variant.fingerprint))
                    .is_some();
                let repeated = !seen.insert(image.hash);
                if cached || repeated {
                    Ok(0)
                } else {
                    self.need(&image.place, &image.info, &variant.options)
                }
            })
            .collect()
    }

    /// Reserves `needs` in one piece and splits it into one share per
    /// entry (`None` for a need of 0); `kind` names the items in errors.
    async fn reserve_needs(
        &self,
        needs: Vec<u64>,
        kind: &str,
    ) -> Result<Vec<Option<Reservation>>, ApiError> {
        let total: u64 = needs.iter().sum();
        if total == 0 {
            return Ok(needs.iter().map(|_| None).collect());
        }
        let new = needs.iter().filter(|&&need| need > 0).count();
        let what = format!("the request's {new} new {kind}(s)");
        let mut all = self
            .budget
            .reserve(total)
            .await
            .map_err(|e| budget_error(&what, &e))?;
        Ok(needs
            .into_iter()
            .map(|need| (need > 0).then(|| all.split_off(need)))
            .collect())
    }

    /// Preprocesses one image through the pixel cache, within its share of
    /// the reservation (reserved now if it was cached at reservation time
    /// but evicted since); returns the tensor's part of the share when
    /// this request computed it, and whether the pixel cache (or another
    /// request preprocessing the same image) supplied it.
    async fn load_one(
        &self,
        image: FetchedImage,
        share: Option<Reservation>,
        variant: &ImageVariant,
        metrics: &Metrics,
    ) -> Result<(Arc<PixelEntry>, Option<Reservation>, bool), ApiError> {
        let looked_up = Instant::now();
        let mut held = None;
        let slot = &mut held;
        let key = (image.hash, variant.fingerprint);
        let place = image.place.clone();
        let (entry, lookup) = self
            .cache
            .get_or_compute(key, || async move {
                let share = match share {
                    Some(share) => share,
                    None => {
                        self.reserve_one(&image.place, &image.info, &variant.options)
                            .await?
                    }
                };
                let entry = self
                    .preprocess(image.place, image.bytes, image.hash, variant, metrics)
                    .await?;
                *slot = Some(share.shrink_to(entry.weight() as u64));
                Ok(entry)
            })
            .await
            .map_err(|e| relabel(e, &place))?;
        let hit = lookup != Lookup::Miss;
        if hit {
            metrics.stage(Stage::PixelCache, looked_up.elapsed());
        }
        Ok((entry, held, hit))
    }

    /// Reserves one image's memory on its own.
    async fn reserve_one(
        &self,
        place: &str,
        info: &Result<ImageInfo, VisionError>,
        options: &PreprocessOptions,
    ) -> Result<Reservation, ApiError> {
        let need = self.need(place, info, options)?;
        let name = info
            .as_ref()
            .map(|i| image_name(place, i))
            .unwrap_or_default();
        self.reserve_for(place, &name, need).await
    }

    /// Reserves one item's `need` on its own; `name` says what it is.
    async fn reserve_for(
        &self,
        place: &str,
        name: &str,
        need: u64,
    ) -> Result<Reservation, ApiError> {
        self.budget
            .reserve(need)
            .await
            .map_err(|e| budget_error(name, &e).with_param(place))
    }

    /// Decodes and preprocesses on the CPU pool (one thread per core); an
    /// image alone in the pool is split across its threads ([`split_alone`]).
    async fn preprocess(
        &self,
        place: String,
        bytes: Bytes,
        hash: [u8; 32],
        variant: &ImageVariant,
        metrics: &Metrics,
    ) -> Result<PixelEntry, ApiError> {
        let processor = self.processor.clone();
        let in_flight = InFlight::enter(&self.in_flight);
        let options = PreprocessOptions {
            intra_image_parallel: split_alone(in_flight.others),
            ..variant.options
        };
        let content = content_hash(&hash, variant.fingerprint);
        let work = move |place: &str| {
            let output = processor
                .preprocess_bytes(&bytes, &options)
                .map_err(|e| vision_error(place, &e))?;
            let placement = pixels::placement(processor.as_ref(), &output.layout());
            Ok(PixelEntry::from_output(output, placement, content))
        };
        on_cpu_pool(place, in_flight, metrics, work).await
    }

    /// The pixel cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The in-flight memory budget (for metrics).
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }
}

/// Warms the CPU pool's threads for `processor` on a thread of its own
/// ([`iris_vision::warm_up`]): the first requests' images then cost what
/// later ones do. A failure only loses the warm-up, so it is logged.
fn warm_up_in_background(processor: Arc<dyn Processor>, options: PreprocessOptions) {
    let spawned = std::thread::Builder::new()
        .name("iris-image-warm-up".into())
        .spawn(
            move || match iris_vision::warm_up(processor.as_ref(), &options) {
                Ok(done) => tracing::info!(
                    threads = done.threads,
                    elapsed_ms = done.elapsed.as_millis() as u64,
                    "image pipeline warmed up"
                ),
                Err(e) => tracing::warn!(error = %e, "warming up the image pipeline failed"),
            },
        );
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the image pipeline's warm-up");
    }
}

/// Runs `work` (decode and preprocess one item, named by `place`) on the
/// CPU pool while the item counts as in flight, and times it as the
/// `preprocess` stage; a panic or a layout the wire cannot carry is an
/// error naming the item.
async fn on_cpu_pool<F>(
    place: String,
    in_flight: InFlight,
    metrics: &Metrics,
    work: F,
) -> Result<PixelEntry, ApiError>
where
    F: FnOnce(&str) -> Result<Result<PixelEntry, String>, ApiError> + Send + 'static,
{
    let started = Instant::now();
    let pool_place = place.clone();
    let entry = cpu_pool::run(move || {
        let _in_flight = in_flight;
        work(&pool_place)?
            .map_err(|e| ApiError::bad_field(pool_place.as_str(), format!("{pool_place}: {e}")))
    })
    .await
    .map_err(|e| {
        ApiError::internal(format!("{place}: preprocessing {e}")).with_param(place.as_str())
    })??;
    metrics.stage(Stage::Preprocess, started.elapsed());
    crate::trace::stage("preprocess", started);
    Ok(entry)
}

/// Whether an image is split across the CPU pool's threads, given the
/// images already being preprocessed: only when it is alone. Alone, a
/// plain JPEG's rows are decoded ahead on a helper thread while its resize
/// runs (other images' resizes go over the pool): lower latency for a
/// request with one image at low load. With others in flight every thread
/// is busy anyway, and one thread per image costs the least CPU. The
/// output is the same either way.
fn split_alone(others: usize) -> bool {
    others == 0
}

/// One image counted in [`Multimodal::in_flight`] while it lives.
struct InFlight {
    count: Arc<AtomicUsize>,
    /// Images in flight when this one entered.
    others: usize,
}

impl InFlight {
    fn enter(count: &Arc<AtomicUsize>) -> InFlight {
        let others = count.fetch_add(1, Ordering::Relaxed);
        InFlight {
            count: count.clone(),
            others,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An image fetched, its memory reserved and its layout planned
/// ([`Multimodal::start_media`]), to be preprocessed ([`Multimodal::preprocess_image`]).
pub struct StartedImage {
    image: Box<FetchedImage>,
    share: Option<Reservation>,
    /// How the request's images are preprocessed.
    variant: ImageVariant,
    /// The item's layout: the shape, grid and tokens its tensor will have.
    pub layout: ItemLayout,
    /// The pixel cache held the image's tensor when the request arrived.
    pub cached: bool,
}

impl StartedImage {
    /// The image's bytes as fetched or sent (base64 decoded).
    pub fn bytes(&self) -> u64 {
        u64::try_from(self.image.bytes.len()).unwrap_or(u64::MAX)
    }
}

/// A fetched image, its place in the request, its hash and what its
/// header says (read once, used on a miss).
struct FetchedImage {
    place: String,
    bytes: Bytes,
    hash: [u8; 32],
    info: Result<ImageInfo, VisionError>,
}

async fn hash_and_probe_off_runtime(place: String, bytes: Bytes) -> Result<FetchedImage, ApiError> {
    let inline = bytes.len() <= INLINE_HASH_BYTES;
    let work = move || FetchedImage {
        place,
        hash: image_hash(&bytes),
        info: iris_vision::probe(&bytes),
        bytes,
    };
    if inline {
        return Ok(work());
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("hashing task failed: {e}")))
}

/// The bytes `url` refers to, the fetch counted in the `fetch` stage;
/// errors name the part at `place`.
async fn fetch_bytes(
    fetcher: &MediaFetcher,
    place: &str,
    url: &str,
    metrics: &Metrics,
) -> Result<Bytes, ApiError> {
    let started = Instant::now();
    let fetched = fetcher
        .fetch(url)
        .await
        .map_err(|e| media_error(place, &e))?;
    metrics.stage(Stage::Fetch, started.elapsed());
    crate::trace::stage("fetch", started);
    Ok(fetched.bytes)
}

/// A fetch failure as the client sees it: 400 for a bad or refused
/// reference, 502/504 when the image host failed; `param` names the part.
fn media_error(place: &str, error: &MediaError) -> ApiError {
    let message = format!("{place}: {error}");
    match error.http_status() {
        502 => ApiError::bad_gateway(message),
        504 => ApiError::gateway_timeout(message),
        _ => ApiError::bad_request(message),
    }
    .with_param(place)
}

/// An image error as this request's part `place` names it: a failure
/// computed once for several requests sharing the same image (the pixel
/// cache's single flight) names the part of the request that computed it.
fn relabel(mut error: ApiError, place: &str) -> ApiError {
    let Some(other) = error.param.as_deref() else {
        return error;
    };
    if other != place && other.starts_with("messages[") {
        if let Some(rest) = error.message.strip_prefix(other) {
            error.message = format!("{place}{rest}");
        }
        error.param = Some(place.to_owned());
    }
    error
}

/// How messages name an image: its place, declared size and format.
fn image_name(place: &str, info: &ImageInfo) -> String {
    format!(
        "{place} ({}x{} {})",
        info.width,
        info.height,
        info.format.name()
    )
}

/// A budget refusal as the client sees it: 400 when `what` (an image, or a
/// request's images together) needs more than the whole budget, 503 with
/// Retry-After when the budget stayed in use for the whole wait.
fn budget_error(what: &str, error: &BudgetError) -> ApiError {
    match *error {
        BudgetError::TooLarge { need, budget } => ApiError::bad_field(
            "messages",
            format!(
                "{what}: decoding and preprocessing needs {} MiB, more than the gateway's whole memory for images in flight ({} MiB, --mm-max-inflight-mb)",
                need.div_ceil(MIB),
                budget / MIB
            ),
        )
        .with_code("image_too_large"),
        BudgetError::Busy { budget, waited } => ApiError::service_unavailable(format!(
            "{what}: the gateway's memory for images in flight ({} MiB) stayed in use for {} ms; retry later",
            budget / MIB,
            waited.as_millis()
        ))
        .with_retry_after(RETRY_AFTER_SECS),
    }
}

fn vision_error(place: &str, error: &iris_vision::VisionError) -> ApiError {
    let message = format!("{place}: {error}");
    if error.is_bad_input() {
        ApiError::bad_request(message)
    } else {
        ApiError::internal(message)
    }
    .with_param(place)
}

#[cfg(test)]
mod tests {
    /// Every family the vision crate preprocesses has its prompts built;
    /// any other is refused at start, naming it.
    #[test]
    fn families_without_built_prompts_are_refused() {
        for family in super::PROMPTS_BUILT {
            assert!(super::check_prompts_built(family).is_ok(), "{family}");
        }
        for family in ["mllama", "phi3_v"] {
            let err = super::check_prompts_built(family).unwrap_err().to_string();
            assert!(
                err.contains(family) && err.contains("does not build its prompts"),
                "{err}"
            );
        }
    }

    use super::*;
    use iris_vision::ImageFormat;
    use std::time::Duration;

    #[test]
    fn a_processor_config_without_an_image_token_is_explained() {
        let tmp = tempfile::tempdir().expect("tempdir");
        iris_model::tiny::write_tiny_model(tmp.path(), iris_model::tiny::Family::Internvl)
            .expect("tiny model");
        assert_eq!(
            images_refused(&ModelDir::load(tmp.path()).expect("dir")),
            None
        );
        // InternVL's remote-code upload: model_type internvl_chat, no
        // image_token_id, a CLIP preprocessor_config.json.
        let config = tmp.path().join("config.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config).expect("read")).expect("json");
        json["model_type"] = "internvl_chat".into();
        json.as_object_mut()
            .expect("object")
            .remove("image_token_id");
        std::fs::write(&config, json.to_string()).expect("write");
        let dir = ModelDir::load(tmp.path()).expect("dir");
        let why = images_refused(&dir).expect("explained");
        assert!(
            why.contains("no image_token_id") && why.contains("-hf"),
            "{why}"
        );
    }

    #[test]
    fn only_an_image_alone_in_the_pool_is_split() {
        let count = Arc::new(AtomicUsize::new(0));
        let first = InFlight::enter(&count);
        assert!(split_alone(first.others));
        let second = InFlight::enter(&count);
        assert!(!split_alone(second.others));
        drop(first);
        drop(second);
        assert_eq!(count.load(Ordering::Relaxed), 0, "each image leaves once");
        assert!(split_alone(InFlight::enter(&count).others));
    }

    #[test]
    fn budget_refusals_name_the_image_or_say_when_to_retry() {
        let info = ImageInfo {
            format: ImageFormat::Png,
            width: 9459,
            height: 9459,
            work_bytes_per_pixel: 8,
            swaps_axes: false,
        };
        let too_large = BudgetError::TooLarge {
            need: 1400 * MIB - 5,
            budget: 1024 * MIB,
        };
        let err = budget_error(&image_name("messages[0].content[2]", &info), &too_large);
        assert_eq!((err.status, err.retry_after), (400, None));
        assert_eq!(err.code.as_deref(), Some("image_too_large"));
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert!(
            err.message.starts_with(
                "messages[0].content[2] (9459x9459 PNG): decoding and preprocessing needs 1400 MiB, \
                 more than the gateway's whole memory for images in flight (1024 MiB"
            ),
            "{}",
            err.message
        );
        let busy = BudgetError::Busy {
            budget: 1024 * MIB,
            waited: Duration::from_millis(2500),
        };
        let err = budget_error("the request's 3 new image(s)", &busy);
        assert_eq!((err.status, err.retry_after), (503, Some(RETRY_AFTER_SECS)));
        assert!(
            err.message.contains("stayed in use for 2500 ms"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_shared_failure_names_each_requests_own_part() {
        let computed = vision_error("messages[0].content[1]", &VisionError::EmptyInput);
        let err = relabel(computed.clone(), "messages[3].content[0]");
        assert_eq!(err.param.as_deref(), Some("messages[3].content[0]"));
        assert!(
            err.message.starts_with("messages[3].content[0]: "),
            "{}",
            err.message
        );
        assert_eq!(
            relabel(computed.clone(), "messages[0].content[1]"),
            computed
        );
        let whole = ApiError::bad_field("messages", "too many images");
        assert_eq!(relabel(whole.clone(), "messages[1].content[0]"), whole);
    }

    #[test]
    fn fetch_failures_name_the_part_in_param_and_message() {
        let place = "messages[2].content[1]";
        let err = media_error(place, &MediaError::InvalidUrl("no host".into()));
        assert_eq!((err.status, err.param.as_deref()), (400, Some(place)));
        assert_eq!(
            err.message,
            "messages[2].content[1]: invalid image URL: no host"
        );
        let err = media_error(place, &MediaError::Timeout { elapsed_ms: 5 });
        assert_eq!((err.status, err.param.as_deref()), (504, Some(place)));
        let err = media_error(
            place,
            &MediaError::Connect {
                url: "http://example.com/a.png".into(),
                reason: "refused".into(),
            },
        );
        assert_eq!((err.status, err.param.as_deref()), (502, Some(place)));
    }
}
