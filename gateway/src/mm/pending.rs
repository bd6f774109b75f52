//! A request's images while their pixels are computed.
//!
//! Once an image is fetched and its header read, its [`ItemLayout`] —
//! tensor shape, patch grid, token count, content hash — is known
//! ([`iris_vision::Processor::planned_layout`]), so the prompt can be built
//! and, in EPD, the request planned and its Generate legs sent while the
//! pixels are still being decoded. Each image is preprocessed in its own
//! task and its pixels are awaited on their own ([`PendingImages::pixels`]):
//! an image's Encode leaves as soon as that image is ready, not when the
//! request's last image is.
//!
//! The memory reserved for the images is held until the last handle is
//! dropped (once the request has been handed to the workers); dropping it
//! also stops preprocessing that nobody waits for any more. After that a
//! request may keep [`RememberedImages`]: weak handles that find the
//! pixels again while the pixel cache still holds them (a stream moving to
//! another worker), at no memory cost of their own.

use std::sync::{Arc, Mutex, Weak};

use futures::future::{BoxFuture, FutureExt, Shared};
use iris_openai::ApiError;
use tokio::task::AbortHandle;

use super::budget::Reservation;
use super::pixels::{ItemLayout, PixelEntry};

/// What preprocessing one image gives: its entry, and the part of the
/// reservation its tensor keeps (when this request computed it).
pub type Loaded = (Arc<PixelEntry>, Option<Reservation>);

type Pixels = Shared<BoxFuture<'static, Result<Arc<PixelEntry>, ApiError>>>;

/// The images of one request, each on its way (cheap to clone).
#[derive(Clone, Default)]
pub struct PendingImages {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    layouts: Vec<ItemLayout>,
    pixels: Vec<Pixels>,
    /// The reservations of the tensors this request computed, given back
    /// when the last handle is dropped.
    _held: Arc<Mutex<Vec<Reservation>>>,
    tasks: Vec<AbortHandle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.tasks.iter().for_each(AbortHandle::abort);
    }
}

