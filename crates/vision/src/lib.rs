//! Iris vision preprocessing: image bytes → encoder inputs, bit-exact with the
//! Hugging Face reference processors (`transformers` 4.57.1, Pillow 12.2.0).
//!
//! - [`decode()`]: JPEG, PNG, WebP, GIF (first frame), BMP → RGB8, with EXIF
//!   orientation and Pillow's `convert("RGB")` rules, size limits checked
//!   from the header before any pixel allocation.
//! - [`Processor`]: one implementation per model family —
//!   [`QwenVlProcessor`] (Qwen2-VL, Qwen2.5-VL, Qwen3-VL),
//!   [`ClipProcessor`] (LLaVA-1.5), [`AnyresProcessor`] (LLaVA-NeXT,
//!   LLaVA-OneVision), [`Gemma3Processor`] (Gemma 3, with pan and scan),
//!   [`Idefics3Processor`] (Idefics3, SmolVLM), [`PixtralProcessor`]
//!   (Pixtral), [`InternVlProcessor`] (InternVL 3 / 3.5),
//!   [`Llama4Processor`] (Llama 4) and [`Phi4Processor`]
//!   (Phi-4-multimodal) — built from `preprocessor_config.json` by
//!   [`processor_from_config`] / [`processor_from_model_dir`]; all but
//!   Qwen share one tiled path (`tiles.rs`).
//! - [`resize_bicubic`]: Pillow 12.2.0's fixed-point BICUBIC, vectorised
//!   (the same passes run Pillow's BILINEAR and LANCZOS for Gemma 3 and
//!   Idefics3).
//! - [`PlaceholderLayout`]: where each image's tokens go in the prompt,
//!   with the structure tokens and text its family's processor writes
//!   around them ([`placeholders`]).
//! - [`preprocess_batch`]: many images over rayon.
//! - [`video`]: video frames → encoder inputs for the Qwen2-VL family
//!   ([`VideoProcessor`], bit-exact with transformers' video processors).
//!
//! Large buffers are recycled (per-thread scratch, pooled outputs); see
//! [`pool_stats`]. Memory for tensors that outlive their request (a
//! cache's) can be prepared ahead, off the request's path:
//! [`prepare_tensor_memory`]; and a process's first-use costs (scratch
//! growth, first page faults) paid at start: [`warm_up`]. docs/vision.md
//! has the details.

mod batch;
mod byte_lookup;
mod clip;
mod config;
pub mod debug;
pub mod decode;
mod error;
mod gemma3;
mod geometry;
mod idefics3;
mod image;
mod internvl;
mod layout;
mod llama4;
mod llava_next;
mod normalize;
mod npy;
mod output;
mod phi4;
mod pixtral;
pub mod placeholders;
mod pool;
mod processor;
mod qwen;
mod reserve;
mod resize;
mod scratch;
mod stream;
mod tiles;
pub mod video;
mod warm_up;

pub use batch::preprocess_batch;
pub use clip::ClipProcessor;
pub use config::{
    anyres_from_config, clip_from_config, gemma3_from_config, idefics3_from_config,
    internvl_from_config, llama4_from_config, phi4_from_config, pixtral_from_config,
    processor_from_config, processor_from_model_dir, qwen_from_config,
};
pub use decode::{
    decode, decode_with, probe, thread_images_decoded_ahead, DecodeLimits, ImageFormat, ImageInfo,
};
pub use error::VisionError;
pub use gemma3::{Gemma3Processor, PanAndScan};
pub use geometry::{centre_crop_origin, shortest_edge_size, smart_resize, smart_resize_f64};
pub use idefics3::Idefics3Processor;
pub use image::RgbView;
pub use internvl::InternVlProcessor;
pub use layout::PatchGeometry;
pub use llama4::Llama4Processor;
pub use llava_next::{AnyresFamily, AnyresProcessor};
pub use normalize::{Normalization, CLIP_MEAN, CLIP_STD};
pub use npy::write_npy_f32;
pub use output::{
    ItemTensor, ItemValues, OutputDtype, OutputLayout, PixelValues, PreprocessOutput,
};
pub use phi4::Phi4Processor;
pub use pixtral::PixtralProcessor;
pub use placeholders::{Expansion, PlaceholderLayout};
pub use pool::{pool_stats, PoolStats, PooledVec};
pub use processor::{PreprocessOptions, Processor, INTRA_IMAGE_PARALLEL_PIXELS};
pub use qwen::{QwenFamily, QwenVlProcessor, QWEN_DEFAULT_MAX_PIXELS, QWEN_DEFAULT_MIN_PIXELS};
pub use reserve::{prepare_tensor_memory, tensor_memory_stats, TensorMemoryStats};
pub use resize::{resize_bicubic, resize_bicubic_with, thread_streamed_images, Bicubic, PassOrder};
#[doc(hidden)]
pub use scratch::Scratch;
pub use scratch::{
    parked_scratch_bytes, thread_scratch_bytes, SCRATCH_KEEP_BYTES, SCRATCH_KEEP_TOTAL_BYTES,
};
pub use warm_up::{synthetic_jpeg, warm_up, WarmUp, WARM_UP_SIZE};

pub use video::{
    video_processor_from_model_dir, Sampling, VideoConfig, VideoFamily, VideoLayout, VideoOptions,
    VideoOutput, VideoProcessor,
};

/// Re-export of the `image` crate's RGB8 buffer type used in the API.
pub use ::image::RgbImage;
