//! A vLLM batch (`MultimodalInputs`, one per modality) split back into
//! its items' pixel tensors by the rules the published vLLM servicer
//! slices it with: the pixels' key (`encoder_input_key`, else
//! `pixel_values`) in `flat_keys` takes its rows per item from the sizes
//! tensor named there (which must be in `batched_keys`: the servicer
//! would share it otherwise); in `batched_keys`, dimension 0 is the item.
//! A batch naming its pixels in neither is one item (the engine folds it
//! whole, as before batches carried layouts). Another tensor in
//! `flat_keys` (Idefics3's `pixel_attention_mask`, flat by `num_patches`
//! as its pixels) must be carried and split the same way: one size per
//! item, adding up to its rows. The engine folds only the pixels, so it
//! checks those tensors and keeps them whole.
//!
//! A batched item of `[frames, 3, H, W]` drops its trailing all-zero
//! frames: the padding a gateway adds to stack items of fewer tiles
//! (Hugging Face's `_pad_for_batching`), so that each item folds into the
//! state as the bytes its preprocessor made, the same under every
//! protocol. Several items are cut from inline bytes only.

use bytes::Bytes;
use iris_proto::scheduler::{tensor_data::Payload, TensorData};
use iris_proto::tensor::{self, DType};
use iris_proto::vllm::MultimodalInputs;
use tonic::Status;

use crate::request::unsupported;

/// How the batch's pixels run over its items.
enum Split {
    /// Rows per item.
    Flat(Vec<u64>),
    /// Dimension 0 is the item.
    Batched,
    /// The whole tensor is one item.
    Whole,
}

/// The items' pixel tensors of the batch `mm` (named `what` in errors),
/// whose pixels are `pixels`, checked.
pub fn split(
    what: &str,
    mm: &MultimodalInputs,
    pixels: TensorData,
) -> Result<Vec<TensorData>, Status> {
    let key = match mm.encoder_input_key.as_deref() {
        Some(k) if !k.is_empty() => k,
        _ => "pixel_values",
    };
    let split = layout(what, mm, key)?;
    let items = match &split {
        Split::Flat(sizes) => sizes.len(),
        Split::Batched => pixels.shape.first().map_or(0, |&n| n as usize),
        Split::Whole => return Ok(vec![pixels]),
    };
    if items != mm.mm_placeholders.len() {
        return Err(Status::invalid_argument(format!(
            "{what} holds {items} items by its {key} layout but {} placeholder ranges (one per item)",
            mm.mm_placeholders.len()
        )));
    }
    check_other_flat_keys(what, mm, key, items)?;
    if items == 1 {
        return Ok(vec![pixels]);
    }
    let Some(Payload::Inline(bytes)) = &pixels.payload else {
        return Err(unsupported(
            &format!("{what}.pixel_values of {items} items off the inline lane"),
            "it splits a batch of several items from inline bytes only",
        ));
    };
    let dtype = DType::parse(&pixels.dtype)
        .map_err(|e| Status::invalid_argument(format!("{what}.pixel_values: {e}")))?;
    let (count, rest) = pixels.shape.split_first().unwrap_or((&0, &[]));
    let row_bytes = tensor::byte_len(rest, dtype)
        .map_err(|e| Status::invalid_argument(format!("{what}.pixel_values: {e}")))?
        as usize;
    let rows = Rows {
        bytes,
        rest,
        row_bytes,
        dtype: &pixels.dtype,
    };
    match split {
        Split::Flat(sizes) if sizes.iter().sum::<u64>() != u64::from(*count) => {
            Err(Status::invalid_argument(format!(
                "{what}: the per-item sizes {sizes:?} do not add up to the {count} rows of {key}"
            )))
        }
        Split::Flat(sizes) => Ok(rows.flat(&sizes)),
        _ => Ok(rows.batched(items)),
    }
}

