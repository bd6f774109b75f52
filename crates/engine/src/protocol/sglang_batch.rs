//! An SGLang batch (`mm_inputs`: one `pixel_values` and its model-specific
//! tensors for all of a request's images, joined as Hugging Face's
//! processor joins them) cut back into one TokenSpeed item per image, by
//! the model's family, so that the engine checks each image as it checks
//! TokenSpeed's items and folds it as the same bytes:
//!
//! | family | the batch | each image |
//! |---|---|---|
//! | Qwen-VL | rows concatenated, `image_grid_thw` `[n, 3]` | `t·h·w` rows, its grid row; one run |
//! | LLaVA-1.5 | `[n, 3, S, S]` | `[3, S, S]`; one run |
//! | LLaVA-NeXT, OneVision | `[n, max tiles, 3, S, S]`, `image_sizes` `[n, 2]` | its tiles (the trailing all-zero padding dropped); one run |
//! | Pixtral | `[n, 3, max H, max W]`, `image_sizes` `[n, 2]` | `[3, H, W]`, cut out of the zero padding; `H / patch` runs |
//! | InternVL | rows concatenated, `image_num_patches` `[n]` | its patches; one run |
//! | Llama 4 | rows concatenated, `patches_per_image` `[n]`, `aspect_ratios` `[n, 2]` | its frames; a run per frame |
//! | Phi-4-multimodal | `[n, max crops, 3, S, S]`, `image_attention_mask` `[n, max crops, c, c]`, `image_sizes`, `num_img_tokens` | its crops and their masks (the padding dropped); one run |
//! | Gemma 3, Idefics3 | crops or frames concatenated (Idefics3 under a prompt dimension of one) | not per image: the batch carries no per-image counts, so it stays one item |
//!
//! Every per-image tensor keeps its row (`[1, …]`). The placeholder runs
//! are given out in prompt order; their count must be the images' runs.
//! A batch of another modality than images, of a model of no known family
//! or without pixels is not cut ([`cut`] answers `None`).

use bytes::{Bytes, BytesMut};
use iris_proto::common::Modality;
use iris_proto::scheduler::{tensor_data::Payload, MultimodalItem, PlaceholderRange, TensorData};
use iris_proto::sglang::{self as s, MultimodalInputs};
use iris_proto::tensor::{self, DType};
use tonic::Status;

use crate::families::Layout;

const WHAT: &str = "mm_inputs";

/// `mm`'s images as TokenSpeed items, or `None` when it is not cut (see
/// the module's docs).
pub fn cut(layout: Layout, mm: &MultimodalInputs) -> Result<Option<Vec<MultimodalItem>>, Status> {
    let Some(pixels) = mm.pixel_values.as_ref() else {
        return Ok(None);
    };
    if mm.modalities.iter().any(|m| m != "image") {
        return Ok(None);
    }
    let batch = Batch { mm, pixels };
    let images = match layout {
        Layout::Qwen { .. } => batch.flat(&batch.grid_rows()?, &[])?,
        Layout::Clip { .. } => batch.stacked(&[])?,
        Layout::Anyres { .. } => batch.stacked(&["image_sizes"])?,
        Layout::Pixtral { patch } => batch.pixtral(patch)?,
        Layout::Internvl { .. } => batch.flat(&batch.counts("image_num_patches")?, &[])?,
        Layout::Llama4 { .. } => {
            let frames = batch.counts("patches_per_image")?;
            let runs = frames.clone();
            batch.flat(&frames, &runs)?
        }
        Layout::Phi4 { .. } => batch.stacked(&["image_sizes", "num_img_tokens"])?,
        Layout::Crops { .. } | Layout::Idefics3 { .. } => batch.whole()?,
        Layout::Unknown => return Ok(None),
    };
    batch.with_runs(images).map(Some)
}

/// One image before its placeholders are given out: its tensors and how
/// many placeholder runs it has.
struct Image {
    pixels: TensorData,
    tensors: Vec<(String, TensorData)>,
    runs: usize,
}

struct Batch<'a> {
    mm: &'a MultimodalInputs,
    pixels: &'a s::TensorData,
}

