//! What a processor returns: the encoder input tensor and its metadata.

use std::sync::Arc;

use half::bf16;

use crate::pool::PooledVec;

/// Element type written into `pixel_values`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum OutputDtype {
    /// IEEE float32 (the reference's dtype).
    #[default]
    F32,
    /// bfloat16, rounded to nearest even from the float32 value.
    Bf16,
}

impl OutputDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            OutputDtype::F32 => 4,
            OutputDtype::Bf16 => 2,
        }
    }

    /// Name as the wire/numpy calls it.
    pub fn name(self) -> &'static str {
        match self {
            OutputDtype::F32 => "float32",
            OutputDtype::Bf16 => "bfloat16",
        }
    }
}

/// The tensor data in the requested dtype, in a recycled buffer.
#[derive(Debug)]
pub enum PixelValues {
    /// float32 elements.
    F32(PooledVec<f32>),
    /// bfloat16 elements.
    Bf16(PooledVec<bf16>),
}

impl PixelValues {
    /// Element type.
    pub fn dtype(&self) -> OutputDtype {
        match self {
            PixelValues::F32(_) => OutputDtype::F32,
            PixelValues::Bf16(_) => OutputDtype::Bf16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            PixelValues::F32(v) => v.len(),
            PixelValues::Bf16(v) => v.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of memory the tensor holds (at least [`Self::as_bytes`]'s
    /// length; see [`PooledVec::allocated_bytes`]).
    pub fn allocated_bytes(&self) -> usize {
        match self {
            PixelValues::F32(v) => v.allocated_bytes(),
            PixelValues::Bf16(v) => v.allocated_bytes(),
        }
    }

    /// The raw little-endian bytes, as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            PixelValues::F32(v) => bytemuck::cast_slice(v),
            PixelValues::Bf16(v) => bytemuck::cast_slice(v),
        }
    }

    /// Element `i` widened to f32.
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        match self {
            PixelValues::F32(v) => v.get(i).copied(),
            PixelValues::Bf16(v) => v.get(i).map(|x| x.to_f32()),
        }
    }

    /// All elements widened to f32 (allocates).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            PixelValues::F32(v) => v.to_vec(),
            PixelValues::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// The shape of an image's encoder input, known before it is decoded
/// ([`crate::Processor::planned_layout`]): what a caller needs to place its
/// tokens in the prompt while the pixels are still being computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLayout {
    /// `[num_patches, C·T·P·P]` for Qwen, `[3, H, W]` for CLIP-style,
    /// `[1 + tiles, 3, T, T]` for the any-resolution (LLaVA-NeXT) family,
    /// `[1 + crops, 3, H, W]` for Gemma 3, `[tiles + 1, 3, T, T]` (global
    /// image last) for Idefics3 / SmolVLM, `[3, H, W]` for Pixtral,
    /// `[tiles (+ 1), 3, T, T]` (thumbnail or global tile last, when there
    /// is more than one tile) for InternVL and Llama 4.
    pub shape: Vec<usize>,
    /// `[t, h, w]` patch grid (Qwen family); `None` for fixed-size processors.
    pub image_grid_thw: Option<[usize; 3]>,
    /// How many placeholder tokens the prompt needs for this image.
    pub num_placeholder_tokens: usize,
    /// The model's `image_sizes` row, `[height, width]`: the decoded
    /// image's for LLaVA-NeXT / OneVision (which unpad their features with
    /// it), the resized image's for Pixtral (whose encoder takes images of
    /// varying size); `None` for processors whose model does not take it.
    pub image_sizes: Option<[usize; 2]>,
    /// `[rows, cols]` of the tiles the image was split into, for prompts
    /// that tag each tile with its position (Idefics3 / SmolVLM write
    /// `<row_r_col_c>` before tile `(r, c)`; `[0, 0]` when the image was
    /// not split), or of the token grid whose rows the prompt breaks
    /// (Pixtral: `[IMG_BREAK]` after each row), or of the dynamic tiles
    /// (InternVL, Llama 4: `[1, 1]` for a single tile). `None` for the
    /// other families.
    pub tile_grid: Option<[usize; 2]>,
    /// `[height, width]` of the resized image inside a padded canvas, for
    /// a model that masks the padding (Phi-4-multimodal's
    /// `image_attention_mask`); `None` for the other families.
    pub content_size: Option<[usize; 2]>,
}

