//! Preprocessed images and videos as the gateway keeps them: the encoder
//! input tensor in shared bytes (a cache hit, or the copy in each leg's
//! request, copies no tensor data) and its [`ItemLayout`] — modality,
//! shape, patch grid, token count and the content hash that names the item
//! to encoders, which is also known from the header before the pixels are.

use bytes::Bytes;
use iris_proto::common::Modality;
use iris_proto::tensor::DType;
use iris_vision::{
    Expansion, ItemTensor, OutputDtype, OutputLayout, PixelValues, PlaceholderLayout,
    PreprocessOutput, VideoLayout, VideoOutput,
};
use sha2::{Digest, Sha256};

/// What an image's or video's item looks like, pixels aside.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemLayout {
    pub modality: Modality,
    pub shape: Vec<u32>,
    pub dtype: DType,
    /// `[t, h, w]` patch grid (Qwen family).
    pub grid: Option<[u32; 3]>,
    /// The decoded image's `[height, width]`, for models that unpad their
    /// tiles' features with it (LLaVA-NeXT, LLaVA-OneVision).
    pub image_sizes: Option<[u32; 2]>,
    /// Placeholder tokens the prompt needs for this item.
    pub tokens: usize,
    /// Runs its tokens come in, `tokens / groups` tokens each: 1, an
    /// image's tiles, crops or rows ([`PlaceholderLayout::runs`]), or a
    /// Qwen3-VL video's temporal groups (each behind its own timestamp).
    pub groups: usize,
    /// The text the image's mark in the rendered template becomes, for
    /// families whose prompts need more than the image token repeated
    /// ([`iris_vision::placeholders`]).
    pub expansion: Option<Expansion>,
    /// SHA-256 over the file bytes' hash and the preprocessor fingerprint.
    pub content_hash: Bytes,
    /// Seconds of video per temporal patch (Qwen2.5-VL's
    /// `second_per_grid_ts`, for its temporal positions).
    pub second_per_grid: Option<f32>,
    /// The family's other tensors (InternVL's `image_num_patches`,
    /// Idefics3's `pixel_attention_mask`;
    /// [`iris_vision::Processor::item_tensors`]).
    pub tensors: Vec<ItemTensor>,
}

impl ItemLayout {
    /// The layout the vision crate planned or produced, in wire terms,
    /// with the image's place in the prompt (`placeholders`, the
    /// processor's [`iris_vision::Processor::placeholder_layout`] of it)
    /// and the family's other tensors (its `item_tensors`).
    pub fn new(
        layout: OutputLayout,
        (placeholders, tensors): (PlaceholderLayout, Vec<ItemTensor>),
        dtype: OutputDtype,
        content_hash: Bytes,
    ) -> Result<Self, String> {
        let shape = layout
            .shape
            .iter()
            .map(|&d| u32::try_from(d).map_err(|_| format!("tensor dimension {d} is too large")))
            .collect::<Result<Vec<u32>, String>>()?;
        let grid = match layout.image_grid_thw {
            Some([t, h, w]) => Some([dim(t)?, dim(h)?, dim(w)?]),
            None => None,
        };
        let image_sizes = match layout.image_sizes {
            Some([h, w]) => Some([dim(h)?, dim(w)?]),
            None => None,
        };
        let dtype = wire_dtype(dtype);
        Ok(ItemLayout {
            modality: Modality::Image,
            shape,
            dtype,
            grid,
            image_sizes,
            tokens: placeholders.tokens(),
            groups: placeholders.runs,
            expansion: placeholders.expansion,
            content_hash,
            second_per_grid: None,
            tensors,
        })
    }

    /// The layout the video processor planned or produced, in wire terms.
    pub fn video(
        layout: &VideoLayout,
        dtype: OutputDtype,
        content_hash: Bytes,
    ) -> Result<Self, String> {
        let [t, h, w] = layout.grid_thw;
        Ok(ItemLayout {
            modality: Modality::Video,
            shape: vec![dim(layout.shape[0])?, dim(layout.shape[1])?],
            dtype: wire_dtype(dtype),
            grid: Some([dim(t)?, dim(h)?, dim(w)?]),
            image_sizes: None,
            tokens: layout.tokens,
            groups: match &layout.timestamps {
                Some(_) => t.max(1),
                None => 1,
            },
            expansion: None,
            content_hash,
            second_per_grid: layout.second_per_grid_ts,
            tensors: Vec::new(),
        })
    }

    /// The key of the item's `[t, h, w]` grid tensor.
    pub fn grid_key(&self) -> &'static str {
        match self.modality {
            Modality::Video => "video_grid_thw",
            _ => "image_grid_thw",
        }
    }
}

/// Where the image whose output has `layout` goes in the prompt, and the
/// small tensors its item carries: what `processor` plans for it.
pub fn placement(
    processor: &dyn iris_vision::Processor,
    layout: &OutputLayout,
) -> (PlaceholderLayout, Vec<ItemTensor>) {
    (
        processor.placeholder_layout(layout),
        processor.item_tensors(layout),
    )
}