impl Batch<'_> {
    /// A model-specific tensor the family needs.
    fn tensor(&self, key: &str) -> Result<&s::TensorData, Status> {
        self.mm.model_specific_tensors.get(key).ok_or_else(|| {
            Status::invalid_argument(format!(
                "{WHAT}.model_specific_tensors lacks {key}, which this model's images need"
            ))
        })
    }

    /// An int64 tensor's values as counts.
    fn counts(&self, key: &str) -> Result<Vec<usize>, Status> {
        let t = self.tensor(key)?;
        let values = (t.dtype == DType::Int64.as_str())
            .then(|| tensor::read_int64(&engine(t)))
            .flatten()
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "{WHAT}.model_specific_tensors[{key}] is not an int64 tensor"
                ))
            })?;
        values
            .into_iter()
            .map(|v| usize::try_from(v).ok().filter(|&n| n > 0))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| Status::invalid_argument(format!("{WHAT}: {key} holds a count below 1")))
    }

    /// Qwen's rows per image: the product of each `image_grid_thw` row.
    fn grid_rows(&self) -> Result<Vec<usize>, Status> {
        let grid = self.counts("image_grid_thw")?;
        if grid.len() % 3 != 0 {
            return Err(Status::invalid_argument(format!(
                "{WHAT}: image_grid_thw holds {} values, not rows of 3",
                grid.len()
            )));
        }
        grid.chunks(3)
            .map(|g| g.iter().try_fold(1usize, |rows, &d| rows.checked_mul(d)))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                Status::invalid_argument(format!("{WHAT}: an image_grid_thw row overflows"))
            })
    }

    /// Rows concatenated: image `i` takes `rows[i]` rows of the pixels and
    /// row `i` of every other tensor, and `runs[i]` runs (one when `runs`
    /// is empty).
    fn flat(&self, rows: &[usize], runs: &[usize]) -> Result<Vec<Image>, Status> {
        let total = rows.iter().try_fold(0usize, |sum, &n| sum.checked_add(n));
        if total != self.pixels.shape.first().map(|&n| n as usize) {
            let total = total.map_or("too many".to_owned(), |t| t.to_string());
            return Err(Status::invalid_argument(format!(
                "{WHAT}: the images' {total} rows are not the {:?} pixel_values' rows",
                self.pixels.shape
            )));
        }
        let mut at = 0;
        let mut images = Vec::with_capacity(rows.len());
        for (i, &n) in rows.iter().enumerate() {
            images.push(Image {
                pixels: slice_rows(self.pixels, at, n)?,
                tensors: self.rows_of_each(i, rows.len())?,
                runs: runs.get(i).copied().unwrap_or(1),
            });
            at += n;
        }
        Ok(images)
    }

    /// Images stacked under dimension 0: image `i`'s pixels without their
    /// trailing all-zero frames, `keys` and Phi-4's crop masks by row.
    fn stacked(&self, keys: &[&str]) -> Result<Vec<Image>, Status> {
        let n = self.pixels.shape.first().map_or(0, |&n| n as usize);
        for key in keys {
            self.tensor(key)?;
        }
        (0..n)
            .map(|i| {
                let pixels = image_rows(self.pixels, i, frames(self.pixels, i)?)?;
                let mut tensors = self.rows_of_each(i, n)?;
                if let Some(mask) = self.mm.model_specific_tensors.get("image_attention_mask") {
                    let mask = image_rows(mask, i, pixels.shape[0] as usize)?;
                    tensors.retain(|(k, _)| k != "image_attention_mask");
                    tensors.push(("image_attention_mask".to_owned(), mask));
                }
                Ok(Image {
                    pixels,
                    tensors,
                    runs: 1,
                })
            })
            .collect()
    }

    /// Pixtral: image `i` cut out of the padded `[3, max H, max W]` to its
    /// `image_sizes` row, one run per `patch` rows.
    fn pixtral(&self, patch: u64) -> Result<Vec<Image>, Status> {
        let sizes = self.counts("image_sizes")?;
        let mut images = self.stacked(&["image_sizes"])?;
        if sizes.len() != 2 * images.len() {
            return Err(Status::invalid_argument(format!(
                "{WHAT}: image_sizes holds {} values for {} images",
                sizes.len(),
                images.len()
            )));
        }
        for (image, size) in images.iter_mut().zip(sizes.chunks(2)) {
            image.pixels = cropped(&image.pixels, size[0], size[1])?;
            image.runs = size[0] / patch.max(1) as usize;
        }
        Ok(images)
    }

    /// The batch as one image, Idefics3's prompt dimension of one dropped
    /// (`[1, frames, 3, T, T]` and its mask `[1, frames, T, T]`).
    fn whole(&self) -> Result<Vec<Image>, Status> {
        let squeezed = |t: &s::TensorData, rank: usize| {
            let mut t = engine(t);
            if t.shape.len() == rank && t.shape[0] == 1 {
                t.shape.remove(0);
            }
            t
        };
        let tensors = self
            .mm
            .model_specific_tensors
            .iter()
            .map(|(key, t)| match key.as_str() {
                "pixel_attention_mask" => (key.clone(), squeezed(t, 4)),
                _ => (key.clone(), engine(t)),
            })
            .collect();
        Ok(vec![Image {
            pixels: squeezed(self.pixels, 5),
            tensors,
            runs: self.mm.mm_placeholders.len(),
        }])
    }

    /// Row `i` (as `[1, …]`) of every model-specific tensor, which must
    /// hold one row per image (`n`).
    fn rows_of_each(&self, i: usize, n: usize) -> Result<Vec<(String, TensorData)>, Status> {
        let mut out = Vec::new();
        for (key, t) in &self.mm.model_specific_tensors {
            if t.shape.first().map(|&d| d as usize) != Some(n) {
                return Err(Status::invalid_argument(format!(
                    "{WHAT}.model_specific_tensors[{key}] of shape {:?} has not one row per image ({n})",
                    t.shape
                )));
            }
            out.push((key.clone(), slice_rows(t, i, 1)?));
        }
        Ok(out)
    }

    /// The images as items, each given its runs of the placeholders in
    /// order.
    fn with_runs(&self, images: Vec<Image>) -> Result<Vec<MultimodalItem>, Status> {
        let ranges = &self.mm.mm_placeholders;
        let wanted: usize = images.iter().map(|i| i.runs).sum();
        if wanted != ranges.len() {
            return Err(Status::invalid_argument(format!(
                "{WHAT}: its {} images take {wanted} placeholder runs, but {} were sent",
                images.len(),
                ranges.len()
            )));
        }
        let mut runs = ranges.iter();
        Ok(images
            .into_iter()
            .map(|image| MultimodalItem {
                modality: Modality::Image as i32,
                content_hash: Bytes::new(),
                placeholders: runs
                    .by_ref()
                    .take(image.runs)
                    .map(|r| PlaceholderRange {
                        offset: r.offset,
                        length: r.length,
                    })
                    .collect(),
                placeholder_token_id: self.mm.im_token_id,
                encoder_input: Some(image.pixels),
                model_specific_tensors: image.tensors.into_iter().collect(),
            })
            .collect())
    }
}

