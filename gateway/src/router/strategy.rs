//! The three ways of spreading a request over workers, as strategies of
//! the one attempt loop ([`super::dispatch`]): each only picks an
//! attempt's workers (avoiding the request's suspects) with each pool's
//! policy and the request's [`RouteKey`], and builds what every leg is
//! sent. Retries, accounting and aborts are the loop's.
//!
//! - Aggregated: one worker runs the whole request.
//! - Prefill + decode: both legs at once, joined by a fresh KV room; the
//!   prefill leg gets the pixels of any images (it runs the vision tower
//!   itself), the decode leg only their metadata. With a vLLM prefill
//!   worker the legs are sequential instead ([`Handover::PrefillFirst`]):
//!   prefill first, asked for a remote decode, then decode with the
//!   KV-transfer parameters prefill answered (vLLM's NIXL connector).
//! - Encode + prefill + decode (requests with images in an EPD
//!   deployment; without images it is prefill + decode): per image an
//!   encode worker (the encode pool's policy, keyed by the image's content
//!   hash) and a fresh room; the encode step ([`super::encode`]) and both
//!   Generate legs go out at once, and prefill fetches the embeddings.

use std::sync::Arc;

use iris_proto::scheduler::{GenerateRequest, MultimodalItem};

use super::encode::EncodeJob;
use super::legs::{attempt_request, new_room, strip_pixels, with_encode_info, with_kv_room};
use crate::backends::Backend;
use crate::kv::Prediction;
use crate::mm::pending::PendingImages;
use crate::workers::affinity::{affinity_key, ImageCost};
use crate::workers::policy::{adapter_tag, ItemKey, RouteKey};
use crate::workers::pool::Routed;
use crate::workers::{Pool, Role, Worker};

/// How requests are spread over workers.
pub enum Mode {
    Aggregated(Arc<Pool>),
    PrefillDecode {
        prefill: Arc<Pool>,
        decode: Arc<Pool>,
    },
    /// Images to encode workers; prefill fetches their embeddings.
    EncodePrefillDecode {
        encode: Arc<Pool>,
        prefill: Arc<Pool>,
        decode: Arc<Pool>,
    },
}

impl Mode {
    /// The role whose workers are sent pixel tensors: encode workers in
    /// EPD; otherwise the worker that runs the vision tower itself
    /// (aggregated, or prefill in PD), inside its Generate request.
    pub fn pixel_role(&self) -> Role {
        match self {
            Mode::Aggregated(_) => Role::Aggregated,
            Mode::PrefillDecode { .. } => Role::Prefill,
            Mode::EncodePrefillDecode { .. } => Role::Encode,
        }
    }

    /// Whether requests with images go to encode workers first.
    pub fn encodes(&self) -> bool {
        matches!(self, Mode::EncodePrefillDecode { .. })
    }

    /// The pools whose workers prefill (aggregated, or prefill): the ones
    /// with a prefix cache worth routing by.
    pub fn prefill_pools(&self) -> Vec<Arc<Pool>> {
        match self {
            Mode::Aggregated(pool) => vec![pool.clone()],
            Mode::PrefillDecode { prefill, .. } | Mode::EncodePrefillDecode { prefill, .. } => {
                vec![prefill.clone()]
            }
        }
    }

    pub fn pools(&self) -> Vec<Arc<Pool>> {
        match self {
            Mode::Aggregated(pool) => vec![pool.clone()],
            Mode::PrefillDecode { prefill, decode } => vec![prefill.clone(), decode.clone()],
            Mode::EncodePrefillDecode {
                encode,
                prefill,
                decode,
            } => vec![encode.clone(), prefill.clone(), decode.clone()],
        }
    }
}

/// How one request is spread over workers, with the request prepared
/// once for every attempt.
pub(super) struct Strategy<'a> {
    shape: Shape<'a>,
    /// The request's images and videos as the policies see them.
    items: Vec<ItemKey>,
}

enum Shape<'a> {
    Aggregated {
        pool: &'a Pool,
        request: GenerateRequest,
    },
    PrefillDecode {
        prefill: &'a Pool,
        decode: &'a Pool,
        request: GenerateRequest,
        /// What decode is sent: the request without pixels.
        stripped: Box<GenerateRequest>,
    },
    EncodePrefillDecode {
        encode: &'a Pool,
        prefill: &'a Pool,
        decode: &'a Pool,
        /// The images for the encode step: pixels included, or still being
        /// preprocessed (`images`).
        items: Vec<MultimodalItem>,
        images: Option<&'a PendingImages>,
        /// What prefill and decode are sent: the request without pixels.
        stripped: GenerateRequest,
    },
}

