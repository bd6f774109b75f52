//! The three ways of spreading a request over workers, as strategies of
//! the one attempt loop ([`super::dispatch`]): each only picks an
//! attempt's workers (avoiding the request's suspects) and builds what
//! every leg is sent. Retries, accounting and aborts are the loop's.
//!
//! - Aggregated: one worker runs the whole request.
//! - Prefill + decode: both legs at once, joined by a fresh KV room; the
//!   prefill leg gets the pixels of any images (it runs the vision tower
//!   itself), the decode leg only their metadata. With a vLLM prefill
//!   worker the legs are sequential instead ([`Plan::remote_prefill`]):
//!   prefill first, asked for a remote decode, then decode with the
//!   KV-transfer parameters prefill answered (vLLM's NIXL connector).
//! - Encode + prefill + decode (requests with images in an EPD
//!   deployment; without images it is prefill + decode): per image an
//!   encode worker (the encode policy, keyed by the image's content hash)
//!   and a fresh room; the encode step ([`super::encode`]) and both
//!   Generate legs go out at once, and prefill fetches the embeddings.

use std::sync::Arc;

use iris_proto::scheduler::{GenerateRequest, MultimodalItem};

use super::encode::EncodeJob;
use super::legs::{attempt_request, new_room, strip_pixels, with_encode_info, with_kv_room};
use crate::backends::Backend;
use crate::mm::pending::PendingImages;
use crate::workers::affinity::{EncodePolicy, ImageCost};
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
        encode_policy: EncodePolicy,
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

    pub fn pools(&self) -> Vec<Arc<Pool>> {
        match self {
            Mode::Aggregated(pool) => vec![pool.clone()],
            Mode::PrefillDecode { prefill, decode } => vec![prefill.clone(), decode.clone()],
            Mode::EncodePrefillDecode {
                encode,
                prefill,
                decode,
                ..
            } => vec![encode.clone(), prefill.clone(), decode.clone()],
        }
    }
}

/// How one request is spread over workers, with the request prepared
/// once for every attempt.
pub(super) enum Strategy<'a> {
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
        policy: &'a EncodePolicy,
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

/// The workers of one attempt and what each is sent.
pub(super) struct Plan<'a> {
    /// The encode step: one job per image (empty unless EPD).
    pub encodes: Vec<EncodeJob<'a>>,
    /// The prefill leg, when the request is split.
    pub prefill: Option<(Arc<Worker>, GenerateRequest)>,
    /// The leg whose responses reach the client (aggregated or decode).
    pub stream: (Arc<Worker>, GenerateRequest),
    /// Wait for the stream's first response before handing it over.
    pub read_ahead: bool,
    /// vLLM PD: run the prefill leg to its end first (its answer is not
    /// streamed), then send the stream leg what it answered.
    pub remote_prefill: bool,
    /// The stream leg's KV-transfer parameters (vLLM PD: set once the
    /// prefill answered them).
    pub kv_transfer: Option<String>,
}

impl<'a> Strategy<'a> {
    /// The strategy of `mode` for `request`, whose items' pixels may still
    /// be on their way (`images`; EPD only).
    pub fn new(mode: &'a Mode, request: GenerateRequest, images: &'a PendingImages) -> Self {
        match mode {
            Mode::Aggregated(pool) => Strategy::Aggregated { pool, request },
            Mode::PrefillDecode { prefill, decode } => {
                Self::prefill_decode(prefill, decode, request)
            }
            Mode::EncodePrefillDecode {
                encode,
                encode_policy,
                prefill,
                decode,
            } => {
                let items = request
                    .mm_inputs
                    .as_ref()
                    .map(|m| m.items.clone())
                    .unwrap_or_default();
                if items.is_empty() {
                    return Self::prefill_decode(prefill, decode, request);
                }
                Strategy::EncodePrefillDecode {
                    encode,
                    policy: encode_policy,
                    prefill,
                    decode,
                    items,
                    images: (!images.is_empty()).then_some(images),
                    stripped: strip_pixels(&request),
                }
            }
        }
    }

