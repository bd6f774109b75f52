//! Adapts a [`Compute`] backend to the batching loop: items are images,
//! cost is patches, and the batch runs on the blocking pool.

use std::sync::Arc;

use bytes::Bytes;

use crate::compute::{Compute, ImageInput};

pub struct TowerBackend {
    pub compute: Arc<dyn Compute>,
}

impl iris_batcher::Backend for TowerBackend {
    type Item = ImageInput;
    type Output = Bytes;

    fn cost(&self, item: &ImageInput) -> u64 {
        item.patches()
    }

    fn run(&self, items: Vec<ImageInput>) -> Result<Vec<Bytes>, String> {
        let items: Vec<ImageInput> = items.into_iter().map(ImageInput::to_f32).collect();
        let outputs = self.compute.encode(&items)?;
        Ok(outputs.into_iter().map(Bytes::from).collect())
    }
}