/// When the loop hands a started generation to its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handover {
    /// Once every call was accepted, so the client's stream starts and
    /// the images' memory is released at once (for a non-streaming
    /// request the first response is the whole answer). Aggregated and PD
    /// — unless pixels went by the shm or RDMA lane, which the first
    /// response settles ([`Handover::FirstResponse`]).
    Accepted,
    /// After the stream's first response, so that failures surfacing only
    /// in the streams, before anything reached the client, can still be
    /// retried: EPD, whose usual failures (an embedding that never
    /// arrives, an encoder that accepted but did not deliver) surface only
    /// in the prefill's stream.
    FirstResponse,
    /// PD on a backend whose prefill runs first (vLLM): the prefill leg
    /// runs to its end first (its answer is not streamed), then the stream
    /// leg is sent the hand-off parameters it answered; handed over once
    /// that leg is accepted.
    PrefillFirst,
}

/// The workers of one attempt and what each is sent.
pub(super) struct Plan<'a> {
    /// The encode step: one job per image (empty unless EPD).
    pub encodes: Vec<EncodeJob<'a>>,
    /// The prefill leg, when the request is split.
    pub prefill: Option<(Arc<Worker>, GenerateRequest)>,
    /// The leg whose responses reach the client (aggregated or decode).
    pub stream: (Arc<Worker>, GenerateRequest),
    pub handover: Handover,
    /// What the prefilling pool's policy expects of the request on its
    /// pick (the aggregated or prefill worker).
    pub prediction: Option<Prediction>,
}

impl Plan<'_> {
    /// The Generate legs' workers: prefill (if any), then the stream's.
    pub fn leg_workers(&self) -> Vec<Arc<Worker>> {
        let prefill = self.prefill.iter().map(|(p, _)| p.clone());
        prefill.chain([self.stream.0.clone()]).collect()
    }
}

impl<'a> Strategy<'a> {
    /// The strategy of `mode` for `request`, whose items' pixels may still
    /// be on their way (`images`; EPD only).
    pub fn new(mode: &'a Mode, request: GenerateRequest, images: &'a PendingImages) -> Self {
        let items = item_keys(&request);
        let shape = match mode {
            Mode::Aggregated(pool) => Shape::Aggregated { pool, request },
            Mode::PrefillDecode { prefill, decode } => {
                Shape::prefill_decode(prefill, decode, request)
            }
            Mode::EncodePrefillDecode {
                encode,
                prefill,
                decode,
            } => {
                let items = request
                    .mm_inputs
                    .as_ref()
                    .map(|m| m.items.clone())
                    .unwrap_or_default();
                if items.is_empty() {
                    Shape::prefill_decode(prefill, decode, request)
                } else {
                    Shape::EncodePrefillDecode {
                        encode,
                        prefill,
                        decode,
                        items,
                        images: (!images.is_empty()).then_some(images),
                        stripped: strip_pixels(&request),
                    }
                }
            }
        };
        Strategy { shape, items }
    }

    /// The request's routing key: its tokens and items, one request's cost.
    /// The request's key; `suspects`: the workers it already failed on.
    fn key<'k>(&'k self, suspects: &'k [Arc<Worker>]) -> RouteKey<'k> {
        let request = match &self.shape {
            Shape::Aggregated { request, .. } | Shape::PrefillDecode { request, .. } => request,
            Shape::EncodePrefillDecode { stripped, .. } => stripped,
        };
        RouteKey {
            tokens: request
                .tokenized
                .as_ref()
                .map_or(&[], |t| t.input_ids.as_slice()),
            items: &self.items,
            cost: 1,
            suspects,
            adapter: adapter_tag(&request.lora_id),
        }
    }

    /// The Generate pools of the strategy's legs, as [`Plan::leg_workers`]
    /// lists their workers.
    fn leg_pools(&self) -> Vec<&Pool> {
        match &self.shape {
            Shape::Aggregated { pool, .. } => vec![pool],
            Shape::PrefillDecode {
                prefill, decode, ..
            }
            | Shape::EncodePrefillDecode {
                prefill, decode, ..
            } => vec![prefill, decode],
        }
    }

