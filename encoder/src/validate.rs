//! Checking an EncodeRequest against the served model: each item's
//! dtype, shape, grid and size, and its room. [`check`] runs before any
//! payload is read (no shm file opened, no RDMA READ issued), on the
//! declared shapes and lengths alone; [`items`] builds the work once the
//! payloads are inline. An item whose `encoder_input` declares shape and
//! dtype but carries no payload asks for its embedding by content hash
//! (a recall, served from the embedding cache: [`EncodeItem::recall`]).

use std::collections::HashSet;

use bytes::Bytes;
use iris_proto::common::Modality;
use iris_proto::encoder::EncodeRequest;
use iris_proto::scheduler::{tensor_data::Payload, MultimodalItem, TensorData};
use iris_proto::tensor::{self, DType};
use tonic::Status;

use crate::compute::ImageInput;

/// The model's input geometry and the largest item taken.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Features per patch row: C·T·P·P.
    pub patch_dim: u32,
    /// Patches merged per side into one token.
    pub merge: u32,
    /// Most patches one item may have (`--max-patches-per-item`, and
    /// never above `--max-batch-patches`: no item is larger than a batch).
    pub max_patches: u64,
}

/// One validated item.
#[derive(Debug, Clone)]
pub struct EncodeItem {
    pub room: i64,
    pub content_hash: Bytes,
    /// Empty pixels for a recall.
    pub input: ImageInput,
    /// Sent without its pixels: served from the embedding cache or
    /// refused with NOT_FOUND, never computed.
    pub recall: bool,
}

/// What [`check_item`] establishes about an item.
struct Checked {
    dtype: DType,
    grid: [u32; 3],
}

/// Checks every item of `request` without reading any payload; the first
/// problem is the answer.
pub fn check(request: &EncodeRequest, geometry: Geometry) -> Result<(), Status> {
    assigned(request, geometry).map(|_| ())
}

/// Validates every item of `request` (payloads already inline) and builds
/// its work; the first problem is the answer.
pub fn items(request: &EncodeRequest, geometry: Geometry) -> Result<Vec<EncodeItem>, Status> {
    assigned(request, geometry)?
        .into_iter()
        .enumerate()
        .map(|(index, (room, item, checked))| {
            let recall = is_recall(item);
            let pixels = if recall {
                Bytes::new()
            } else {
                inline_pixels(item).map_err(|e| with_index(index, e))?
            };
            Ok(EncodeItem {
                recall,
                room,
                // A copy, not a slice: the request's `Bytes` fields share
                // one allocation with the inline tensor, and this hash
                // outlives the request (cache key, room) — a slice would
                // keep every tensor ever received alive.
                content_hash: Bytes::copy_from_slice(&item.content_hash),
                input: ImageInput {
                    pixels,
                    bf16: checked.dtype == DType::BFloat16,
                    grid: checked.grid,
                },
            })
        })
        .collect()
}

/// Each item with its room, checked.
fn assigned(
    request: &EncodeRequest,
    geometry: Geometry,
) -> Result<Vec<(i64, &MultimodalItem, Checked)>, Status> {
    let mm = request
        .mm_inputs
        .as_ref()
        .map(|m| m.items.as_slice())
        .unwrap_or_default();
    if mm.is_empty() {
        return Err(Status::invalid_argument(
            "EncodeRequest has no mm_inputs items",
        ));
    }
    if mm.len() != request.items.len() {
        return Err(Status::invalid_argument(format!(
            "EncodeRequest has {} mm items but {} room assignments; each item needs one",
            mm.len(),
            request.items.len()
        )));
    }
    let mut seen = HashSet::new();
    mm.iter()
        .zip(&request.items)
        .enumerate()
        .map(|(index, (item, assignment))| {
            let room = assignment.bootstrap_room;
            if room < 0 {
                return Err(Status::invalid_argument(format!(
                    "item {index}: room {room} is negative"
                )));
            }
            if !seen.insert(room) {
                return Err(Status::invalid_argument(format!(
                    "item {index}: room {room} is assigned twice"
                )));
            }
            let checked = check_item(item, geometry).map_err(|e| with_index(index, e))?;
            Ok((room, item, checked))
        })
        .collect()
}

fn with_index(index: usize, status: Status) -> Status {
    Status::new(status.code(), format!("item {index}: {}", status.message()))
}

fn check_item(item: &MultimodalItem, geometry: Geometry) -> Result<Checked, Status> {
    let grid_key = grid_key(item.modality)?;
    let tensor = item
        .encoder_input
        .as_ref()
        .ok_or_else(|| Status::invalid_argument("encoder_input is missing"))?;
    let checked = if tensor.payload.is_none() {
        DType::parse(&tensor.dtype).and_then(|d| tensor::byte_len(&tensor.shape, d).map(|_| d))
    } else {
        tensor::validate(tensor).map(|(dtype, _)| dtype)
    };
    let dtype = checked.map_err(|e| Status::invalid_argument(format!("encoder_input: {e}")))?;
    let patches = check_shape(tensor, dtype, geometry)?;
    let grid = grid(item, grid_key)?;
    check_grid(grid, patches, geometry, grid_key)?;
    Ok(Checked { dtype, grid })
}

