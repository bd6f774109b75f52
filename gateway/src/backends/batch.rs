//! The items of one modality as ONE batch in the tensors Hugging Face's
//! processor returns for the whole request, for the two backends whose
//! protocols take a batch: vLLM (`MultimodalInputs`, cut back into items
//! by its keys) and SGLang (one `pixel_values` plus model-specific
//! tensors, handed to the model as one item).
//!
//! vLLM: the published servicer reads one batch per modality (two batches
//! carrying the same tensor key are refused) and slices each tensor into
//! items by the batch's `batched_keys` (dimension 0 runs over the items)
//! and `flat_keys` (rows concatenated over the items, the per-item row
//! counts in another tensor of the batch); a tensor named in neither is
//! shared by every item. The layouts are vLLM's model code's
//! (`_get_mm_fields_config`):
//!
//! | family (told by its item tensors) | pixels | other tensors |
//! |---|---|---|
//! | Qwen2/2.5/3-VL (`image_grid_thw`, `video_grid_thw`) | rows concatenated, flat by `image_patch_counts` / `video_patch_counts` (added: `t·h·w` per item) | grid `[n, 3]`, `second_per_grid_ts` `[n]`, the counts `[n]`: batched |
//! | LLaVA-1.5 (`[3, S, S]`, nothing else) | stacked `[n, 3, S, S]`, batched | |
//! | LLaVA-NeXT, OneVision (`image_sizes`, 4-D pixels) | stacked `[n, max tiles, 3, S, S]` (zero tiles pad, as HF's processor), batched | `image_sizes` `[n, 2]` batched |
//! | Gemma 3 (4-D pixels, nothing else) | crops concatenated, flat by `num_patches` (added: crops per item) | `num_patches` `[n]` batched |
//! | Idefics3, SmolVLM (`pixel_attention_mask`) | frames concatenated, flat by `num_patches` (added: frames per item) | `pixel_attention_mask` concatenated, flat by `num_patches`; `num_patches` `[n]` batched |
//! | Pixtral (`image_sizes`, 3-D pixels) | stacked `[n, 3, H, W]`, batched; images of different sizes are refused (vLLM unpads them in its own processor, which preprocessed pixels skip) | `image_sizes` `[n, 2]` batched |
//! | InternVL (`image_num_patches`) | patches concatenated, flat by `image_num_patches` | `image_num_patches` `[n]` batched |
//! | Llama 4 (`aspect_ratios`) | frames concatenated, flat by `patches_per_image` | `aspect_ratios` `[n, 2]`, `patches_per_image` `[n]` batched |
//! | Phi-4-multimodal (`image_attention_mask`) | `image_pixel_values` stacked `[n, max 1 + tiles, 3, S, S]` (zero padded), batched | `image_attention_mask` stacked and padded the same; `image_sizes` `[n, 2]`, `num_img_tokens` `[n]` batched |
//!
//! Each item has one placeholder range, from its first run to the end of
//! its last (vLLM counts items by ranges; `im_token_id` marks which
//! positions take embeddings), and one `mm_hashes` entry.
//!
//! SGLang: the published servicer makes the batch ONE item of the model
//! (`feature` = `pixel_values`, the other tensors its attributes), whose
//! code reads it as the processor's output for the request: the same
//! joins, with the pixels always under `pixel_values`, none of vLLM's
//! added count tensors, Pixtral images of different sizes padded as
//! Hugging Face pads them (SGLang's Pixtral vision model crops each one's
//! patches by `image_sizes`), and Idefics3's frames and mask under the
//! processor's prompt dimension (`[1, frames, …]`).
//!
//! A batch of one item passes its tensors through (an item dimension added
//! to the shape where the layout has one the item lacks: no copy). Only a
//! batch of several items copies, into one new tensor per key: it needs
//! every item's bytes inline ([`joined_items`] keeps them off the shm and
//! RDMA lanes for vLLM; SGLang takes inline bytes only); a pixel tensor on
//! another lane is refused (FAILED_PRECONDITION), never dropped. Images
//! that cannot form one batch (other tensors, other placeholder tokens,
//! pixels for some only, other dtypes or ranks) are UNIMPLEMENTED, naming
//! what differs, for either backend.