/// A tensor of an image's item that the model's code reads beside the
/// pixels (`model_specific_tensors`), named, shaped and valued as the
/// Hugging Face processor returns it for one image: InternVL's
/// `image_num_patches` `[1]`, Llama 4's `aspect_ratios` `[1, 2]`,
/// Phi-4-multimodal's float32 `image_attention_mask`, Idefics3 /
/// SmolVLM's `pixel_attention_mask` ([`crate::Processor::item_tensors`]).
/// Its values are whole numbers whatever the type.
#[derive(Debug, Clone, PartialEq)]
pub struct ItemTensor {
    /// The key the model's code reads.
    pub name: &'static str,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values, row-major, in their wire type.
    pub values: ItemValues,
}

/// An [`ItemTensor`]'s values and their element type.
#[derive(Debug, Clone, PartialEq)]
pub enum ItemValues {
    /// `int64` (counts, sizes).
    Int64(Vec<i64>),
    /// `float32` ones and zeros (a mask the reference returns as floats).
    Float32(Vec<f32>),
    /// `uint8` ones and zeros: a pixel mask, one byte a pixel (the wire has
    /// no boolean type; the reference's int64 0/1, an eighth of the bytes).
    /// Shared: a layout's clones and the wire tensor take no copy.
    UInt8(Arc<[u8]>),
}

impl ItemValues {
    /// The element type as the wire names it.
    pub fn dtype(&self) -> &'static str {
        match self {
            ItemValues::Int64(_) => "int64",
            ItemValues::Float32(_) => "float32",
            ItemValues::UInt8(_) => "uint8",
        }
    }

    /// Bytes the values take.
    pub fn byte_len(&self) -> usize {
        match self {
            ItemValues::Int64(v) => v.len() * 8,
            ItemValues::Float32(v) => v.len() * 4,
            ItemValues::UInt8(v) => v.len(),
        }
    }

    /// The values widened to `i64` (they are whole numbers; allocates).
    pub fn to_i64(&self) -> Vec<i64> {
        match self {
            ItemValues::Int64(v) => v.clone(),
            ItemValues::Float32(v) => v.iter().map(|&x| x as i64).collect(),
            ItemValues::UInt8(v) => v.iter().map(|&x| i64::from(x)).collect(),
        }
    }
}

impl ItemTensor {
    /// An `int64` tensor of `shape` holding `values`.
    pub fn ints(name: &'static str, shape: Vec<usize>, values: &[usize]) -> Self {
        let values = values.iter().map(|&v| v as i64).collect();
        ItemTensor {
            name,
            shape,
            values: ItemValues::Int64(values),
        }
    }

    /// A `float32` tensor of `shape` holding the whole numbers `values`.
    pub fn floats(name: &'static str, shape: Vec<usize>, values: &[usize]) -> Self {
        let values = values.iter().map(|&v| v as f32).collect();
        ItemTensor {
            name,
            shape,
            values: ItemValues::Float32(values),
        }
    }

    /// A `uint8` mask of `shape` holding `ones` (1 where valid, 0 elsewhere).
    pub fn mask(name: &'static str, shape: Vec<usize>, ones: Vec<u8>) -> Self {
        ItemTensor {
            name,
            shape,
            values: ItemValues::UInt8(ones.into()),
        }
    }
}