/// An SGLang tensor in TokenSpeed's form (inline, no copy).
fn engine(t: &s::TensorData) -> TensorData {
    TensorData {
        shape: t.shape.clone(),
        dtype: t.dtype.clone(),
        payload: Some(Payload::Inline(t.data.clone())),
    }
}

/// Bytes per row of `t` (everything after dimension 0).
fn row_bytes(t: &s::TensorData) -> Result<usize, Status> {
    let dtype =
        DType::parse(&t.dtype).map_err(|e| Status::invalid_argument(format!("{WHAT}: {e}")))?;
    let rest = t.shape.get(1..).unwrap_or_default();
    Ok(rest.iter().map(|&d| d as usize).product::<usize>() * dtype.size())
}

/// `count` rows of `t` from row `at`, as `[count, …]` (no copy).
fn slice_rows(t: &s::TensorData, at: usize, count: usize) -> Result<TensorData, Status> {
    let row = row_bytes(t)?;
    let (start, end) = (at * row, (at + count) * row);
    if end > t.data.len() {
        return Err(Status::invalid_argument(format!(
            "{WHAT}: a tensor of shape {:?} holds {} bytes, fewer than its rows",
            t.shape,
            t.data.len()
        )));
    }
    let mut shape = t.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = count as u32;
    }
    Ok(TensorData {
        shape,
        dtype: t.dtype.clone(),
        payload: Some(Payload::Inline(t.data.slice(start..end))),
    })
}