    /// Tells each leg's pool policy that `workers` ([`Plan::leg_workers`]
    /// of the attempt that started) accepted the request; each hears of
    /// its end when the generation holding the returned [`Routed`]s ends.
    pub fn routed(&self, workers: &[Arc<Worker>]) -> Vec<Routed> {
        let key = self.key(&[]);
        self.leg_pools()
            .into_iter()
            .zip(workers)
            .map(|(pool, worker)| pool.routed(worker, &key))
            .collect()
    }

    /// Attempt number `attempt`'s workers, none of `suspects` unless a
    /// role has no other; `Err` names a role without any healthy worker.
    pub fn plan(&self, attempt: u32, suspects: &[Arc<Worker>]) -> Result<Plan<'_>, Role> {
        let mut plan = self.legs(attempt, suspects)?;
        let prefilling = self.leg_pools()[0];
        let worker = plan.leg_workers().swap_remove(0);
        plan.prediction = prefilling.expect(&worker, &self.key(suspects));
        Ok(plan)
    }

    /// [`Self::plan`]'s workers and what each is sent.
    fn legs(&self, attempt: u32, suspects: &[Arc<Worker>]) -> Result<Plan<'_>, Role> {
        let key = self.key(suspects);
        let pick = |pool: &Pool| pool.pick(&key).ok_or(pool.role);
        match &self.shape {
            Shape::Aggregated { pool, request } => Ok(Plan {
                encodes: Vec::new(),
                prefill: None,
                stream: (pick(pool)?, attempt_request(request, attempt)),
                handover: Handover::Accepted,
                prediction: None,
            }),
            Shape::PrefillDecode {
                prefill,
                decode,
                request,
                stripped,
            } => {
                let (p, d) = (pick(prefill)?, pick(decode)?);
                if p.backend().is_some_and(Backend::prefills_first) {
                    return Ok(prefill_first_plan(p, d, request, stripped, attempt));
                }
                let p_request = with_kv_room(attempt_request(request, attempt), &p);
                let d_request = GenerateRequest {
                    kv_bootstrap_info: p_request.kv_bootstrap_info.clone(),
                    request_id: p_request.request_id.clone(),
                    ..GenerateRequest::clone(stripped)
                };
                Ok(Plan {
                    encodes: Vec::new(),
                    prefill: Some((p, p_request)),
                    stream: (d, d_request),
                    handover: Handover::Accepted,
                    prediction: None,
                })
            }
            Shape::EncodePrefillDecode {
                encode,
                prefill,
                decode,
                items,
                images,
                stripped,
            } => {
                let encoders = pick_encoders(encode, items, suspects)?;
                let (p, d) = (pick(prefill)?, pick(decode)?);
                let rooms: Vec<i64> = items.iter().map(|_| new_room()).collect();
                let d_request = with_kv_room(attempt_request(stripped, attempt), &p);
                let p_request = with_encode_info(d_request.clone(), &encoders, &rooms);
                let encodes = encoders
                    .into_iter()
                    .zip(items)
                    .zip(rooms)
                    .enumerate()
                    .map(|(index, ((worker, item), room))| EncodeJob {
                        worker,
                        item,
                        room,
                        pending: images.map(|images| (images, index)),
                    })
                    .collect();
                Ok(Plan {
                    encodes,
                    prefill: Some((p, p_request)),
                    stream: (d, d_request),
                    handover: Handover::FirstResponse,
                    prediction: None,
                })
            }
        }
    }
}

impl<'a> Shape<'a> {
    fn prefill_decode(prefill: &'a Pool, decode: &'a Pool, request: GenerateRequest) -> Self {
        Shape::PrefillDecode {
            prefill,
            decode,
            stripped: Box::new(strip_pixels(&request)),
            request,
        }
    }
}

/// Each item of `request` as the policies see it: its content key and
/// the prompt span of its placeholders.
fn item_keys(request: &GenerateRequest) -> Vec<ItemKey> {
    let items = request.mm_inputs.iter().flat_map(|m| &m.items);
    items
        .map(|item| {
            let start = item.placeholders.first().map_or(0, |p| p.offset);
            let end = item
                .placeholders
                .last()
                .map_or(start, |p| p.offset.saturating_add(p.length));
            ItemKey {
                key: affinity_key(&item.content_hash),
                span: start..end,
                hash: item.content_hash.clone(),
            }
        })
        .collect()
}