/// Every tensor of `flat_keys` but the pixels (`pixel_key`) is carried
/// and splits into `items` items: one size per item, the sizes adding up
/// to its rows.
fn check_other_flat_keys(
    what: &str,
    mm: &MultimodalInputs,
    pixel_key: &str,
    items: usize,
) -> Result<(), Status> {
    for key in mm.flat_keys.keys().filter(|k| k.as_str() != pixel_key) {
        let Some(t) = mm.model_specific_tensors.get(key) else {
            return Err(Status::invalid_argument(format!(
                "{what}.flat_keys names {key}, which the batch does not carry"
            )));
        };
        let Split::Flat(sizes) = layout(what, mm, key)? else {
            continue;
        };
        let rows = t.shape.first().map_or(0, |&n| u64::from(n));
        if sizes.len() != items || sizes.iter().sum::<u64>() != rows {
            return Err(Status::invalid_argument(format!(
                "{what}: {key} of {rows} rows does not split by the sizes {sizes:?} into the {items} items"
            )));
        }
    }
    Ok(())
}

/// A tensor's inline bytes, cut along dimension 0.
struct Rows<'a> {
    bytes: &'a Bytes,
    /// The dimensions after the first.
    rest: &'a [u32],
    row_bytes: usize,
    dtype: &'a str,
}

impl Rows<'_> {
    /// `sizes[i]` rows for item `i`.
    fn flat(&self, sizes: &[u64]) -> Vec<TensorData> {
        let mut at = 0usize;
        sizes
            .iter()
            .map(|&n| {
                let len = n as usize * self.row_bytes;
                let mut shape = vec![n as u32];
                shape.extend_from_slice(self.rest);
                let item = cut(self.bytes, at, len, shape, self.dtype);
                at += len;
                item
            })
            .collect()
    }

    /// Row `i` for item `i`, its padding frames dropped.
    fn batched(&self, items: usize) -> Vec<TensorData> {
        (0..items)
            .map(|i| {
                let at = i * self.row_bytes;
                let (len, shape) = unpadded(&self.bytes[at..at + self.row_bytes], self.rest);
                cut(self.bytes, at, len, shape, self.dtype)
            })
            .collect()
    }
}

/// How the pixels named `key` run over the batch's items.
fn layout(what: &str, mm: &MultimodalInputs, key: &str) -> Result<Split, Status> {
    if let Some(sizes_key) = mm.flat_keys.get(key) {
        let Some(sizes) = mm.model_specific_tensors.get(sizes_key) else {
            return Err(Status::invalid_argument(format!(
                "{what}.flat_keys[{key}] names {sizes_key}, which the batch does not carry"
            )));
        };
        if !mm.batched_keys.iter().any(|k| k == sizes_key) {
            return Err(Status::invalid_argument(format!(
                "{what}: the sizes tensor {sizes_key} is not in batched_keys (it would be shared by every item)"
            )));
        }
        let values = sizes
            .payload
            .as_ref()
            .and_then(|p| match p {
                iris_proto::vllm::tensor_data::Payload::Inline(b) => Some(b.clone()),
                _ => None,
            })
            .map(|b| tensor::inline(sizes.shape.clone(), DType::Int64, b))
            .filter(|_| sizes.dtype == DType::Int64.as_str())
            .and_then(|t| tensor::read_int64(&t))
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{what}.model_specific_tensors[{sizes_key}] is not an inline int64 tensor"
                ))
            })?;
        let sizes = values
            .iter()
            .map(|&v| u64::try_from(v))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| {
                Status::invalid_argument(format!("{what}: {sizes_key} holds a negative size"))
            })?;
        return Ok(Split::Flat(sizes));
    }
    if mm.batched_keys.iter().any(|k| k == key) {
        return Ok(Split::Batched);
    }
    Ok(Split::Whole)
}

/// One item's tensor: `len` bytes of `bytes` from `at` (no copy).
fn cut(bytes: &Bytes, at: usize, len: usize, shape: Vec<u32>, dtype: &str) -> TensorData {
    TensorData {
        shape,
        dtype: dtype.to_owned(),
        payload: Some(Payload::Inline(bytes.slice(at..at + len))),
    }
}