/// The leading `rows` rows of image `i` of a stacked tensor `t`
/// (`[n, rows…, …]`), without the stacking dimension (no copy).
fn image_rows(t: &s::TensorData, i: usize, rows: usize) -> Result<TensorData, Status> {
    let inner = t.shape.get(1..).unwrap_or_default();
    let all = inner.first().map_or(1, |&d| d as usize);
    let image = row_bytes(t)?;
    let start = i * image;
    if rows > all || start + image > t.data.len() {
        return Err(Status::invalid_argument(format!(
            "{WHAT}: image {i} has no {rows} rows in a tensor of shape {:?}",
            t.shape
        )));
    }
    let mut shape = inner.to_vec();
    if let Some(first) = shape.first_mut() {
        *first = rows as u32;
    }
    let len = image / all.max(1) * rows;
    Ok(TensorData {
        shape,
        dtype: t.dtype.clone(),
        payload: Some(Payload::Inline(t.data.slice(start..start + len))),
    })
}

/// How many of image `i`'s frames the gateway did not pad: its stacked
/// `[frames, 3, H, W]` without the trailing all-zero ones
/// ([`super::vllm_batch::unpadded`], as a vLLM batch is cut); every row
/// of another rank.
fn frames(t: &s::TensorData, i: usize) -> Result<usize, Status> {
    let all = t.shape.get(1).map_or(1, |&d| d as usize);
    let image = image_rows(t, i, all)?;
    let Some(Payload::Inline(bytes)) = &image.payload else {
        return Ok(all);
    };
    let (_, kept) = super::vllm_batch::unpadded(bytes, &image.shape);
    Ok(kept.first().map_or(all, |&f| f as usize))
}