impl PendingImages {
    /// Starts each image's preprocessing (`load`) in a task of its own,
    /// beside its planned layout and the part of the request's reservation
    /// it may use.
    pub fn start(images: Vec<(ItemLayout, BoxFuture<'static, Result<Loaded, ApiError>>)>) -> Self {
        let held = Arc::new(Mutex::new(Vec::new()));
        let (mut layouts, mut pixels, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
        // Each task's fetch and preprocessing are stages of the request's trace.
        let trace = crate::trace::current();
        for (layout, load) in images {
            let held = held.clone();
            let load = async move {
                let (entry, share) = load.await?;
                if let Some(share) = share {
                    lock(&held).push(share);
                }
                Ok(entry)
            };
            let task = tokio::spawn(crate::trace::scope(trace.clone(), load));
            tasks.push(task.abort_handle());
            let joined = async move {
                task.await.unwrap_or_else(|e| {
                    Err(ApiError::internal(format!(
                        "preprocessing task failed: {e}"
                    )))
                })
            };
            layouts.push(layout);
            pixels.push(joined.boxed().shared());
        }
        PendingImages {
            inner: Arc::new(Inner {
                layouts,
                pixels,
                _held: held,
                tasks,
            }),
        }
    }

    /// How many images the request carries.
    pub fn len(&self) -> usize {
        self.inner.layouts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.layouts.is_empty()
    }

    /// The images' layouts, in the request's order.
    pub fn layouts(&self) -> &[ItemLayout] {
        &self.inner.layouts
    }

    /// Image `index`'s pixels, once preprocessed; an error if it could
    /// not be, or if its tensor is not what its header promised.
    pub async fn pixels(&self, index: usize) -> Result<Arc<PixelEntry>, ApiError> {
        let (Some(layout), Some(pixels)) =
            (self.inner.layouts.get(index), self.inner.pixels.get(index))
        else {
            return Err(ApiError::internal(format!(
                "the request has no image {index}"
            )));
        };
        let entry = pixels.clone().await?;
        if &entry.layout != layout {
            return Err(ApiError::internal(format!(
                "image {index}: its tensor is {:?} ({} tokens), its header promised {:?} ({} tokens)",
                entry.layout.shape, entry.layout.tokens, layout.shape, layout.tokens
            )));
        }
        Ok(entry)
    }

    /// Every image's pixels, in order; the first error if any failed.
    pub async fn all(&self) -> Result<Vec<Arc<PixelEntry>>, ApiError> {
        futures::future::try_join_all((0..self.len()).map(|i| self.pixels(i))).await
    }

    /// The error of an image that failed already, if one did.
    pub fn failure(&self) -> Option<ApiError> {
        self.inner
            .pixels
            .iter()
            .find_map(|p| p.peek().and_then(|r| r.as_ref().err().cloned()))
    }

    /// The images as [`RememberedImages`]; `None` if one of them has not
    /// been preprocessed successfully (yet: this does not wait).
    pub fn remember(&self) -> Option<RememberedImages> {
        let entries = self
            .inner
            .pixels
            .iter()
            .map(|pixels| match pixels.clone().now_or_never() {
                Some(Ok(entry)) => Some(Arc::downgrade(&entry)),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(RememberedImages {
            layouts: self.inner.layouts.clone(),
            entries,
        })
    }

    /// Images whose pixels are all at hand (nothing reserved, nothing to
    /// compute).
    fn ready(layouts: Vec<ItemLayout>, entries: Vec<Arc<PixelEntry>>) -> Self {
        let pixels = entries
            .into_iter()
            .map(|entry| futures::future::ready(Ok(entry)).boxed().shared())
            .collect();
        PendingImages {
            inner: Arc::new(Inner {
                layouts,
                pixels,
                _held: Arc::default(),
                tasks: Vec::new(),
            }),
        }
    }
}

/// A request's images once their memory was given back: their layouts
/// and weak handles on their pixels.
#[derive(Clone, Default)]
pub struct RememberedImages {
    layouts: Vec<ItemLayout>,
    entries: Vec<Weak<PixelEntry>>,
}

impl RememberedImages {
    /// The images again, if every one's pixels are still held (by the
    /// pixel cache or another request); `None` otherwise.
    pub fn recall(&self) -> Option<PendingImages> {
        let entries = self
            .entries
            .iter()
            .map(Weak::upgrade)
            .collect::<Option<Vec<_>>>()?;
        Some(PendingImages::ready(self.layouts.clone(), entries))
    }
}

fn lock(held: &Mutex<Vec<Reservation>>) -> std::sync::MutexGuard<'_, Vec<Reservation>> {
    held.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Images whose pixels a test hands over when it chooses.
#[cfg(test)]
pub(crate) mod testing {
    use bytes::Bytes;
    use futures::future::{BoxFuture, FutureExt};
    use iris_openai::ApiError;
    use iris_proto::tensor::DType;
    use tokio::sync::oneshot;

    use super::{ItemLayout, Loaded, PendingImages, PixelEntry};
    use std::sync::Arc;

    /// The layout of a bfloat16 image of `tokens` tokens named `hash`.
    pub fn layout(tokens: usize, hash: u8) -> ItemLayout {
        ItemLayout {
            modality: iris_proto::common::Modality::Image,
            shape: vec![tokens as u32 * 4, 2],
            dtype: DType::BFloat16,
            grid: Some([1, 2, tokens as u32 * 2]),
            image_sizes: None,
            tokens,
            groups: 1,
            expansion: None,
            content_hash: Bytes::from(vec![hash; 32]),
            second_per_grid: None,
            tensors: Vec::new(),
        }
    }

    /// An entry of that layout, its pixels all `hash`.
    pub fn entry(layout: ItemLayout) -> Arc<PixelEntry> {
        let len = layout.shape.iter().product::<u32>() as usize * 2;
        let pixels = Bytes::from(vec![layout.content_hash[0]; len]);
        let held = pixels.len();
        Arc::new(PixelEntry {
            pixels,
            layout,
            held,
        })
    }

    /// Images of these layouts, each ready when the test sends its result.
    pub fn images(
        layouts: &[ItemLayout],
    ) -> (
        PendingImages,
        Vec<oneshot::Sender<Result<Loaded, ApiError>>>,
    ) {
        let (mut loads, mut senders) = (Vec::new(), Vec::new());
        for layout in layouts {
            let (tx, rx) = oneshot::channel();
            let load: BoxFuture<'static, Result<Loaded, ApiError>> = async move {
                rx.await
                    .unwrap_or_else(|_| Err(ApiError::internal("the test dropped the image")))
            }
            .boxed();
            loads.push((layout.clone(), load));
            senders.push(tx);
        }
        (PendingImages::start(loads), senders)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::testing::{entry, images, layout};
    use super::*;

    #[tokio::test]
    async fn each_image_is_ready_on_its_own() {
        let (images, mut ready) = images(&[layout(4, 1), layout(8, 2)]);
        assert_eq!(
            images
                .layouts()
                .iter()
                .map(|l| l.tokens)
                .collect::<Vec<_>>(),
            [4, 8]
        );
        let _ = ready.remove(1).send(Ok((entry(layout(8, 2)), None)));
        let second = tokio::time::timeout(Duration::from_secs(5), images.pixels(1)).await;
        assert_eq!(
            second.unwrap().unwrap().layout.tokens,
            8,
            "the second image does not wait for the first"
        );
        assert!(images.failure().is_none());
        let _ = ready.remove(0).send(Err(ApiError::bad_request(
            "messages[0].content[1]: corrupt",
        )));
        let err = images.all().await.unwrap_err();
        assert_eq!(err.status, 400);
        assert!(images
            .failure()
            .is_some_and(|e| e.message.contains("corrupt")));
    }

    #[tokio::test]
    async fn a_tensor_unlike_its_plan_is_an_internal_error() {
        let (images, mut ready) = images(&[layout(4, 1)]);
        let _ = ready.remove(0).send(Ok((entry(layout(5, 1)), None)));
        let err = images.pixels(0).await.unwrap_err();
        assert_eq!(err.status, 500);
        assert!(err.message.contains("promised"), "{}", err.message);
    }

    #[tokio::test]
    async fn remembered_images_come_back_while_their_pixels_are_held() {
        let (images, mut ready) = images(&[layout(4, 1), layout(8, 2)]);
        let held = entry(layout(4, 1));
        let _ = ready.remove(0).send(Ok((held.clone(), None)));
        assert!(
            images.remember().is_none(),
            "an image is still being computed"
        );
        let _ = ready.remove(0).send(Ok((entry(layout(8, 2)), None)));
        images.all().await.unwrap();
        let remembered = images.remember().expect("every image is ready");
        let again = remembered
            .recall()
            .expect("both pixels are held by `images`");
        assert_eq!(again.layouts(), images.layouts());
        assert!(Arc::ptr_eq(&again.pixels(0).await.unwrap(), &held));
        drop((images, again));
        assert!(
            remembered.recall().is_none(),
            "the second image's pixels went with the request"
        );
        let (only_first, mut ready) = super::testing::images(&[layout(4, 1)]);
        let _ = ready.remove(0).send(Ok((held.clone(), None)));
        only_first.all().await.unwrap();
        let remembered = only_first.remember().unwrap();
        drop(only_first);
        assert!(remembered.recall().is_some(), "`held` stands for the cache");
    }

    #[tokio::test]
    async fn dropping_the_images_stops_their_preprocessing() {
        let (images, mut ready) = images(&[layout(4, 1)]);
        let mut sender = ready.remove(0);
        drop(images);
        tokio::time::timeout(Duration::from_secs(5), sender.closed())
            .await
            .expect("the task holding the receiver was aborted");
    }
}
