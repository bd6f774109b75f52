//! The interface the encode worker calls, so a GPU backend can replace the
//! CPU tower later.

use crate::error::TowerError;
use crate::tower::Tower;

/// A vision encoder: patch rows in, merged-token embeddings out.
///
/// `encode` is CPU-bound and may take long; call it from a blocking thread.
/// The CPU implementation runs on the current rayon pool, so a caller that
/// wants to bound its threads can wrap the call in `pool.install(..)`.
pub trait VisionBackend: Send + Sync {
    /// Encodes a batch: `pixel_values` holds every image's rows
    /// (`[t·h·w, C·T·P·P]`, row-major) back to back, in `grids` order.
    /// Returns one `[t·h·w / M², out_hidden]` row-major buffer per image.
    fn encode(
        &self,
        pixel_values: &[f32],
        grids: &[[usize; 3]],
    ) -> Result<Vec<Vec<f32>>, TowerError>;

    /// Width of one output embedding (the language model's hidden size).
    fn out_hidden(&self) -> usize;

    /// Relative cost of encoding one image, for sizing batches: its patch count.
    fn patch_cost(&self, grid: [usize; 3]) -> u64 {
        (grid[0] * grid[1] * grid[2]) as u64
    }
}

impl VisionBackend for Tower {
    fn encode(
        &self,
        pixel_values: &[f32],
        grids: &[[usize; 3]],
    ) -> Result<Vec<Vec<f32>>, TowerError> {
        self.forward(pixel_values, grids)
    }

    fn out_hidden(&self) -> usize {
        self.config().out_hidden_size
    }
}