/// `[3, H, W]` cut out of the top left of a padded `[3, max H, max W]`.
fn cropped(t: &TensorData, height: usize, width: usize) -> Result<TensorData, Status> {
    let [channels, max_h, max_w] = t.shape[..] else {
        return Err(Status::invalid_argument(format!(
            "{WHAT}: Pixtral pixels of shape {:?}, not [3, H, W] per image",
            t.shape
        )));
    };
    let (max_h, max_w) = (max_h as usize, max_w as usize);
    if height > max_h || width > max_w {
        return Err(Status::invalid_argument(format!(
            "{WHAT}: image_sizes {height}×{width} exceeds the pixels' {max_h}×{max_w}"
        )));
    }
    let elem = DType::parse(&t.dtype)
        .map_err(|e| Status::invalid_argument(format!("{WHAT}: {e}")))?
        .size();
    let Some(Payload::Inline(data)) = &t.payload else {
        return Err(Status::invalid_argument(format!(
            "{WHAT}: pixels not inline"
        )));
    };
    let mut out = BytesMut::with_capacity(channels as usize * height * width * elem);
    for c in 0..channels as usize {
        for y in 0..height {
            let start = ((c * max_h + y) * max_w) * elem;
            out.extend_from_slice(&data[start..start + width * elem]);
        }
    }
    Ok(TensorData {
        shape: vec![channels, height as u32, width as u32],
        dtype: t.dtype.clone(),
        payload: Some(Payload::Inline(out.freeze())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(shape: &[u32], dtype: &str, bytes: Vec<u8>) -> s::TensorData {
        s::TensorData {
            shape: shape.to_vec(),
            dtype: dtype.into(),
            data: bytes.into(),
        }
    }

    fn ints(shape: &[u32], values: &[i64]) -> s::TensorData {
        data(
            shape,
            "int64",
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    /// A batch of `pixels` (uint8 counting from 1 unless given) with `runs`
    /// placeholder runs of length 2.
    fn batch(
        pixels: s::TensorData,
        tensors: Vec<(&str, s::TensorData)>,
        runs: u32,
    ) -> MultimodalInputs {
        MultimodalInputs {
            pixel_values: Some(pixels),
            model_specific_tensors: tensors
                .into_iter()
                .map(|(k, t)| (k.to_owned(), t))
                .collect(),
            mm_placeholders: (0..runs)
                .map(|i| s::PlaceholderRange {
                    offset: 10 * i,
                    length: 2,
                })
                .collect(),
            im_token_id: Some(7),
            modalities: vec!["image".into()],
            ..MultimodalInputs::default()
        }
    }

    fn counting(n: usize) -> Vec<u8> {
        (1..=n).map(|i| i as u8).collect()
    }

    fn bytes(t: &TensorData) -> &[u8] {
        match &t.payload {
            Some(Payload::Inline(b)) => b,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn qwen_rows_go_by_their_grids() {
        let mm = batch(
            data(&[6, 2], "uint8", counting(12)),
            vec![("image_grid_thw", ints(&[2, 3], &[1, 1, 2, 1, 2, 2]))],
            2,
        );
        let items = cut(Layout::Qwen { merge: 2 }, &mm).unwrap().unwrap();
        let pixels: Vec<_> = items
            .iter()
            .map(|i| i.encoder_input.clone().unwrap())
            .collect();
        assert_eq!(
            (pixels[0].shape.clone(), pixels[1].shape.clone()),
            (vec![2, 2], vec![4, 2])
        );
        assert_eq!(bytes(&pixels[1]), &counting(12)[4..]);
        assert_eq!(
            items[1].model_specific_tensors["image_grid_thw"].shape,
            [1, 3]
        );
        assert_eq!(items[1].placeholders[0].offset, 10);
    }

    #[test]
    fn stacked_tiles_drop_their_padding_and_phi4_masks_follow() {
        // Two images of 2 and 1 crops of 2 bytes, the second padded.
        let mut pixels = counting(4);
        pixels.extend([9, 9, 0, 0]);
        let mask = data(&[2, 2, 1, 1], "uint8", vec![1, 1, 1, 1]);
        let mm = batch(
            data(&[2, 2, 2, 1, 1], "uint8", pixels),
            vec![
                ("image_attention_mask", mask),
                ("image_sizes", ints(&[2, 2], &[448, 448, 448, 448])),
                ("num_img_tokens", ints(&[2], &[2, 2])),
            ],
            2,
        );
        let items = cut(Layout::Phi4 { side: 1, patch: 1 }, &mm)
            .unwrap()
            .unwrap();
        let second = &items[1];
        assert_eq!(second.encoder_input.as_ref().unwrap().shape, [1, 2, 1, 1]);
        assert_eq!(bytes(second.encoder_input.as_ref().unwrap()), [9, 9]);
        assert_eq!(
            second.model_specific_tensors["image_attention_mask"].shape,
            [1, 1, 1]
        );
        assert_eq!(second.model_specific_tensors["num_img_tokens"].shape, [1]);
    }

    #[test]
    fn pixtral_images_are_cut_out_of_their_padding() {
        // [2, 1, 2, 2]: image 0 is 2×2, image 1 is 1×2 padded below.
        let mm = batch(
            data(&[2, 1, 2, 2], "uint8", vec![1, 2, 3, 4, 5, 6, 0, 0]),
            vec![("image_sizes", ints(&[2, 2], &[2, 2, 1, 2]))],
            3,
        );
        let items = cut(Layout::Pixtral { patch: 1 }, &mm).unwrap().unwrap();
        let second = items[1].encoder_input.as_ref().unwrap();
        assert_eq!(
            (second.shape.clone(), bytes(second)),
            (vec![1, 1, 2], &[5u8, 6][..])
        );
        let runs: Vec<usize> = items.iter().map(|i| i.placeholders.len()).collect();
        assert_eq!(runs, [2, 1], "a run per patch row");
    }

    #[test]
    fn a_batch_whose_runs_do_not_add_up_is_refused() {
        let mm = batch(data(&[2, 3, 1, 1], "uint8", counting(6)), vec![], 3);
        let status = cut(Layout::Clip { side: 1 }, &mm).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("placeholder runs"),
            "{}",
            status.message()
        );
        let missing = batch(data(&[2, 3, 1, 1], "uint8", counting(6)), vec![], 2);
        assert!(
            cut(Layout::Anyres { side: 1 }, &missing).is_err(),
            "no image_sizes"
        );
        let huge = ints(&[2, 3], &[i64::MAX, 2, 2, 1, 1, 1]);
        let overflow = batch(
            data(&[1, 2], "uint8", vec![1, 2]),
            vec![("image_grid_thw", huge)],
            2,
        );
        let status = cut(Layout::Qwen { merge: 2 }, &overflow).unwrap_err();
        assert!(
            status.message().contains("overflows"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn batches_without_per_image_counts_stay_whole() {
        let mm = batch(
            data(&[1, 3, 1, 1, 1], "uint8", counting(3)),
            vec![(
                "pixel_attention_mask",
                data(&[1, 3, 1, 1], "uint8", vec![1; 3]),
            )],
            3,
        );
        let items = cut(Layout::Idefics3 { side: 1 }, &mm).unwrap().unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].encoder_input.as_ref().unwrap().shape, [3, 1, 1, 1]);
        assert_eq!(
            items[0].model_specific_tensors["pixel_attention_mask"].shape,
            [3, 1, 1]
        );
        assert_eq!(cut(Layout::Unknown, &mm).unwrap(), None);
    }
}