/// The key of an item's `[t, h, w]` grid for its modality: images
/// (unspecified means image) and videos, whose grid has one temporal
/// patch per `temporal_patch_size` frames.
fn grid_key(modality: i32) -> Result<&'static str, Status> {
    match Modality::try_from(modality).unwrap_or(Modality::Unspecified) {
        Modality::Image | Modality::Unspecified => Ok("image_grid_thw"),
        Modality::Video => Ok("video_grid_thw"),
        other => Err(Status::invalid_argument(format!(
            "modality {other:?} is not supported; this encoder takes images and videos"
        ))),
    }
}

/// Whether the item asks for its embedding by content hash: an
/// `encoder_input` without a payload.
pub fn is_recall(item: &MultimodalItem) -> bool {
    item.encoder_input
        .as_ref()
        .is_some_and(|t| t.payload.is_none())
}

fn inline_pixels(item: &MultimodalItem) -> Result<Bytes, Status> {
    match item.encoder_input.as_ref().and_then(|t| t.payload.as_ref()) {
        Some(Payload::Inline(bytes)) => Ok(bytes.clone()),
        _ => Err(Status::invalid_argument(
            "encoder_input must be resolved to inline bytes before validation",
        )),
    }
}

fn check_shape(tensor: &TensorData, dtype: DType, geometry: Geometry) -> Result<u32, Status> {
    if !matches!(dtype, DType::Float32 | DType::BFloat16) {
        return Err(Status::invalid_argument(format!(
            "encoder_input dtype {} is not accepted; send float32 or bfloat16",
            dtype.as_str()
        )));
    }
    let patches = match tensor.shape.as_slice() {
        [n, d] if *d == geometry.patch_dim && *n > 0 => *n,
        shape => {
            return Err(Status::invalid_argument(format!(
                "encoder_input shape {shape:?} does not fit this model: expected [patches, {}]",
                geometry.patch_dim
            )))
        }
    };
    if u64::from(patches) > geometry.max_patches {
        return Err(Status::invalid_argument(format!(
            "encoder_input has {patches} patches, more than this encoder takes per item ({}: --max-patches-per-item, at most --max-batch-patches)",
            geometry.max_patches
        )));
    }
    Ok(patches)
}

fn grid(item: &MultimodalItem, key: &str) -> Result<[u32; 3], Status> {
    let tensor = item.model_specific_tensors.get(key).ok_or_else(|| {
        Status::invalid_argument(format!("model_specific_tensors[\"{key}\"] is missing"))
    })?;
    let values = tensor::read_int64(tensor)
        .ok_or_else(|| Status::invalid_argument(format!("{key} must be an inline int64 tensor")))?;
    match values.as_slice() {
        [t, h, w]
            if [t, h, w]
                .iter()
                .all(|v| (1..=i64::from(u32::MAX)).contains(*v)) =>
        {
            Ok([*t as u32, *h as u32, *w as u32])
        }
        other => Err(Status::invalid_argument(format!(
            "{key} must hold three positive values [t, h, w], got {other:?}"
        ))),
    }
}

