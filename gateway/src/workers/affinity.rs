//! The routing keys of images and videos: each item's content hash folded
//! to a 64-bit key ([`affinity_key`]) and its cost in patches
//! ([`item_patches`]: the t·h·w of its grid), so a 4K image weighs ≈ 4× a
//! 1080p one and a thumbnail almost nothing. Encoders' load is counted in
//! patches in flight, and the encode policy
//! ([`super::policy::ConsistentHashing`] by default) places each image by
//! its key.

use iris_proto::scheduler::MultimodalItem;
use iris_proto::tensor::read_int64;

use super::policy::{ItemKey, RouteKey};

/// One image to place: its affinity key and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageCost {
    /// The content hash folded by [`affinity_key`].
    pub key: u64,
    /// Patches (at least 1).
    pub patches: u64,
}

impl ImageCost {
    /// The key and patch count of an item the gateway built.
    pub fn of(item: &MultimodalItem) -> ImageCost {
        ImageCost {
            key: affinity_key(&item.content_hash),
            patches: item_patches(item),
        }
    }

    /// Its key as routing sees it (an encode pick knows no token span).
    pub fn item_key(&self) -> ItemKey {
        ItemKey {
            key: self.key,
            span: 0..0,
            hash: bytes::Bytes::new(),
        }
    }

    /// The encode pick's key for it, `item` being [`Self::item_key`].
    pub fn route_key<'a>(&self, item: &'a ItemKey) -> RouteKey<'a> {
        RouteKey {
            tokens: &[],
            items: std::slice::from_ref(item),
            cost: self.patches,
            suspects: &[],
            adapter: 0,
        }
    }
}

/// An item's patch count: the product of its `image_grid_thw` (a video's
/// `video_grid_thw`), else the first dimension of its pixels
/// (`[patches, C·T·P·P]`), at least 1.
pub fn item_patches(item: &MultimodalItem) -> u64 {
    let grids = &item.model_specific_tensors;
    let from_grid = grids
        .get("image_grid_thw")
        .or_else(|| grids.get("video_grid_thw"))
        .and_then(read_int64)
        .filter(|thw| thw.len() == 3 && thw.iter().all(|&d| d > 0))
        .map(|thw| {
            thw.iter()
                .map(|&d| d as u64)
                .fold(1u64, u64::saturating_mul)
        });
    let from_shape = || {
        item.encoder_input
            .as_ref()
            .and_then(|t| t.shape.first())
            .map(|&p| u64::from(p))
    };
    from_grid.or_else(from_shape).unwrap_or(1).max(1)
}

/// Folds a content hash (any length) to the 64-bit affinity key.
pub fn affinity_key(content_hash: &[u8]) -> u64 {
    content_hash
        .iter()
        .take(8)
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOUR_K: u64 = 42_196;

    #[test]
    fn patches_come_from_the_grid_else_the_pixels() {
        use iris_proto::tensor::{inline, int64, DType};
        let mut item = MultimodalItem {
            encoder_input: Some(inline(
                vec![24, 4],
                DType::BFloat16,
                bytes::Bytes::from(vec![0u8; 24 * 4 * 2]),
            )),
            ..Default::default()
        };
        assert_eq!(item_patches(&item), 24);
        item.model_specific_tensors
            .insert("image_grid_thw".into(), int64(vec![1, 3], &[1, 154, 274]));
        assert_eq!(item_patches(&item), FOUR_K);
        assert_eq!(item_patches(&MultimodalItem::default()), 1);
        let mut video = MultimodalItem::default();
        video
            .model_specific_tensors
            .insert("video_grid_thw".into(), int64(vec![1, 3], &[8, 36, 64]));
        assert_eq!(item_patches(&video), 8 * 36 * 64);
    }

    #[test]
    fn affinity_key_reads_the_leading_bytes() {
        assert_eq!(affinity_key(&[1, 2]), 0x0102);
        assert_eq!(affinity_key(&[0xff; 32]), u64::MAX);
    }
}