    /// Whether the loop waits for the first response before handing the
    /// generation over ([`Plan::read_ahead`]). EPD does: its usual failures (an embedding that
    /// never arrives, an encoder that accepted but did not deliver)
    /// surface only in the prefill's stream, after every call was
    /// accepted. Aggregated and PD hand over once their legs are accepted,
    /// so the client's stream starts and the images' memory is released
    /// at once (for a non-streaming request the first response is the
    /// whole answer); a failure after that reaches the client.
    fn reads_ahead(&self) -> bool {
        matches!(self, Strategy::EncodePrefillDecode { .. })
    }

    fn prefill_decode(prefill: &'a Pool, decode: &'a Pool, request: GenerateRequest) -> Self {
        Strategy::PrefillDecode {
            prefill,
            decode,
            stripped: Box::new(strip_pixels(&request)),
            request,
        }
    }

    /// Attempt number `attempt`'s workers, none of `suspects` unless a
    /// role has no other; `Err` names a role without any healthy worker.
    pub fn plan(&self, attempt: u32, suspects: &[Arc<Worker>]) -> Result<Plan<'_>, Role> {
        match self {
            Strategy::Aggregated { pool, request } => {
                let worker = pick(pool, suspects)?;
                Ok(Plan {
                    encodes: Vec::new(),
                    prefill: None,
                    stream: (worker, attempt_request(request, attempt)),
                    read_ahead: self.reads_ahead(),
                    remote_prefill: false,
                    kv_transfer: None,
                })
            }
            Strategy::PrefillDecode {
                prefill,
                decode,
                request,
                stripped,
            } => {
                let (p, d) = (pick(prefill, suspects)?, pick(decode, suspects)?);
                if p.backend() == Some(Backend::Vllm) {
                    return Ok(vllm_prefill_decode(p, d, request, stripped, attempt));
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
                    read_ahead: self.reads_ahead(),
                    remote_prefill: false,
                    kv_transfer: None,
                })
            }
            Strategy::EncodePrefillDecode {
                encode,
                policy,
                prefill,
                decode,
                items,
                images,
                stripped,
            } => {
                let encoders = pick_encoders(encode, policy, items, suspects)?;
                let (p, d) = (pick(prefill, suspects)?, pick(decode, suspects)?);
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
                    read_ahead: self.reads_ahead(),
                    remote_prefill: false,
                    kv_transfer: None,
                })
            }
        }
    }
}

/// vLLM's PD plan: prefill is sent the whole request, decode the same id
/// without images (the KV state it collects covers them); they run one
/// after the other ([`Plan::remote_prefill`]).
fn vllm_prefill_decode<'a>(
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
        read_ahead: false,
        remote_prefill: true,
        kv_transfer: None,
    }
}

/// A worker of `pool`, preferring those not in `suspects`.
fn pick(pool: &Pool, suspects: &[Arc<Worker>]) -> Result<Arc<Worker>, Role> {
    pool.pick(suspects).ok_or(pool.role)
}

/// One encode worker per image.
fn pick_encoders(
    pool: &Pool,
    policy: &EncodePolicy,
    items: &[MultimodalItem],
    suspects: &[Arc<Worker>],
) -> Result<Vec<Arc<Worker>>, Role> {
    let candidates = pool.candidates(suspects);
    let images = items.iter().map(ImageCost::of);
    policy.pick_all(&candidates, images).ok_or(Role::Encode)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use iris_proto::scheduler::{MultimodalInputs, TensorData};

    use super::*;
    use crate::workers::policy::{Policy, PolicyKind};
    use crate::workers::WorkerUrl;

    fn pool_of(role: Role, backend: &str) -> Arc<Pool> {
        let url = WorkerUrl::parse(&format!("grpc://127.0.0.1:1?backend={backend}")).unwrap();
        let worker = Worker::new(url, role, Duration::from_secs(1)).unwrap();
        worker.set_healthy(true);
        let policy = Policy::new(PolicyKind::RoundRobin);
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
        assert!(plan.remote_prefill && plan.kv_transfer.is_none());
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
            assert!(!plan.remote_prefill);
            let p_room = plan.prefill.as_ref().unwrap().1.kv_bootstrap_info.clone();
            let d_room = plan.stream.1.kv_bootstrap_info.clone();
            assert_eq!(p_room, d_room);
            let room = p_room.unwrap().bootstrap_room;
            assert!((0..=i64::from(i32::MAX)).contains(&room), "{room}");
        }
    }
}