fn check_grid(grid: [u32; 3], patches: u32, geometry: Geometry, key: &str) -> Result<(), Status> {
    let product: u64 = grid.iter().map(|&d| u64::from(d)).product();
    if product != u64::from(patches) {
        return Err(Status::invalid_argument(format!(
            "{key} {grid:?} has {product} patches but encoder_input has {patches} rows"
        )));
    }
    let merge = geometry.merge.max(1);
    if !grid[1].is_multiple_of(merge) || !grid[2].is_multiple_of(merge) {
        return Err(Status::invalid_argument(format!(
            "{key} {grid:?}: h and w must be multiples of the merge size {merge}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use iris_proto::encoder::EncodeItemAssignment;
    use iris_proto::scheduler::MultimodalInputs;
    use prost::Message;

    use super::*;

    const GEOMETRY: Geometry = Geometry {
        patch_dim: 4,
        merge: 2,
        max_patches: 4,
    };

    /// A valid one-item request, encoded and decoded the way the server
    /// receives it: every `Bytes` field then points into one buffer.
    fn received_request() -> (Bytes, EncodeRequest) {
        let item = MultimodalItem {
            encoder_input: Some(tensor::inline(
                vec![4, 4],
                DType::Float32,
                Bytes::from(vec![0u8; 64]),
            )),
            content_hash: Bytes::from(vec![7u8; 32]),
            model_specific_tensors: [(
                "image_grid_thw".to_owned(),
                tensor::int64(vec![3], &[1, 2, 2]),
            )]
            .into(),
            ..MultimodalItem::default()
        };
        let request = EncodeRequest {
            request_id: "r".into(),
            mm_inputs: Some(MultimodalInputs { items: vec![item] }),
            items: vec![EncodeItemAssignment { bootstrap_room: 5 }],
        };
        let wire = Bytes::from(request.encode_to_vec());
        let decoded = EncodeRequest::decode(wire.clone()).unwrap();
        (wire, decoded)
    }

    fn within(inner: &Bytes, outer: &Bytes) -> bool {
        let range = outer.as_ptr_range();
        range.contains(&inner.as_ptr())
    }

    #[test]
    fn a_valid_item_is_accepted() {
        let (_, request) = received_request();
        let items = items(&request, GEOMETRY).unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].room, 5);
        assert_eq!(items[0].input.grid, [1, 2, 2]);
        assert_eq!(&items[0].content_hash[..], &[7u8; 32][..]);
    }

    /// The content hash outlives the request (embedding-cache key, room):
    /// it must not be a slice of the received buffer, or each cached hash
    /// keeps a whole inline tensor alive (an encoder grew to 23 GB that way).
    #[test]
    fn the_content_hash_does_not_pin_the_request_buffer() {
        let (wire, request) = received_request();
        let received_hash = &request.mm_inputs.as_ref().unwrap().items[0].content_hash;
        assert!(within(received_hash, &wire), "the premise: decoding slices");
        let items = items(&request, GEOMETRY).unwrap();
        assert!(!within(&items[0].content_hash, &wire));
    }

    /// An item above the per-item patch limit is refused by the check that
    /// runs before any payload is read.
    #[test]
    fn an_item_above_the_patch_limit_is_refused() {
        let (_, request) = received_request();
        let small = Geometry {
            max_patches: 3,
            ..GEOMETRY
        };
        let status = check(&request, small).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().starts_with(
                "item 0: encoder_input has 4 patches, more than this encoder takes per item (3"
            ),
            "{}",
            status.message()
        );
        assert!(check(&request, GEOMETRY).is_ok());
    }

    /// The pre-I/O check takes a shm handle on its declared shape and
    /// length: a wrong shape or a length that disagrees with it is refused
    /// before the file would be opened; a right one passes.
    #[test]
    fn handles_are_checked_on_their_declared_shape_and_length() {
        let (_, mut request) = received_request();
        let handle = |nbytes| {
            Some(Payload::Shm(iris_proto::common::ShmHandle {
                name: "iris-tensor-1-00".into(),
                offset: 0,
                nbytes,
                owner_id: String::new(),
            }))
        };
        let tensor = |r: &mut EncodeRequest| {
            r.mm_inputs.as_mut().unwrap().items[0]
                .encoder_input
                .as_mut()
                .unwrap()
                .clone()
        };
        let set = |r: &mut EncodeRequest, t: TensorData| {
            r.mm_inputs.as_mut().unwrap().items[0].encoder_input = Some(t);
        };
        let mut t = tensor(&mut request);
        t.payload = handle(64);
        set(&mut request, t.clone());
        assert!(check(&request, GEOMETRY).is_ok());
        t.payload = handle(1 << 30);
        set(&mut request, t.clone());
        assert!(check(&request, GEOMETRY).is_err(), "length off the shape");
        t.payload = handle(64);
        t.shape = vec![2, 8];
        set(&mut request, t);
        let status = check(&request, GEOMETRY).unwrap_err();
        assert!(
            status.message().contains("does not fit this model"),
            "{}",
            status.message()
        );
    }

    /// A video item carries its grid under `video_grid_thw` (several
    /// temporal patches); audio is refused, and so is a video whose grid
    /// sits under the image key.
    #[test]
    fn videos_are_checked_on_their_own_grid_key() {
        let (_, mut request) = received_request();
        fn item(r: &mut EncodeRequest) -> &mut MultimodalItem {
            &mut r.mm_inputs.as_mut().unwrap().items[0]
        }
        item(&mut request).modality = Modality::Video as i32;
        let status = check(&request, GEOMETRY).unwrap_err();
        assert!(
            status
                .message()
                .contains("model_specific_tensors[\"video_grid_thw\"] is missing"),
            "{}",
            status.message()
        );
        let grid = tensor::int64(vec![3], &[2, 2, 2]);
        item(&mut request).encoder_input.as_mut().unwrap().shape = vec![8, 4];
        item(&mut request).encoder_input.as_mut().unwrap().payload =
            Some(Payload::Inline(Bytes::from(vec![0u8; 128])));
        item(&mut request)
            .model_specific_tensors
            .insert("video_grid_thw".to_owned(), grid);
        let big = Geometry {
            max_patches: 8,
            ..GEOMETRY
        };
        let items = items(&request, big).unwrap();
        assert_eq!(items[0].input.grid, [2, 2, 2]);
        item(&mut request).modality = Modality::Audio as i32;
        let status = check(&request, big).unwrap_err();
        assert!(
            status.message().contains("takes images and videos"),
            "{}",
            status.message()
        );
    }
}
