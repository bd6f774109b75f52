//! Prompt assembly for images: the chat template renders one mark per
//! image; for the families whose prompts need more than the image token
//! repeated, each mark is first rewritten in the rendered text with the
//! image's structure ([`expand_image_marks`], the vision crate's
//! [`iris_vision::placeholders`]). After tokenizing, each of the image's
//! runs of image tokens (one token in the text) is expanded to its length,
//! and each image becomes a `MultimodalItem` with its tensors, content
//! hash, placeholder ranges and placeholder token id. Items are built from
//! the images' layouts, before their pixels are ready; [`fill_pixels`]
//! puts each image's tensor in once it is.

use std::collections::HashMap;

use bytes::Bytes;
use iris_openai::ApiError;
use iris_proto::common::Modality;
use iris_proto::scheduler::tensor_data::Payload;
use iris_proto::scheduler::{MultimodalInputs, MultimodalItem, PlaceholderRange, TensorData};
use iris_proto::tensor::{self, DType};
use iris_vision::ItemValues;

use super::pixels::{ItemLayout, PixelEntry};

/// The rendered prompt's media marks, rewritten before tokenizing: the
/// `n`-th occurrence of `mark` becomes `replacements[n]` (`None`: it
/// stays). `None` when the text has fewer marks than replacements;
/// otherwise the text and whether marks remain after the last one.
pub fn rewrite_marks(
    text: &str,
    mark: &str,
    replacements: &[Option<&str>],
) -> Option<(String, bool)> {
    let extra: usize = replacements.iter().flatten().map(|r| r.len()).sum();
    let mut out = String::with_capacity(text.len() + extra);
    let mut rest = text;
    for replacement in replacements {
        let at = rest.find(mark)?;
        out.push_str(&rest[..at]);
        out.push_str(replacement.unwrap_or(mark));
        rest = &rest[at + mark.len()..];
    }
    out.push_str(rest);
    Some((out, rest.contains(mark)))
}

/// Each image's mark in the rendered prompt (in order) becomes its
/// expansion ([`ItemLayout::expansion`]), as the family's Hugging Face
/// processor rewrites the text before tokenizing it. Images without one
/// (the image token repeated) leave the text as it is. A prompt with
/// fewer or more marks than images is the client's error, as it is the
/// reference processor's.
pub fn expand_image_marks(text: String, items: &[ItemLayout]) -> Result<String, ApiError> {
    let images: Vec<&ItemLayout> = items
        .iter()
        .filter(|i| i.modality == Modality::Image)
        .collect();
    let Some(mark) = images
        .iter()
        .find_map(|i| i.expansion.as_ref())
        .map(|e| e.mark)
    else {
        return Ok(text);
    };
    let replacements: Vec<Option<&str>> = images
        .iter()
        .map(|i| i.expansion.as_ref().map(|e| e.text.as_str()))
        .collect();
    match rewrite_marks(&text, mark, &replacements) {
        Some((out, false)) => Ok(out),
        found => Err(ApiError::bad_field(
            "messages",
            format!(
                "the rendered prompt has {} image marks ({mark}) than the request has images ({}); the chat template or the message text does not match them",
                if found.is_some() { "more" } else { "fewer" },
                images.len()
            ),
        )),
    }
}

/// The placeholder token the chat template renders once per item of each
/// modality (config.json's `image_token_id` and `video_token_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholders {
    pub image: u32,
    /// `None`: the model takes no videos.
    pub video: Option<u32>,
}

impl Placeholders {
    /// The token of `modality`'s items.
    pub fn token(&self, modality: Modality) -> Option<u32> {
        match modality {
            Modality::Video => self.video,
            _ => Some(self.image),
        }
    }

    /// Each modality with its token and its items' token counts, in order.
    fn runs(&self, items: &[ItemLayout]) -> Vec<(Modality, u32, Vec<usize>)> {
        let mut runs = vec![(Modality::Image, self.image, Vec::new())];
        if let Some(video) = self.video {
            runs.push((Modality::Video, video, Vec::new()));
        }
        for (index, item) in items.iter().enumerate() {
            if let Some(run) = runs.iter_mut().find(|(m, _, _)| *m == item.modality) {
                run.2.push(index);
            }
        }
        runs
    }
}

