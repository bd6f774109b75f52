//! Adapts a [`Compute`] backend to the batching loop: items are images,
//! cost is patches, the batch runs on the blocking pool, and each image's
//! embedding is handed back the moment it is done.

use std::sync::Arc;

use bytes::Bytes;
use iris_batcher::Completion;

use crate::compute::{Compute, Encoded, ImageInput};

pub struct TowerBackend {
    pub compute: Arc<dyn Compute>,
}

impl iris_batcher::Backend for TowerBackend {
    type Item = ImageInput;
    type Output = Bytes;

    fn cost(&self, item: &ImageInput) -> u64 {
        item.patches()
    }

    fn run(&self, items: Vec<ImageInput>, done: &Completion<Bytes>) -> Result<(), String> {
        let report = |index: usize, output: Encoded| done.finish(index, output.map(Bytes::from));
        self.compute.encode_batch(items, &report);
        Ok(())
    }
}
