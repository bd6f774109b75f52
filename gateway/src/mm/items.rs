//! Prompt assembly for images: the chat template renders one image token
//! per image; each is expanded to the image's token count, and each image
//! becomes a `MultimodalItem` with its tensors, content hash, placeholder
//! range and placeholder token id. Items are built from the images'
//! layouts, before their pixels are ready; [`fill_pixels`] puts each
//! image's tensor in once it is.

use std::collections::HashMap;

use iris_openai::ApiError;
use iris_proto::common::Modality;
use iris_proto::scheduler::tensor_data::Payload;
use iris_proto::scheduler::{MultimodalInputs, MultimodalItem, PlaceholderRange, TensorData};
use iris_proto::tensor;

use super::pixels::{ImageLayout, PixelEntry};

/// Expands each occurrence of `image_token` in `ids` to `counts[i]` copies
/// (in order). The number of occurrences must equal the number of images:
/// anything else means the template and the request disagree, a client
/// error rather than a garbled prompt.
pub fn expand_placeholders(
    ids: &[u32],
    image_token: u32,
    counts: &[usize],
) -> Result<(Vec<u32>, Vec<PlaceholderRange>), ApiError> {
    let found = ids.iter().filter(|&&t| t == image_token).count();
    if found != counts.len() {
        return Err(ApiError::bad_field(
            "messages",
            format!(
                "the rendered prompt has {found} image placeholder(s) (token id {image_token}) but the request carries {} image(s); the chat template or the message text does not match the images",
                counts.len()
            ),
        ));
    }
    let extra: usize = counts.iter().map(|c| c.saturating_sub(1)).sum();
    let mut expanded = Vec::with_capacity(ids.len() + extra);
    let mut ranges = Vec::with_capacity(counts.len());
    let mut next = counts.iter();
    for &id in ids {
        if id != image_token {
            expanded.push(id);
            continue;
        }
        let count = next.next().copied().unwrap_or(1);
        ranges.push(PlaceholderRange {
            offset: offset(expanded.len())?,
            length: offset(count)?,
        });
        expanded.resize(expanded.len() + count, image_token);
    }
    Ok((expanded, ranges))
}

fn offset(value: usize) -> Result<u32, ApiError> {
    u32::try_from(value)
        .map_err(|_| ApiError::bad_request("the prompt is too long for placeholder offsets"))
}

/// The request's `mm_inputs`: one item per image, its tensor's shape and
/// dtype but not yet its pixels ([`fill_pixels`]).
pub fn multimodal_inputs<'a>(
    images: impl IntoIterator<Item = &'a ImageLayout>,
    ranges: Vec<PlaceholderRange>,
    image_token: u32,
) -> MultimodalInputs {
    let items = images
        .into_iter()
        .zip(ranges)
        .map(|(image, range)| item(image, range, image_token))
        .collect();
    MultimodalInputs { items }
}

/// `item` with `entry`'s pixels inline.
pub fn fill_pixels(item: &mut MultimodalItem, entry: &PixelEntry) {
    if let Some(tensor) = item.encoder_input.as_mut() {
        tensor.payload = Some(Payload::Inline(entry.pixels.clone()));
    }
}

fn item(image: &ImageLayout, range: PlaceholderRange, image_token: u32) -> MultimodalItem {
    let mut specific: HashMap<String, TensorData> = HashMap::new();
    if let Some(grid) = image.grid {
        let thw: Vec<i64> = grid.iter().map(|&v| i64::from(v)).collect();
        specific.insert("image_grid_thw".to_owned(), tensor::int64(vec![1, 3], &thw));
    }
    MultimodalItem {
        modality: Modality::Image as i32,
        content_hash: image.content_hash.clone(),
        encoder_input: Some(TensorData {
            shape: image.shape.clone(),
            dtype: image.dtype.as_str().to_owned(),
            payload: None,
        }),
        model_specific_tensors: specific,
        placeholders: vec![range],
        placeholder_token_id: Some(image_token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMG: u32 = 646;

    #[test]
    fn expands_each_placeholder_to_its_count() {
        let ids = [641, 1, 643, IMG, 644, 2, 643, IMG, 644, 642];
        let (expanded, ranges) = expand_placeholders(&ids, IMG, &[3, 2]).unwrap();
        assert_eq!(
            expanded,
            vec![641, 1, 643, IMG, IMG, IMG, 644, 2, 643, IMG, IMG, 644, 642]
        );
        let ranges: Vec<(u32, u32)> = ranges.iter().map(|r| (r.offset, r.length)).collect();
        assert_eq!(ranges, vec![(3, 3), (9, 2)]);
    }

    #[test]
    fn a_count_mismatch_is_a_clear_client_error() {
        let ids = [1, IMG, 2];
        let err = expand_placeholders(&ids, IMG, &[4, 4]).unwrap_err();
        assert_eq!(err.status, 400);
        assert!(
            err.message.contains("1 image placeholder"),
            "{}",
            err.message
        );
        assert!(expand_placeholders(&[1, 2], IMG, &[4]).is_err());
        let (same, ranges) = expand_placeholders(&[1, 2], IMG, &[]).unwrap();
        assert_eq!((same, ranges.len()), (vec![1, 2], 0));
    }
}