/// Expands the placeholder tokens of each item (in order, per modality;
/// an item of several groups takes that many) to its token count; returns
/// the ids and each item's ranges, in item order. The number of
/// occurrences of each modality's token must equal the number its items
/// take: anything else means the template and the request disagree, a
/// client error rather than a garbled prompt.
pub fn expand_placeholders(
    ids: &[u32],
    placeholders: Placeholders,
    items: &[ItemLayout],
) -> Result<(Vec<u32>, Vec<Vec<PlaceholderRange>>), ApiError> {
    let runs = placeholders.runs(items);
    if let Some(item) = items
        .iter()
        .find(|i| placeholders.token(i.modality).is_none())
    {
        return Err(ApiError::bad_field(
            "messages",
            format!("this model takes no {} inputs", kind(item.modality)),
        ));
    }
    for (modality, token, members) in &runs {
        let found = ids.iter().filter(|&&t| t == *token).count();
        let wanted: usize = members.iter().map(|&i| items[i].groups).sum();
        if found != wanted {
            let kind = kind(*modality);
            return Err(ApiError::bad_field(
                "messages",
                format!(
                    "the rendered prompt has {found} {kind} placeholder(s) (token id {token}) but the request's {} {kind}(s) need {wanted}; the chat template or the message text does not match them",
                    members.len()
                ),
            ));
        }
    }
    let extra: usize = items
        .iter()
        .map(|i| i.tokens.saturating_sub(i.groups))
        .sum();
    let mut expanded = Vec::with_capacity(ids.len() + extra);
    let mut ranges = vec![Vec::new(); items.len()];
    // Per token: the item indices in order, each repeated once per group.
    let mut next: Vec<(u32, std::vec::IntoIter<usize>)> = runs
        .iter()
        .map(|(_, token, members)| {
            let slots: Vec<usize> = members
                .iter()
                .flat_map(|&i| std::iter::repeat_n(i, items[i].groups))
                .collect();
            (*token, slots.into_iter())
        })
        .collect();
    for &id in ids {
        let Some(index) = next
            .iter_mut()
            .find(|(token, _)| *token == id)
            .and_then(|(_, slots)| slots.next())
        else {
            expanded.push(id);
            continue;
        };
        let count = items[index].tokens / items[index].groups.max(1);
        ranges[index].push(PlaceholderRange {
            offset: offset(expanded.len())?,
            length: offset(count)?,
        });
        expanded.resize(expanded.len() + count, id);
    }
    Ok((expanded, ranges))
}

/// How messages name a modality.
fn kind(modality: Modality) -> &'static str {
    match modality {
        Modality::Video => "video",
        _ => "image",
    }
}

fn offset(value: usize) -> Result<u32, ApiError> {
    u32::try_from(value)
        .map_err(|_| ApiError::bad_request("the prompt is too long for placeholder offsets"))
}

/// The request's `mm_inputs`: one item per image or video, its tensor's
/// shape and dtype but not yet its pixels ([`fill_pixels`]).
pub fn multimodal_inputs(
    items: &[ItemLayout],
    ranges: Vec<Vec<PlaceholderRange>>,
    placeholders: Placeholders,
) -> MultimodalInputs {
    let items = items
        .iter()
        .zip(ranges)
        .map(|(layout, range)| {
            let token = placeholders
                .token(layout.modality)
                .unwrap_or(placeholders.image);
            item(layout, range, token)
        })
        .collect();
    MultimodalInputs { items }
}

/// `item` with `entry`'s pixels inline.
pub fn fill_pixels(item: &mut MultimodalItem, entry: &PixelEntry) {
    if let Some(tensor) = item.encoder_input.as_mut() {
        tensor.payload = Some(Payload::Inline(entry.pixels.clone()));
    }
}

fn item(image: &ItemLayout, ranges: Vec<PlaceholderRange>, image_token: u32) -> MultimodalItem {
    let mut specific: HashMap<String, TensorData> = HashMap::new();
    if let Some(grid) = image.grid {
        let thw: Vec<i64> = grid.iter().map(|&v| i64::from(v)).collect();
        specific.insert(image.grid_key().to_owned(), tensor::int64(vec![1, 3], &thw));
    }
    if let Some(sizes) = image.image_sizes {
        let hw: Vec<i64> = sizes.iter().map(|&v| i64::from(v)).collect();
        specific.insert("image_sizes".to_owned(), tensor::int64(vec![1, 2], &hw));
    }
    for extra in &image.tensors {
        specific.insert(extra.name.to_owned(), item_tensor(extra));
    }
    if let Some(seconds) = image.second_per_grid {
        specific.insert(
            "second_per_grid_ts".to_owned(),
            tensor::float32(vec![1], &[seconds]),
        );
    }
    MultimodalItem {
        modality: image.modality as i32,
        content_hash: image.content_hash.clone(),
        encoder_input: Some(TensorData {
            shape: image.shape.clone(),
            dtype: image.dtype.as_str().to_owned(),
            payload: None,
        }),
        model_specific_tensors: specific,
        placeholders: ranges,
        placeholder_token_id: Some(image_token),
    }
}

