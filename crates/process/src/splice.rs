//! gRPC calls that send large `bytes` fields without copying them.
//!
//! tonic's codec encodes every message into one contiguous buffer, so a
//! request carrying a 50 MB pixel tensor costs a fresh 50 MB allocation
//! (page faults on first touch) and a 50 MB copy before HTTP/2 sends a
//! byte — on every request, even when the tensor is already in the pixel
//! cache. Here the message is encoded by prost into a [`SpliceBuf`], which
//! copies the small fields as usual but takes every `bytes` field of at
//! least [`SPLICE_MIN`] bytes by reference (the shared [`Bytes`] the
//! gateway already holds); the request body is that list of chunks behind
//! the 5-byte gRPC frame header, which HTTP/2 frames straight from the
//! shared buffers. The wire bytes are exactly what tonic would send
//! (checked by the tests); answers are decoded by tonic as usual.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, TE};
use http::HeaderValue;
use http_body::{Body, Frame, SizeHint};
use prost::Message;
use tonic::client::GrpcService;
use tonic::codec::Streaming;
use tonic::codegen::StdError;
use tonic::{Response, Status};

/// `bytes` fields at least this long are sent by reference, not copied.
pub const SPLICE_MIN: usize = 32 << 10;
/// The gRPC length-prefixed message header: a compression flag and a
/// big-endian u32 length.
const HEADER_LEN: usize = 5;

/// A [`BufMut`] that collects an encoded message as chunks: small writes
/// are copied into the current chunk, large `Buf`s (prost's `bytes`
/// fields) become chunks of their own without a copy.
#[derive(Debug, Default)]
pub struct SpliceBuf {
    current: BytesMut,
    chunks: Vec<Bytes>,
    len: usize,
}

impl SpliceBuf {
    /// The chunks, in order.
    pub fn into_chunks(mut self) -> Vec<Bytes> {
        self.flush();
        self.chunks
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            self.chunks.push(self.current.split().freeze());
        }
    }
}

// SAFETY: every method delegates to the inner `BytesMut`, whose
// `chunk_mut`/`advance_mut` contract this upholds unchanged; `len` only
// counts what was written.
unsafe impl BufMut for SpliceBuf {
    fn remaining_mut(&self) -> usize {
        usize::MAX - self.len
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialised `cnt` bytes of `chunk_mut()`,
        // which is the inner buffer's.
        unsafe { self.current.advance_mut(cnt) };
        self.len += cnt;
    }

    fn chunk_mut(&mut self) -> &mut bytes::buf::UninitSlice {
        self.current.chunk_mut()
    }

    fn put<T: Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        let n = src.remaining();
        if n >= SPLICE_MIN {
            self.flush();
            // A `Bytes` hands itself over without copying.
            self.chunks.push(src.copy_to_bytes(n));
            self.len += n;
            return;
        }
        while src.has_remaining() {
            let chunk = src.chunk();
            let k = chunk.len();
            self.current.extend_from_slice(chunk);
            self.len += k;
            src.advance(k);
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        self.current.extend_from_slice(src);
        self.len += src.len();
    }
}

/// `message` as a gRPC length-prefixed message (uncompressed), in chunks
/// that share its large `bytes` fields.
pub fn frame<M: Message>(message: &M) -> Result<Vec<Bytes>, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len).map_err(|_| {
        Status::resource_exhausted(format!("a {len}-byte message is too large for gRPC"))
    })?;
    let mut buf = SpliceBuf::default();
    buf.put_u8(0);
    buf.put_u32(prefix);
    message.encode_raw(&mut buf);
    if buf.len() != HEADER_LEN + len {
        return Err(Status::internal(format!(
            "encoded {} bytes for a message of {len}",
            buf.len() - HEADER_LEN
        )));
    }
    Ok(buf.into_chunks())
}

/// A request body of ready chunks, with its exact length (so HTTP/1
/// sends `Content-Length`). It never fails; `E` is the error type its
/// user's client wants (`Status` for tonic, `Infallible` for hyper).
#[derive(Debug)]
pub struct ChunkBody<E = Status> {
    chunks: VecDeque<Bytes>,
    remaining: u64,
    _error: std::marker::PhantomData<fn() -> E>,
}

impl<E> ChunkBody<E> {
    pub fn new(chunks: Vec<Bytes>) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        ChunkBody {
            chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(),
            remaining,
            _error: std::marker::PhantomData,
        }
    }

    /// A body of one chunk.
    pub fn single(bytes: Bytes) -> Self {
        Self::new(vec![bytes])
    }
}