impl OutputLayout {
    /// `frames` planar frames of `(height, width)`, `[frames, 3, H, W]`,
    /// taking `tokens` placeholder tokens; no grid, sizes or tile grid.
    pub(crate) fn frames(frames: usize, (height, width): (usize, usize), tokens: usize) -> Self {
        OutputLayout {
            shape: vec![frames, 3, height, width],
            image_grid_thw: None,
            num_placeholder_tokens: tokens,
            image_sizes: None,
            tile_grid: None,
            content_size: None,
        }
    }

    /// One planar frame of `(height, width)` without a frame axis,
    /// `[3, H, W]`, taking `tokens` placeholder tokens.
    pub(crate) fn frame(size: (usize, usize), tokens: usize) -> Self {
        let mut layout = OutputLayout::frames(1, size, tokens);
        layout.shape.remove(0);
        layout
    }

    /// With [`OutputLayout::tile_grid`] `[rows, cols]`.
    pub(crate) fn with_tiles(self, grid: [usize; 2]) -> Self {
        OutputLayout {
            tile_grid: Some(grid),
            ..self
        }
    }

    /// With [`OutputLayout::image_sizes`] `[height, width]`.
    pub(crate) fn with_image_sizes(self, sizes: [usize; 2]) -> Self {
        OutputLayout {
            image_sizes: Some(sizes),
            ..self
        }
    }
}

impl PreprocessOutput {
    /// The output's layout (what [`crate::Processor::planned_layout`] promised).
    pub fn layout(&self) -> OutputLayout {
        OutputLayout {
            shape: self.shape.clone(),
            image_grid_thw: self.image_grid_thw,
            num_placeholder_tokens: self.num_placeholder_tokens,
            image_sizes: self.image_sizes,
            tile_grid: self.tile_grid,
            content_size: self.content_size,
        }
    }
}

/// Encoder inputs for one image.
#[derive(Debug)]
pub struct PreprocessOutput {
    /// The tensor, row-major with shape [`Self::shape`].
    pub pixel_values: PixelValues,
    /// `[num_patches, C·T·P·P]` for Qwen, `[3, H, W]` for CLIP-style,
    /// `[1 + tiles, 3, T, T]` for the any-resolution (LLaVA-NeXT) family,
    /// `[1 + crops, 3, H, W]` for Gemma 3, `[tiles + 1, 3, T, T]` (global
    /// image last) for Idefics3 / SmolVLM, `[3, H, W]` for Pixtral.
    pub shape: Vec<usize>,
    /// `[t, h, w]` patch grid (Qwen family); `None` for fixed-size processors.
    pub image_grid_thw: Option<[usize; 3]>,
    /// How many placeholder tokens the prompt needs for this image.
    pub num_placeholder_tokens: usize,
    /// The decoded image's `[height, width]` for the families whose model
    /// takes it (LLaVA-NeXT, OneVision); see [`OutputLayout::image_sizes`].
    pub image_sizes: Option<[usize; 2]>,
    /// The tile rows and columns (Idefics3 / SmolVLM); see
    /// [`OutputLayout::tile_grid`].
    pub tile_grid: Option<[usize; 2]>,
    /// See [`OutputLayout::content_size`].
    pub content_size: Option<[usize; 2]>,
    /// Size the image was resized to, `(width, height)`, before patching/cropping.
    pub resized_size: (usize, usize),
}

impl PreprocessOutput {
    /// The output of a processor: its tensor, the layout it wrote it in
    /// and the size the image was resized to, `(width, height)`.
    pub fn from_layout(
        pixel_values: PixelValues,
        layout: OutputLayout,
        resized_size: (usize, usize),
    ) -> PreprocessOutput {
        PreprocessOutput {
            pixel_values,
            shape: layout.shape,
            image_grid_thw: layout.image_grid_thw,
            num_placeholder_tokens: layout.num_placeholder_tokens,
            image_sizes: layout.image_sizes,
            tile_grid: layout.tile_grid,
            content_size: layout.content_size,
            resized_size,
        }
    }
}