/// One preprocessed image.
#[derive(Debug)]
pub struct PixelEntry {
    /// Little-endian tensor bytes (the vision crate's recycled buffer).
    pub pixels: Bytes,
    pub layout: ItemLayout,
    /// Bytes of memory behind `pixels` (whole 2 MiB chunks when the
    /// tensor took prepared memory); at least `pixels.len()`.
    pub held: usize,
}

impl PixelEntry {
    /// Takes the processor's output without copying its tensor;
    /// `placement` places it in the prompt and adds the family's tensors
    /// ([`placement`]).
    pub fn from_output(
        output: PreprocessOutput,
        placement: (PlaceholderLayout, Vec<ItemTensor>),
        content_hash: Bytes,
    ) -> Result<Self, String> {
        let dtype = output.pixel_values.dtype();
        let layout = ItemLayout::new(output.layout(), placement, dtype, content_hash)?;
        Ok(PixelEntry::new(output.pixel_values, layout))
    }

    /// Takes the video processor's output without copying its tensor.
    pub fn from_video(output: VideoOutput, content_hash: Bytes) -> Result<Self, String> {
        let dtype = output.pixel_values.dtype();
        let layout = ItemLayout::video(&output.layout, dtype, content_hash)?;
        Ok(PixelEntry::new(output.pixel_values, layout))
    }

    fn new(tensor: PixelValues, layout: ItemLayout) -> Self {
        PixelEntry {
            held: tensor.allocated_bytes(),
            pixels: Bytes::from_owner(Tensor(tensor)),
            layout,
        }
    }

    /// Bytes the entry holds, for the cache's bound: the tensor's memory,
    /// not only its length, so that the cache's bound is what it keeps
    /// resident, and the family's tensors (Idefics3's pixel mask).
    pub fn weight(&self) -> usize {
        self.held.max(self.pixels.len())
            + self.layout.content_hash.len()
            + self
                .layout
                .tensors
                .iter()
                .map(|t| t.values.byte_len())
                .sum::<usize>()
            + std::mem::size_of::<Self>()
    }
}

/// The wire element type of an output dtype.
fn wire_dtype(dtype: OutputDtype) -> DType {
    match dtype {
        OutputDtype::F32 => DType::Float32,
        OutputDtype::Bf16 => DType::BFloat16,
    }
}

fn dim(value: usize) -> Result<u32, String> {
    u32::try_from(value).map_err(|_| format!("grid dimension {value} is too large"))
}

/// Owns the recycled tensor buffer behind a [`Bytes`]; it returns to the
/// vision crate's pool when the last reference goes.
struct Tensor(PixelValues);

impl AsRef<[u8]> for Tensor {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// SHA-256 of the image file's bytes: the pixel cache's key part.
pub fn image_hash(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The content hash sent to encoders (and their embedding caches): the
/// same bytes preprocessed differently are a different item.
pub fn content_hash(image_hash: &[u8; 32], fingerprint: u64) -> Bytes {
    let mut hasher = Sha256::new();
    hasher.update(image_hash);
    hasher.update(fingerprint.to_le_bytes());
    Bytes::copy_from_slice(&hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_vision::{PreprocessOptions, Processor, QwenVlProcessor};

    #[test]
    fn entry_shares_the_tensor_and_names_the_preprocessing() {
        let raw: Vec<u8> = (0..56 * 84 * 3).map(|i| (i * 7 % 251) as u8).collect();
        let image = iris_vision::RgbImage::from_raw(56, 84, raw).unwrap();
        let processor = QwenVlProcessor::qwen2_vl();
        let opts = PreprocessOptions::default();
        let output = processor.preprocess(&image, &opts).unwrap();
        let expected = output.pixel_values.as_bytes().to_vec();
        let hash = image_hash(b"file bytes");
        let placement = placement(&processor, &output.layout());
        let entry = PixelEntry::from_output(output, placement, content_hash(&hash, 1)).unwrap();
        assert_eq!(&entry.pixels[..], &expected[..]);
        assert_eq!(entry.layout.shape, vec![24, 1176]);
        assert_eq!(entry.layout.grid, Some([1, 6, 4]));
        assert_eq!(entry.layout.tokens, 6);
        assert_eq!(entry.layout.dtype, DType::Float32);
        assert!(entry.held >= entry.pixels.len());
        assert!(
            entry.weight() > entry.held,
            "the cache weighs the memory held"
        );
        let shared = entry.pixels.clone();
        assert_eq!(
            shared.as_ptr(),
            entry.pixels.as_ptr(),
            "clones share the buffer"
        );
        assert_ne!(content_hash(&hash, 1), content_hash(&hash, 2));
        assert_ne!(
            content_hash(&hash, 1),
            content_hash(&image_hash(b"other"), 1)
        );
    }
}