use std::collections::HashMap;

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, MultimodalItem, TensorData};
use iris_proto::tensor::{self, DType};
use tonic::Status;

use super::{cannot_carry, Backend};

/// The name the pixels go under when the model's code reads them so.
const PIXEL_VALUES: &str = "pixel_values";

/// How the items' tensors of one key become the batch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Join {
    /// Along dimension 0, which already runs over the item's rows (or is
    /// the item's own dimension of one).
    Concat,
    /// Under a new item dimension, padded to the largest item with zeros
    /// (Hugging Face's `_pad_for_batching`) or ones (Phi-4's crop masks).
    Stack(Pad),
}

/// What a stacked tensor is padded with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pad {
    Zeros,
    Ones,
}

/// How vLLM slices the batch's tensor of a key into items.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// Dimension 0 is the item.
    Batched,
    /// Rows concatenated; the per-item row counts are the named tensor.
    Flat(&'static str),
}

/// A family's pixel layout in vLLM's model code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    family: &'static str,
    pixels: (Join, Field),
    /// A counts tensor vLLM's code derives that the items lack: its name
    /// (each item's count is its pixels' first dimension).
    counts: Option<&'static str>,
    /// Stacked items must share one shape (no padding).
    same_shape: bool,
    /// Hugging Face's processor batches the pixels and their mask by
    /// prompt, `[1, frames, …]` for one request (Idefics3); vLLM's model
    /// code takes the frames flat.
    by_prompt: bool,
    /// Tensors vLLM keeps on the CPU.
    on_cpu: &'static [&'static str],
    /// The key vLLM's model code reads the pixels under.
    pixel_key: &'static str,
}

impl Layout {
    const fn new(family: &'static str, join: Join, field: Field) -> Layout {
        Layout {
            family,
            pixels: (join, field),
            counts: None,
            same_shape: false,
            by_prompt: false,
            on_cpu: &[],
            pixel_key: PIXEL_VALUES,
        }
    }
}

/// The family layout `item`'s tensors tell.
fn layout_of(item: &MultimodalItem) -> Layout {
    let has = |key: &str| item.model_specific_tensors.contains_key(key);
    let rank = item.encoder_input.as_ref().map_or(0, |t| t.shape.len());
    let flat = |family, sizes| Layout::new(family, Join::Concat, Field::Flat(sizes));
    let stacked = |family| Layout::new(family, Join::Stack(Pad::Zeros), Field::Batched);
    if has("image_grid_thw") {
        return Layout {
            counts: Some("image_patch_counts"),
            on_cpu: &["image_grid_thw"],
            ..flat("Qwen-VL", "image_patch_counts")
        };
    }
    if has("video_grid_thw") {
        return Layout {
            counts: Some("video_patch_counts"),
            on_cpu: &["video_grid_thw"],
            ..flat("Qwen-VL", "video_patch_counts")
        };
    }
    if has("image_attention_mask") {
        return Layout {
            pixel_key: "image_pixel_values",
            ..stacked("Phi-4-multimodal")
        };
    }
    if has("pixel_attention_mask") {
        return Layout {
            counts: Some("num_patches"),
            by_prompt: true,
            ..flat("Idefics3", "num_patches")
        };
    }
    if has("aspect_ratios") {
        return flat("Llama 4", "patches_per_image");
    }
    if has("image_num_patches") {
        return flat("InternVL", "image_num_patches");
    }
    match (has("image_sizes"), rank) {
        (true, 3) => Layout {
            same_shape: true,
            ..stacked("Pixtral")
        },
        (true, _) => stacked("LLaVA-NeXT/OneVision"),
        (false, 4) => Layout {
            counts: Some("num_patches"),
            ..flat("Gemma 3", "num_patches")
        },
        (false, _) => stacked("LLaVA"),
    }
}

/// How a model-specific tensor of the items joins and vLLM slices it:
/// Phi-4's per-crop mask gains the item dimension (a padded crop's mask
/// all ones, as Hugging Face's processor pads it); Idefics3's per-frame
/// pixel mask runs over the frames, flat by `num_patches` as the pixels;
/// the others carry the item dimension (batched).
fn tensor_layout(key: &str) -> (Join, Field) {
    match key {
        "image_attention_mask" => (Join::Stack(Pad::Ones), Field::Batched),
        "pixel_attention_mask" => (Join::Concat, Field::Flat("num_patches")),
        _ => (Join::Concat, Field::Batched),
    }
}