/// A batched item's byte length and shape without the trailing all-zero
/// frames of a `[frames, 3, H, W]` item (keeping one).
pub(super) fn unpadded(item: &[u8], shape: &[u32]) -> (usize, Vec<u32>) {
    let [frames, ..] = shape else {
        return (item.len(), shape.to_vec());
    };
    if shape.len() != 4 || *frames == 0 {
        return (item.len(), shape.to_vec());
    }
    let frame = item.len() / *frames as usize;
    let mut kept = *frames as usize;
    while kept > 1
        && item[(kept - 1) * frame..kept * frame]
            .iter()
            .all(|&b| b == 0)
    {
        kept -= 1;
    }
    let mut trimmed = shape.to_vec();
    trimmed[0] = kept as u32;
    (kept * frame, trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::vllm as v;

    fn inline(shape: &[u32], dtype: &str, bytes: Vec<u8>) -> v::TensorData {
        v::TensorData {
            shape: shape.to_vec(),
            dtype: dtype.into(),
            payload: Some(v::tensor_data::Payload::Inline(bytes.into())),
        }
    }

    fn ints(shape: &[u32], values: &[i64]) -> v::TensorData {
        inline(
            shape,
            "int64",
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    fn engine(t: &v::TensorData) -> TensorData {
        let Some(v::tensor_data::Payload::Inline(b)) = &t.payload else {
            panic!("inline")
        };
        tensor::inline(t.shape.clone(), DType::parse(&t.dtype).unwrap(), b.clone())
    }

    fn ranges(n: u32) -> Vec<v::PlaceholderRange> {
        (0..n)
            .map(|i| v::PlaceholderRange {
                offset: i * 10,
                length: 4,
            })
            .collect()
    }

    fn bytes(t: &TensorData) -> &[u8] {
        match &t.payload {
            Some(Payload::Inline(b)) => b,
            other => panic!("{other:?}"),
        }
    }

    /// Qwen's flat rows come back per item by the counts tensor.
    #[test]
    fn flat_pixels_split_by_their_sizes_tensor() {
        let data: Vec<u8> = (0..6 * 4).map(|i| i as u8).collect();
        let pixels = inline(&[6, 2], "bfloat16", data.clone());
        let mm = v::MultimodalInputs {
            model_specific_tensors: [("image_patch_counts".to_owned(), ints(&[2], &[4, 2]))].into(),
            flat_keys: [("pixel_values".to_owned(), "image_patch_counts".to_owned())].into(),
            batched_keys: vec!["image_patch_counts".into()],
            mm_placeholders: ranges(2),
            ..v::MultimodalInputs::default()
        };
        let items = split("mm_inputs", &mm, engine(&pixels)).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(
            (items[0].shape.as_slice(), bytes(&items[0])),
            (&[4, 2][..], &data[..16])
        );
        assert_eq!(
            (items[1].shape.as_slice(), bytes(&items[1])),
            (&[2, 2][..], &data[16..])
        );
        let mut unbatched = mm.clone();
        unbatched.batched_keys.clear();
        let err = split("mm_inputs", &unbatched, engine(&pixels)).unwrap_err();
        assert!(
            err.message().contains("not in batched_keys"),
            "{}",
            err.message()
        );
        let mut short = mm.clone();
        short.model_specific_tensors =
            [("image_patch_counts".to_owned(), ints(&[2], &[4, 1]))].into();
        let err = split("mm_inputs", &short, engine(&pixels)).unwrap_err();
        assert!(err.message().contains("do not add up"), "{}", err.message());
        let mut fewer = mm;
        fewer.mm_placeholders = ranges(1);
        let err = split("mm_inputs", &fewer, engine(&pixels)).unwrap_err();
        assert!(
            err.message().contains("placeholder ranges"),
            "{}",
            err.message()
        );
    }

    /// Idefics3's pixel mask is flat by `num_patches` as its frames: it
    /// must be there and add up; the pixels split by the same sizes.
    #[test]
    fn a_flat_mask_beside_the_pixels_is_checked() {
        let frame = 3 * 2 * 2 * 2;
        let data: Vec<u8> = (0..5 * frame).map(|i| i as u8).collect();
        let pixels = inline(&[5, 3, 2, 2], "bfloat16", data.clone());
        let mm = v::MultimodalInputs {
            model_specific_tensors: [
                ("num_patches".to_owned(), ints(&[2], &[2, 3])),
                (
                    "pixel_attention_mask".to_owned(),
                    inline(&[5, 2, 2], "uint8", vec![1; 20]),
                ),
            ]
            .into(),
            flat_keys: [
                ("pixel_values".to_owned(), "num_patches".to_owned()),
                ("pixel_attention_mask".to_owned(), "num_patches".to_owned()),
            ]
            .into(),
            batched_keys: vec!["num_patches".into()],
            mm_placeholders: ranges(2),
            ..v::MultimodalInputs::default()
        };
        let items = split("mm_inputs", &mm, engine(&pixels)).unwrap();
        assert_eq!(
            (items[1].shape.as_slice(), bytes(&items[1])),
            (&[3, 3, 2, 2][..], &data[2 * frame..])
        );
        let mut short = mm.clone();
        short.model_specific_tensors.insert(
            "pixel_attention_mask".to_owned(),
            inline(&[4, 2, 2], "uint8", vec![1; 16]),
        );
        let err = split("mm_inputs", &short, engine(&pixels)).unwrap_err();
        assert!(
            err.message().contains("pixel_attention_mask of 4 rows"),
            "{}",
            err.message()
        );
        let mut missing = mm;
        missing
            .model_specific_tensors
            .remove("pixel_attention_mask");
        let err = split("mm_inputs", &missing, engine(&pixels)).unwrap_err();
        assert!(
            err.message().contains("does not carry"),
            "{}",
            err.message()
        );
    }

    /// Batched items lose the zero frames that padded them.
    #[test]
    fn batched_pixels_split_without_their_padding() {
        let frame = 3 * 2 * 2 * 4;
        let first: Vec<u8> = vec![1; 2 * frame];
        let second: Vec<u8> = vec![2; 3 * frame];
        let data = [first.clone(), vec![0; frame], second.clone()].concat();
        let pixels = inline(&[2, 3, 3, 2, 2], "float32", data);
        let mm = v::MultimodalInputs {
            encoder_input_key: Some("image_pixel_values".into()),
            batched_keys: vec!["image_pixel_values".into()],
            mm_placeholders: ranges(2),
            ..v::MultimodalInputs::default()
        };
        let items = split("mm_inputs", &mm, engine(&pixels)).unwrap();
        assert_eq!(
            (items[0].shape.as_slice(), bytes(&items[0])),
            (&[2, 3, 2, 2][..], &first[..])
        );
        assert_eq!(
            (items[1].shape.as_slice(), bytes(&items[1])),
            (&[3, 3, 2, 2][..], &second[..])
        );
    }

    /// No layout for the pixels: the batch is one item, as it is.
    #[test]
    fn a_batch_without_a_pixel_layout_is_one_item() {
        let pixels = inline(&[4, 2], "float32", vec![7; 32]);
        let mm = v::MultimodalInputs {
            batched_keys: vec!["image_grid_thw".into()],
            mm_placeholders: ranges(3),
            ..v::MultimodalInputs::default()
        };
        let items = split("mm_inputs", &mm, engine(&pixels)).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].shape, [4, 2]);
    }

    /// Several items on the shm lane cannot be cut here: refused by name.
    #[test]
    fn several_items_off_the_inline_lane_are_refused() {
        let mut pixels = engine(&inline(&[2, 3, 2, 2], "float32", vec![1; 96]));
        pixels.payload = Some(Payload::Shm(Default::default()));
        let mm = v::MultimodalInputs {
            batched_keys: vec!["pixel_values".into()],
            mm_placeholders: ranges(2),
            ..v::MultimodalInputs::default()
        };
        let err = split("mm_inputs", &mm, pixels).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unimplemented);
        assert!(err.message().contains("inline"), "{}", err.message());
    }
}
