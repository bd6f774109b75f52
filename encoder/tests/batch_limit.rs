//! A caller's own batch limit on Encode (the `iris-max-batch-patches`
//! metadata entry): the call's items are batched within it, the call still
//! succeeds, and a malformed limit is refused with a message.

use std::sync::{Arc, Mutex};

use iris_encoder::compute::{Compute, DigestCompute, Encoded, ImageInput};
use iris_encoder::service::MAX_BATCH_PATCHES_HEADER;
use iris_encoder::EncoderArgs;
use iris_proto::encoder::EncodeRequest;
use tonic::metadata::MetadataValue;
use tonic::Code;

mod common;
use common::*;

/// Digest compute that records the patch count of every image of every
/// batch it runs.
struct Recording {
    inner: DigestCompute,
    batches: Mutex<Vec<Vec<u64>>>,
}

impl Recording {
    fn batches(&self) -> Vec<Vec<u64>> {
        self.batches.lock().expect("batches").clone()
    }
}

impl Compute for Recording {
    fn out_hidden(&self) -> usize {
        self.inner.out_hidden()
    }

    fn tokens(&self, grid: [u32; 3]) -> usize {
        self.inner.tokens(grid)
    }

    fn encode(&self, image: &ImageInput) -> Encoded {
        self.inner.encode(image)
    }

    fn encode_batch(&self, images: Vec<ImageInput>, done: &(dyn Fn(usize, Encoded) + Sync)) {
        let patches = images.iter().map(ImageInput::patches).collect();
        self.batches.lock().expect("batches").push(patches);
        for (index, image) in images.into_iter().enumerate() {
            done(index, self.inner.encode(&image));
        }
    }
}

fn limited(request: EncodeRequest, limit: &'static str) -> tonic::Request<EncodeRequest> {
    let mut request = tonic::Request::new(request);
    request
        .metadata_mut()
        .insert(MAX_BATCH_PATCHES_HEADER, MetadataValue::from_static(limit));
    request
}

async fn recording_encoder(args: EncoderArgs) -> (iris_encoder::RunningEncoder, Arc<Recording>) {
    let recording = Arc::new(Recording {
        inner: digest(),
        batches: Mutex::new(Vec::new()),
    });
    (start_with(args, recording.clone()).await, recording)
}

/// With a limit of 8 patches, four images of one call (4, 4, 16 and 4
/// patches) run as three batches, none above the limit except the image
/// that alone exceeds it; every room is served. Without the limit, a call
/// like it is one batch.
#[tokio::test]
async fn a_callers_limit_splits_its_items_into_batches_within_it() {
    let model = model();
    let (enc, recording) = recording_encoder(args(&model, 64)).await;
    let (mut e, mut d) = clients(&enc).await;
    let items = vec![
        item(1.0, 2, 2, b"a"),
        item(2.0, 2, 2, b"b"),
        item(3.0, 4, 4, b"big"),
        item(4.0, 2, 2, b"c"),
    ];
    let accepted = e
        .encode(limited(request(items, &[1, 2, 3, 4]), "8"))
        .await
        .expect("accepted");
    assert!(accepted.into_inner().accepted);
    for (room, tokens) in [(1, 1), (2, 1), (3, 4), (4, 1)] {
        let embedding = fetch(&mut d, room).await.expect("embedding");
        assert_eq!(embedding.shape, vec![tokens, 64], "room {room}");
    }
    assert_eq!(recording.batches(), vec![vec![4, 4], vec![16], vec![4]]);

    let unlimited = vec![
        item(5.0, 2, 2, b"d"),
        item(6.0, 2, 2, b"e"),
        item(7.0, 4, 4, b"f"),
    ];
    e.encode(request(unlimited, &[5, 6, 7]))
        .await
        .expect("accepted");
    for room in [5, 6, 7] {
        fetch(&mut d, room).await.expect("embedding");
    }
    assert_eq!(recording.batches()[3..], [vec![4, 4, 16]]);
}

/// A limit that is not a positive integer is refused before any room is
/// claimed; one that would split a call into more batches than the queue
/// holds is refused too, and its rooms fail with the reason.
#[tokio::test]
async fn a_bad_limit_is_refused_with_a_message() {
    let model = model();
    let args = EncoderArgs {
        queue_capacity: 2,
        ..args(&model, 64)
    };
    let (enc, recording) = recording_encoder(args).await;
    let (mut e, mut d) = clients(&enc).await;
    let three = |first: i64| {
        request(
            vec![
                item(1.0, 2, 2, b"a"),
                item(2.0, 2, 2, b"b"),
                item(3.0, 2, 2, b"c"),
            ],
            &[first, first + 1, first + 2],
        )
    };
    for bad in ["0", "-4", "many", "", "1.5"] {
        let status = e.encode(limited(three(1), bad)).await.expect_err(bad);
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
        assert!(
            status.message().contains(MAX_BATCH_PATCHES_HEADER)
                && status.message().contains("positive integer"),
            "{bad:?}: {}",
            status.message()
        );
    }
    let unclaimed = fetch_waiting(&mut d, 1, 50).await.expect_err("no room");
    assert_eq!(unclaimed.code(), Code::NotFound, "{unclaimed:?}");

    let status = e.encode(limited(three(1), "4")).await.expect_err("3 parts");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("too many batches"),
        "{}",
        status.message()
    );
    let failed = fetch(&mut d, 2).await.expect_err("refused room");
    assert_eq!(failed.code(), Code::Aborted, "{failed:?}");
    assert!(
        failed.message().contains("too many batches"),
        "{}",
        failed.message()
    );
    assert!(recording.batches().is_empty());

    e.encode(limited(three(4), "8")).await.expect("accepted");
    for room in [4, 5, 6] {
        fetch(&mut d, room).await.expect("embedding");
    }
    assert_eq!(recording.batches(), vec![vec![4, 4], vec![4]]);
}