/// The request's items, one group per modality in the order each
/// modality first appears (the items of a group in prompt order).
pub fn by_modality(items: &[MultimodalItem]) -> Vec<Vec<&MultimodalItem>> {
    let mut groups: Vec<(i32, Vec<&MultimodalItem>)> = Vec::new();
    for item in items {
        match groups.iter_mut().find(|(m, _)| *m == item.modality) {
            Some((_, group)) => group.push(item),
            None => groups.push((item.modality, vec![item])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Indices of the items a vLLM worker gets joined with others of their
/// modality (their pixels must stay inline).
pub fn joined_items(items: &[MultimodalItem]) -> Vec<usize> {
    items
        .iter()
        .enumerate()
        .filter(|(_, item)| items.iter().filter(|i| i.modality == item.modality).count() > 1)
        .map(|(i, _)| i)
        .collect()
}

/// Bytes of joined tensors above which a translation runs on the
/// blocking pool.
pub const BLOCKING_JOIN_BYTES: usize = 256 << 10;

/// Bytes the vLLM batches of `items` copy (inline payloads of groups of
/// more than one item).
pub fn copied_bytes(items: &[MultimodalItem]) -> usize {
    inline_bytes(joined_items(items).into_iter().map(|i| &items[i]))
}

/// The inline payload bytes of `items`' tensors.
pub fn inline_bytes<'a>(items: impl Iterator<Item = &'a MultimodalItem>) -> usize {
    items
        .flat_map(|item| {
            item.encoder_input
                .iter()
                .chain(item.model_specific_tensors.values())
        })
        .map(|t| match &t.payload {
            Some(Payload::Inline(bytes)) => bytes.len(),
            _ => 0,
        })
        .sum()
}

/// One modality's items as one batch, in Iris's tensor form.
#[derive(Debug, Default)]
pub struct Batch {
    pub modality: i32,
    pub pixels: Option<TensorData>,
    /// The key the pixels go under (`pixel_values` unless the family's
    /// code reads another).
    pub pixel_key: String,
    pub tensors: HashMap<String, TensorData>,
    pub batched_keys: Vec<String>,
    pub flat_keys: HashMap<String, String>,
    pub keep_on_cpu_keys: Vec<String>,
    /// One `(offset, length)` per item.
    pub placeholders: Vec<(u32, u32)>,
    pub placeholder_token: Option<u32>,
}

impl Batch {
    /// Names `key` in the batch's `batched_keys` or `flat_keys`.
    fn slice_by(&mut self, key: &str, field: Field) {
        match field {
            Field::Batched => self.batched_keys.push(key.to_owned()),
            Field::Flat(sizes) => {
                self.flat_keys.insert(key.to_owned(), sizes.to_owned());
            }
        }
    }
}

/// `items` (one modality, prompt order, at least one) as one batch for
/// `backend` (vLLM or SGLang).
pub fn batch(items: &[&MultimodalItem], backend: Backend) -> Result<Batch, Status> {
    let Some(first) = items.first() else {
        return Err(Status::internal("an empty multimodal batch"));
    };
    let layout = match backend {
        Backend::Sglang => Layout {
            pixel_key: PIXEL_VALUES,
            same_shape: false,
            counts: None,
            ..layout_of(first)
        },
        _ => layout_of(first),
    };
    if let Some(other) = items
        .iter()
        .find(|item| tensor_keys(item) != tensor_keys(first))
    {
        return Err(cannot_carry(
            backend,
            "model_specific_tensors",
            &format!(
                "the images of a batch must carry the same tensors ({:?} and {:?})",
                tensor_keys(first),
                tensor_keys(other)
            ),
        ));
    }
    if items
        .iter()
        .any(|item| item.placeholder_token_id != first.placeholder_token_id)
    {
        return Err(cannot_carry(
            backend,
            "placeholder_token_id",
            "images with different placeholder tokens cannot form one batch",
        ));
    }
    let pixel_key = layout.pixel_key;
    let mut batch = Batch {
        modality: first.modality,
        pixel_key: pixel_key.to_owned(),
        placeholders: items.iter().filter_map(|item| span(item)).collect(),
        placeholder_token: first.placeholder_token_id,
        keep_on_cpu_keys: layout.on_cpu.iter().map(|k| (*k).to_owned()).collect(),
        ..Batch::default()
    };
    batch.pixels = pixels(items, &layout, backend)?;
    batch.slice_by(pixel_key, layout.pixels.1);
    for key in tensor_keys(first) {
        let of_items: Vec<&TensorData> = items
            .iter()
            .filter_map(|item| item.model_specific_tensors.get(key))
            .collect();
        let (how, field) = tensor_layout(key);
        batch
            .tensors
            .insert(key.clone(), join(key, &of_items, how, backend)?);
        batch.slice_by(key, field);
    }
    if let Some(name) = layout.counts {
        batch.tensors.insert(name.to_owned(), counts(items));
        batch.batched_keys.push(name.to_owned());
    }
    if backend == Backend::Sglang && layout.by_prompt {
        let mask = batch.tensors.get_mut("pixel_attention_mask");
        for t in batch.pixels.iter_mut().chain(mask) {
            t.shape.insert(0, 1);
        }
    }
    Ok(batch)
}

/// The item's model-specific tensor names, sorted.
fn tensor_keys(item: &MultimodalItem) -> Vec<&String> {
    let mut keys: Vec<&String> = item.model_specific_tensors.keys().collect();
    keys.sort();
    keys
}

/// The items' pixels joined per `layout`; `None` when no item has any.
fn pixels(
    items: &[&MultimodalItem],
    layout: &Layout,
    backend: Backend,
) -> Result<Option<TensorData>, Status> {
    let of_items: Vec<&TensorData> = items
        .iter()
        .filter_map(|item| item.encoder_input.as_ref())
        .collect();
    if of_items.is_empty() {
        return Ok(None);
    }
    if of_items.len() != items.len() {
        return Err(cannot_carry(
            backend,
            "images with and without pixels",
            "one batch has pixels for all of its images or for none",
        ));
    }
    if layout.same_shape && of_items.iter().any(|t| t.shape != of_items[0].shape) {
        return Err(cannot_carry(
            Backend::Vllm,
            &format!("{} images of different sizes in one request", layout.family),
            "vLLM's model reads each image unpadded, and a batch holds one pixel tensor (send them in separate requests)",
        ));
    }
    join(PIXEL_VALUES, &of_items, layout.pixels.0, backend).map(Some)
}

/// An item's placeholder range: from its first run to the end of its last.
fn span(item: &MultimodalItem) -> Option<(u32, u32)> {
    let start = item.placeholders.iter().map(|p| p.offset).min()?;
    let end = item
        .placeholders
        .iter()
        .map(|p| p.offset.saturating_add(p.length))
        .max()?;
    Some((start, end - start))
}

/// The per-item counts `[n]` (int64): each item's pixels' first dimension.
fn counts(items: &[&MultimodalItem]) -> TensorData {
    let values: Vec<i64> = items
        .iter()
        .map(|item| {
            item.encoder_input
                .as_ref()
                .and_then(|t| t.shape.first())
                .map_or(0, |&d| i64::from(d))
        })
        .collect();
    tensor::int64(vec![values.len() as u32], &values)
}

/// The tensors of one key over the items, joined: passed through for one
/// item (the item dimension added when stacking), copied for several.
fn join(
    key: &str,
    tensors: &[&TensorData],
    how: Join,
    backend: Backend,
) -> Result<TensorData, Status> {
    if let [only] = tensors {
        let mut out = (*only).clone();
        if let Join::Stack(_) = how {
            out.shape.insert(0, 1);
        }
        return Ok(out);
    }
    let first = tensors[0];
    let dtype = DType::parse(&first.dtype)
        .map_err(|e| Status::internal(format!("{backend} batch tensor {key}: {e}")))?;
    let mut parts = Vec::with_capacity(tensors.len());
    for t in tensors {
        let Some(Payload::Inline(data)) = &t.payload else {
            return Err(Status::failed_precondition(format!(
                "the {backend} backend joins the {} items' {key} into one tensor, which needs their bytes inline (this one is {})",
                tensors.len(),
                lane(t)
            )));
        };
        if t.dtype != first.dtype || t.shape.len() != first.shape.len() || t.shape.is_empty() {
            return Err(cannot_carry(
                backend,
                key,
                &format!(
                    "images of {} {:?} and {} {:?} cannot form one batch",
                    first.dtype, first.shape, t.dtype, t.shape
                ),
            ));
        }
        parts.push((t.shape.as_slice(), data));
    }
    let (shape, bytes) = match how {
        Join::Concat => concat(key, &parts, backend)?,
        Join::Stack(pad) => stack(&parts, dtype, pad),
    };
    Ok(tensor::inline(shape, dtype, Bytes::from(bytes)))
}

fn lane(t: &TensorData) -> &'static str {
    match &t.payload {
        Some(Payload::Inline(_)) => "inline",
        Some(Payload::Shm(_)) => "in shared memory",
        Some(Payload::Remote(_)) => "remote",
        None => "sent by hash alone",
    }
}

type Part<'a> = (&'a [u32], &'a Bytes);

/// Along dimension 0: the items' trailing dimensions must agree.
fn concat(key: &str, parts: &[Part], backend: Backend) -> Result<(Vec<u32>, Vec<u8>), Status> {
    let rest = &parts[0].0[1..];
    if let Some((shape, _)) = parts.iter().find(|(s, _)| &s[1..] != rest) {
        return Err(cannot_carry(
            backend,
            key,
            &format!(
                "images of {:?} and {shape:?} cannot be concatenated into one batch",
                parts[0].0
            ),
        ));
    }
    let rows = parts
        .iter()
        .try_fold(0u32, |sum, (s, _)| sum.checked_add(s[0]))
        .ok_or_else(|| Status::internal(format!("the items' {key} rows overflow a dimension")))?;
    let mut bytes = Vec::with_capacity(parts.iter().map(|(_, d)| d.len()).sum());
    for (_, data) in parts {
        bytes.extend_from_slice(data);
    }
    let mut shape = vec![rows];
    shape.extend_from_slice(rest);
    Ok((shape, bytes))
}

/// Under a new dimension 0, each item padded (`pad`) at the end of every
/// dimension to the largest.
fn stack(parts: &[Part], dtype: DType, pad: Pad) -> (Vec<u32>, Vec<u8>) {
    let rank = parts[0].0.len();
    let target: Vec<u32> = (0..rank)
        .map(|d| parts.iter().map(|(s, _)| s[d]).max().unwrap_or(0))
        .collect();
    let item_bytes = target.iter().map(|&d| d as usize).product::<usize>() * dtype.size();
    let fill = match pad {
        Pad::Zeros => vec![0; dtype.size()],
        Pad::Ones => dtype.one().to_vec(),
    };
    let mut bytes = Vec::with_capacity(item_bytes * parts.len());
    for (shape, data) in parts {
        pad_into(&mut bytes, data, shape, &target, &fill);
    }
    let mut shape = vec![parts.len() as u32];
    shape.extend(target);
    (shape, bytes)
}

/// Appends `data` (row-major, `shape`) padded to `target` with `fill`
/// (one element's bytes).
fn pad_into(out: &mut Vec<u8>, data: &[u8], shape: &[u32], target: &[u32], fill: &[u8]) {
    if shape == target {
        out.extend_from_slice(data);
        return;
    }
    let Some((&rows, inner)) = shape.split_first() else {
        out.extend_from_slice(data);
        return;
    };
    let inner_target = &target[1..];
    let elem = fill.len();
    let row_in = inner.iter().map(|&d| d as usize).product::<usize>() * elem;
    let row_out = inner_target.iter().map(|&d| d as usize).product::<usize>();
    for r in 0..rows as usize {
        let row = data.get(r * row_in..(r + 1) * row_in).unwrap_or_default();
        pad_into(out, row, inner, inner_target, fill);
    }
    let missing = (target[0] - rows) as usize * row_out;
    if fill.iter().all(|&b| b == 0) {
        out.resize(out.len() + missing * elem, 0);
    } else {
        (0..missing).for_each(|_| out.extend_from_slice(fill));
    }
}