/// The PD plan of a backend whose prefill runs first (vLLM): prefill is
/// sent the whole request, decode the same id without images (the KV
/// state it collects covers them); they run one after the other
/// ([`Handover::PrefillFirst`]).
fn prefill_first_plan<'a>(
    p: Arc<Worker>,
    d: Arc<Worker>,
    request: &GenerateRequest,
    stripped: &GenerateRequest,
    attempt: u32,
) -> Plan<'a> {
    let p_request = attempt_request(request, attempt);
    let d_request = GenerateRequest {
        request_id: p_request.request_id.clone(),
        mm_inputs: None,
        ..stripped.clone()
    };
    Plan {
        encodes: Vec::new(),
        prefill: Some((p, p_request)),
        stream: (d, d_request),
        handover: Handover::PrefillFirst,
        prediction: None,
    }
}

/// One encode worker per image, by the encode pool's policy.
fn pick_encoders(
    pool: &Pool,
    items: &[MultimodalItem],
    suspects: &[Arc<Worker>],
) -> Result<Vec<Arc<Worker>>, Role> {
    let images: Vec<ImageCost> = items.iter().map(ImageCost::of).collect();
    let item_keys: Vec<ItemKey> = images.iter().map(ImageCost::item_key).collect();
    let keys: Vec<RouteKey<'_>> = images
        .iter()
        .zip(&item_keys)
        .map(|(image, item)| RouteKey {
            suspects,
            ..image.route_key(item)
        })
        .collect();
    pool.pick_each(&keys, suspects).ok_or(Role::Encode)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use iris_proto::scheduler::{MultimodalInputs, TensorData};

    use super::*;
    use crate::workers::policy::PolicyKind;
    use crate::workers::WorkerUrl;

    fn pool_of(role: Role, backend: &str) -> Arc<Pool> {
        let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:1?backend={backend}")).unwrap();
        let worker = Worker::new(url, role, Duration::from_secs(1)).unwrap();
        worker.set_healthy(true);
        let policy = PolicyKind::RoundRobin.build(Default::default(), &Default::default());
        Arc::new(Pool::new(role, vec![worker], policy))
    }

    fn image_request() -> GenerateRequest {
        let item = MultimodalItem {
            encoder_input: Some(TensorData::default()),
            ..MultimodalItem::default()
        };
        GenerateRequest {
            request_id: "r".into(),
            mm_inputs: Some(MultimodalInputs { items: vec![item] }),
            ..GenerateRequest::default()
        }
    }

    fn pd(backend: &str) -> Mode {
        Mode::PrefillDecode {
            prefill: pool_of(Role::Prefill, backend),
            decode: pool_of(Role::Decode, backend),
        }
    }

    #[tokio::test]
    async fn a_vllm_prefill_runs_first_and_decode_gets_no_images() {
        let mode = pd("vllm");
        let no_pending = PendingImages::default();
        let strategy = Strategy::new(&mode, image_request(), &no_pending);
        let plan = strategy.plan(1, &[]).unwrap();
        assert_eq!(plan.handover, Handover::PrefillFirst);
        let (_, prefill) = plan.prefill.as_ref().unwrap();
        assert_eq!(prefill.request_id, "r-retry1");
        assert_eq!(prefill.kv_bootstrap_info, None, "vLLM's PD has no room");
        assert!(prefill.mm_inputs.as_ref().unwrap().items[0]
            .encoder_input
            .is_some());
        let decode = &plan.stream.1;
        assert_eq!(decode.request_id, "r-retry1");
        assert_eq!(
            (&decode.mm_inputs, &decode.kv_bootstrap_info),
            (&None, &None)
        );
    }

    #[tokio::test]
    async fn sglang_pd_is_dual_dispatch_with_an_int32_room() {
        let mode = pd("sglang");
        let no_pending = PendingImages::default();
        let strategy = Strategy::new(&mode, image_request(), &no_pending);
        for attempt in 0..32 {
            let plan = strategy.plan(attempt, &[]).unwrap();
            assert_eq!(plan.handover, Handover::Accepted);
            let p_room = plan.prefill.as_ref().unwrap().1.kv_bootstrap_info.clone();
            let d_room = plan.stream.1.kv_bootstrap_info.clone();
            assert_eq!(p_room, d_room);
            let room = p_room.unwrap().bootstrap_room;
            assert!((0..=i64::from(i32::MAX)).contains(&room), "{room}");
        }
    }
}