/// A family's item tensor on the wire, in its type.
fn item_tensor(extra: &iris_vision::ItemTensor) -> TensorData {
    let shape = extra.shape.iter().map(|&d| d as u32).collect();
    match &extra.values {
        ItemValues::Int64(values) => tensor::int64(shape, values),
        ItemValues::Float32(values) => tensor::float32(shape, values),
        ItemValues::UInt8(values) => {
            tensor::inline(shape, DType::UInt8, Bytes::from_owner(values.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMG: u32 = 646;
    const VID: u32 = 647;
    const TOKENS: Placeholders = Placeholders {
        image: IMG,
        video: Some(VID),
    };

    fn flat(ranges: &[Vec<PlaceholderRange>]) -> Vec<(u32, u32)> {
        ranges
            .iter()
            .flatten()
            .map(|r| (r.offset, r.length))
            .collect()
    }

    /// A Qwen3-VL video of two temporal groups takes two placeholders,
    /// each expanded to half its tokens, as one item with two ranges.
    #[test]
    fn a_grouped_video_takes_one_placeholder_per_group() {
        let video = ItemLayout {
            groups: 2,
            ..layout(Modality::Video, 6)
        };
        let ids = [1, VID, 2, VID, 3];
        let (expanded, ranges) =
            expand_placeholders(&ids, TOKENS, std::slice::from_ref(&video)).unwrap();
        assert_eq!(expanded, vec![1, VID, VID, VID, 2, VID, VID, VID, 3]);
        assert_eq!(ranges.len(), 1);
        assert_eq!(flat(&ranges), vec![(1, 3), (5, 3)]);
        let err = expand_placeholders(&[1, VID], TOKENS, &[video]).unwrap_err();
        assert!(err.message.contains("need 2"), "{}", err.message);
    }

    /// A family's item tensors (Llama 4's, a Phi-4 mask, an Idefics3 pixel
    /// mask) travel under their names, shapes, types and values.
    #[test]
    fn item_tensors_become_model_specific_tensors() {
        let image = ItemLayout {
            grid: None,
            tensors: vec![
                iris_vision::ItemTensor::ints("aspect_ratios", vec![1, 2], &[2, 3]),
                iris_vision::ItemTensor::ints("patches_per_image", vec![1], &[7]),
                iris_vision::ItemTensor::floats("image_attention_mask", vec![1, 1, 2], &[1, 0]),
                iris_vision::ItemTensor::mask("pixel_attention_mask", vec![1, 1, 2], vec![1, 0]),
            ],
            ..layout(Modality::Image, 2)
        };
        let inputs = multimodal_inputs(&[image], vec![Vec::new()], TOKENS);
        let specific = &inputs.items[0].model_specific_tensors;
        let ratios = &specific["aspect_ratios"];
        assert_eq!(
            (ratios.shape.as_slice(), ratios.dtype.as_str()),
            (&[1, 2][..], "int64")
        );
        assert_eq!(iris_proto::tensor::read_int64(ratios), Some(vec![2, 3]));
        let patches = &specific["patches_per_image"];
        assert_eq!(patches.shape, [1]);
        assert_eq!(iris_proto::tensor::read_int64(patches), Some(vec![7]));
        let mask = &specific["image_attention_mask"];
        assert_eq!(
            (mask.shape.as_slice(), mask.dtype.as_str()),
            (&[1, 1, 2][..], "float32")
        );
        let ones_zero: Vec<u8> = [1.0f32, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            mask.payload,
            Some(iris_proto::scheduler::tensor_data::Payload::Inline(
                ones_zero.into()
            ))
        );
        let pixel_mask = &specific["pixel_attention_mask"];
        assert_eq!(
            (pixel_mask.shape.as_slice(), pixel_mask.dtype.as_str()),
            (&[1, 1, 2][..], "uint8")
        );
        assert_eq!(
            pixel_mask.payload,
            Some(iris_proto::scheduler::tensor_data::Payload::Inline(
                vec![1u8, 0].into()
            ))
        );
    }

    /// A LLaVA-NeXT image's item carries its `image_sizes` row (the
    /// model unpads its tiles' features with it), and no grid.
    #[test]
    fn an_any_resolution_image_carries_its_size() {
        let image = ItemLayout {
            grid: None,
            image_sizes: Some([480, 640]),
            ..layout(Modality::Image, 2)
        };
        let inputs = multimodal_inputs(&[image], vec![Vec::new()], TOKENS);
        let specific = &inputs.items[0].model_specific_tensors;
        assert!(!specific.contains_key("image_grid_thw"));
        let sizes = &specific["image_sizes"];
        assert_eq!(sizes.shape, [1, 2]);
        assert_eq!(sizes.dtype, "int64");
        let Some(Payload::Inline(bytes)) = &sizes.payload else {
            panic!("inline sizes");
        };
        let hw: Vec<i64> = bytes
            .chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(hw, [480, 640]);
    }

    /// An image of two runs of 3 tokens whose mark `<m>` becomes `[`,
    /// a run, `|`, a run, `]`.
    fn expanded_image() -> ItemLayout {
        ItemLayout {
            groups: 2,
            expansion: Some(iris_vision::Expansion {
                mark: "<m>",
                text: format!("[{IMG_TEXT}|{IMG_TEXT}]"),
            }),
            ..layout(Modality::Image, 6)
        }
    }

    const IMG_TEXT: &str = "<img>";

    /// Each image's mark is rewritten in order; a mark too many or too
    /// few is a client error; images without an expansion leave the text.
    #[test]
    fn image_marks_become_their_expansions() {
        let two = [expanded_image(), expanded_image()];
        let out = expand_image_marks("a<m>b<m>c".to_owned(), &two).unwrap();
        assert_eq!(out, "a[<img>|<img>]b[<img>|<img>]c");
        let err = expand_image_marks("a<m>b".to_owned(), &two).unwrap_err();
        assert!(err.message.contains("fewer image marks"), "{}", err.message);
        let err = expand_image_marks("<m><m><m>".to_owned(), &two).unwrap_err();
        assert!(err.message.contains("more image marks"), "{}", err.message);
        let plain = [layout(Modality::Image, 3)];
        assert_eq!(
            expand_image_marks("a<m>".to_owned(), &plain).unwrap(),
            "a<m>"
        );
        // After tokenizing, each run's one token takes the run's length.
        let ids = [1, IMG, 2, IMG, 3];
        let (expanded, ranges) = expand_placeholders(&ids, TOKENS, &two[..1]).unwrap();
        assert_eq!(expanded, vec![1, IMG, IMG, IMG, 2, IMG, IMG, IMG, 3]);
        assert_eq!(flat(&ranges), vec![(1, 3), (5, 3)]);
    }

    fn layout(modality: Modality, tokens: usize) -> ItemLayout {
        ItemLayout {
            modality,
            ..crate::mm::pending::testing::layout(tokens, 1)
        }
    }

    #[test]
    fn expands_each_placeholder_to_its_count() {
        let ids = [641, 1, 643, IMG, 644, 2, 643, IMG, 644, 642];
        let items = [layout(Modality::Image, 3), layout(Modality::Image, 2)];
        let (expanded, ranges) = expand_placeholders(&ids, TOKENS, &items).unwrap();
        assert_eq!(
            expanded,
            vec![641, 1, 643, IMG, IMG, IMG, 644, 2, 643, IMG, IMG, 644, 642]
        );
        assert_eq!(flat(&ranges), vec![(3, 3), (9, 2)]);
    }

    /// Images and videos interleave: each token takes the next item of its
    /// own modality, and ranges come back in item order.
    #[test]
    fn images_and_videos_expand_in_their_own_order() {
        let ids = [1, VID, 2, IMG, 3, VID, 4];
        let items = [
            layout(Modality::Image, 2),
            layout(Modality::Video, 3),
            layout(Modality::Video, 1),
        ];
        let (expanded, ranges) = expand_placeholders(&ids, TOKENS, &items).unwrap();
        assert_eq!(expanded, vec![1, VID, VID, VID, 2, IMG, IMG, 3, VID, 4]);
        assert_eq!(flat(&ranges), vec![(5, 2), (1, 3), (8, 1)]);
        let inputs = multimodal_inputs(
            &items,
            expand_placeholders(&ids, TOKENS, &items).unwrap().1,
            TOKENS,
        );
        let video = &inputs.items[1];
        assert_eq!(video.modality, Modality::Video as i32);
        assert_eq!(video.placeholder_token_id, Some(VID));
        assert!(video.model_specific_tensors.contains_key("video_grid_thw"));
        assert_eq!(inputs.items[0].placeholder_token_id, Some(IMG));
    }

    #[test]
    fn a_count_mismatch_is_a_clear_client_error() {
        let ids = [1, IMG, 2];
        let two = [layout(Modality::Image, 4), layout(Modality::Image, 4)];
        let err = expand_placeholders(&ids, TOKENS, &two).unwrap_err();
        assert_eq!(err.status, 400);
        assert!(
            err.message.contains("1 image placeholder"),
            "{}",
            err.message
        );
        assert!(expand_placeholders(&[1, 2], TOKENS, &two[..1]).is_err());
        let err = expand_placeholders(&[1, VID], TOKENS, &[]).unwrap_err();
        assert!(
            err.message.contains("1 video placeholder"),
            "{}",
            err.message
        );
        let (same, ranges) = expand_placeholders(&[1, 2], TOKENS, &[]).unwrap();
        assert_eq!((same, ranges.len()), (vec![1, 2], 0));
        let no_video = Placeholders {
            video: None,
            ..TOKENS
        };
        let err =
            expand_placeholders(&[1, VID], no_video, &[layout(Modality::Video, 1)]).unwrap_err();
        assert!(err.message.contains("takes no video"), "{}", err.message);
    }
}