impl<E> Body for ChunkBody<E> {
    type Data = Bytes;
    type Error = E;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, E>>> {
        let this = self.get_mut();
        Poll::Ready(this.chunks.pop_front().map(|chunk| {
            this.remaining = this.remaining.saturating_sub(chunk.len() as u64);
            Ok(Frame::data(chunk))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// Calls the gRPC method at `path` (`/package.Service/Method`) with
/// `message`, its large `bytes` fields sent by reference; the answer is a
/// stream of `R` (one message for unary methods), decoded by tonic with
/// `max_decode` as the message size limit. `timeout` becomes the
/// `grpc-timeout` the server and the channel enforce. `channel` is any
/// tonic client transport (a `Channel`, an [`crate::auth::AuthChannel`]).
pub async fn call<C, M, R>(
    channel: &C,
    path: &'static str,
    message: &M,
    timeout: Option<Duration>,
    max_decode: usize,
) -> Result<Response<Streaming<R>>, Status>
where
    C: GrpcService<tonic::body::Body> + Clone,
    C::Error: Into<StdError>,
    C::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <C::ResponseBody as http_body::Body>::Error: Into<StdError>,
    M: Message,
    R: Message + Default + Send + 'static,
{
    let body = tonic::body::Body::new(ChunkBody::<Status>::new(frame(message)?));
    let mut request = http::Request::builder()
        .method(http::Method::POST)
        .version(http::Version::HTTP_2)
        .uri(path)
        .header(TE, HeaderValue::from_static("trailers"))
        .header(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))
        .body(body)
        .map_err(|e| Status::internal(format!("cannot build the gRPC request: {e}")))?;
    if let Some(t) = timeout {
        // gRPC allows at most 8 digits per unit.
        let ms = t.as_millis().clamp(1, 99_999_999);
        let value = HeaderValue::from_str(&format!("{ms}m"))
            .map_err(|e| Status::internal(format!("bad grpc-timeout: {e}")))?;
        request.headers_mut().insert("grpc-timeout", value);
    }
    let mut channel = channel.clone();
    std::future::poll_fn(|cx| GrpcService::poll_ready(&mut channel, cx))
        .await
        .map_err(|e| {
            let e: StdError = e.into();
            Status::unavailable(format!("the worker's channel is not ready: {e}"))
        })?;
    let response = GrpcService::call(&mut channel, request)
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    let status_code = response.status();
    // A trailers-only answer carries the status in its headers.
    let expect_trailers = match Status::from_header_map(response.headers()) {
        Some(status) if status.code() != tonic::Code::Ok => return Err(status),
        Some(_) => false,
        None => true,
    };
    let (parts, body) = response.into_parts();
    let decoder = tonic_prost::ProstDecoder::<R>::default();
    let stream = if expect_trailers {
        Streaming::new_response(decoder, body, status_code, None, Some(max_decode))
    } else {
        Streaming::new_empty(decoder, body)
    };
    Ok(Response::from_parts(
        tonic::metadata::MetadataMap::from_headers(parts.headers),
        stream,
        parts.extensions,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iris_proto::scheduler::{
        GenerateRequest, MultimodalInputs, MultimodalItem, PlaceholderRange, TensorData,
    };

    fn request(pixels: Bytes) -> GenerateRequest {
        GenerateRequest {
            request_id: "r-1".into(),
            mm_inputs: Some(MultimodalInputs {
                items: vec![MultimodalItem {
                    content_hash: Bytes::from_static(b"hash"),
                    encoder_input: Some(iris_proto::tensor::inline(
                        vec![2, pixels.len() as u32 / 2],
                        iris_proto::tensor::DType::UInt8,
                        pixels,
                    )),
                    // Encoded after the tensor: a tail chunk.
                    placeholders: vec![PlaceholderRange {
                        offset: 1,
                        length: 2,
                    }],
                    ..MultimodalItem::default()
                }],
            }),
            ..GenerateRequest::default()
        }
    }

    /// What tonic's codec would send: header and the contiguous encoding.
    fn contiguous<M: Message>(m: &M) -> Vec<u8> {
        let body = m.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn large_bytes_are_shared_and_the_wire_bytes_unchanged() {
        let pixels = Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
        let req = request(pixels.clone());
        let chunks = frame(&req).unwrap();
        assert_eq!(chunks.concat(), contiguous(&req));
        let shared = chunks
            .iter()
            .find(|c| c.len() == pixels.len())
            .expect("the pixels are a chunk of their own");
        assert_eq!(shared.as_ptr(), pixels.as_ptr(), "not copied");
        assert_eq!(chunks.len(), 3, "head, pixels, tail");
    }

    #[test]
    fn small_messages_are_one_chunk() {
        let req = request(Bytes::from_static(&[7u8; 100]));
        assert!(req.encoded_len() > 100);
        let chunks = frame(&req).unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks.concat(), contiguous(&req));
        let empty = frame(&TensorData::default()).unwrap();
        assert_eq!(empty.concat(), vec![0, 0, 0, 0, 0]);
    }

    #[test]
    fn chunk_bodies_report_their_length() {
        let body = ChunkBody::<Status>::new(vec![
            Bytes::from_static(b"ab"),
            Bytes::new(),
            Bytes::from_static(b"cde"),
        ]);
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let collected = rt.block_on(async {
            use http_body_util::BodyExt;
            body.collect().await.unwrap().to_bytes()
        });
        assert_eq!(&collected[..], b"abcde");
    }
}
