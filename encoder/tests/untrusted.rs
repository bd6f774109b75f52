//! An encoder that trusts no caller: shm handles naming files that are not
//! a known sender's tensors are refused without touching the files (and
//! without saying whether they exist), declared shapes and sizes are
//! checked before any file is opened, an item larger than a batch is
//! refused before it is queued, and Encode messages are bounded in size.

use std::path::{Path, PathBuf};

use iris_encoder::EncoderArgs;
use iris_proto::common::ShmHandle;
use iris_proto::scheduler::{tensor_data::Payload, MultimodalItem, TensorData};
use tonic::Code;

mod common;
use common::*;

/// A file in /dev/shm, removed when dropped (if still there).
struct ShmFile(PathBuf);

impl ShmFile {
    fn new(name: &str, bytes: &[u8]) -> ShmFile {
        let path = Path::new("/dev/shm").join(name);
        std::fs::write(&path, bytes).expect("write /dev/shm file");
        ShmFile(path)
    }

    fn exists(&self) -> bool {
        std::fs::symlink_metadata(&self.0).is_ok()
    }
}

impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A name unique to this test process and call.
fn unique(stem: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{stem}-{}-{nanos:x}-{n}", std::process::id())
}

/// A 2×2-patch image item whose pixels are named by a shm handle; the
/// declared shape is `shape` and the handle's length `nbytes`.
fn shm_item(name: &str, shape: Vec<u32>, nbytes: u64) -> MultimodalItem {
    let mut it = item(0.5, 2, 2, b"");
    it.encoder_input = Some(TensorData {
        shape,
        dtype: "float32".into(),
        payload: Some(Payload::Shm(ShmHandle {
            name: name.into(),
            offset: 0,
            nbytes,
            owner_id: String::new(),
        })),
    });
    it
}

/// Bytes of a 4-patch float32 tensor of the tiny model.
const FOUR_PATCHES: u64 = 4 * PATCH_DIM as u64 * 4;

/// A caller that names another program's file, a symlink to a file
/// elsewhere, or a file of the wrong size gets a refusal and every file
/// stays; a missing file is refused in the very same words as an existing
/// wrong one. (Before, each of these files was unlinked on open.)
#[tokio::test]
async fn shm_handles_to_files_that_are_not_tensors_delete_nothing() {
    let model = model();
    let enc = start_with(args(&model, 64), std::sync::Arc::new(digest())).await;
    let (mut e, _) = clients(&enc).await;
    let size = FOUR_PATCHES as usize;

    let other = ShmFile::new(&unique("someone-elses-segment"), &vec![0u8; size]);
    let name = other.0.file_name().unwrap().to_str().unwrap().to_owned();
    let status = e
        .encode(request(
            vec![shm_item(&name, vec![4, PATCH_DIM], FOUR_PATCHES)],
            &[1],
        ))
        .await
        .expect_err("no allowed prefix");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(other.exists(), "another program's file is left alone");

    let outside = tempfile::tempdir().expect("tempdir");
    let target = outside.path().join("precious");
    std::fs::write(&target, vec![1u8; size]).expect("target");
    let link = ShmFile(Path::new("/dev/shm").join(unique("iris-tensor-link")));
    std::os::unix::fs::symlink(&target, &link.0).expect("symlink");
    let name = link.0.file_name().unwrap().to_str().unwrap().to_owned();
    let by_link = e
        .encode(request(
            vec![shm_item(&name, vec![4, PATCH_DIM], FOUR_PATCHES)],
            &[2],
        ))
        .await
        .expect_err("a symlink is not followed");
    assert!(
        link.exists() && target.exists(),
        "neither link nor target removed"
    );

    let long = ShmFile::new(&unique("iris-tensor-long"), &vec![0u8; size + 4]);
    let name = long.0.file_name().unwrap().to_str().unwrap().to_owned();
    let by_size = e
        .encode(request(
            vec![shm_item(&name, vec![4, PATCH_DIM], FOUR_PATCHES)],
            &[3],
        ))
        .await
        .expect_err("not exactly the declared tensor");
    assert!(
        long.exists(),
        "a file that is not the declared tensor stays"
    );

    let missing = unique("iris-tensor-missing");
    let by_absence = e
        .encode(request(
            vec![shm_item(&missing, vec![4, PATCH_DIM], FOUR_PATCHES)],
            &[4],
        ))
        .await
        .expect_err("no such file");
    for status in [&by_link, &by_size, &by_absence] {
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(
            status.message(),
            "item 0: encoder_input: shm handle refused"
        );
    }
}

/// A handle whose declared shape does not fit the model, or whose length
/// disagrees with its shape, is refused before the file is opened: a real
/// tensor file under that handle is neither read nor unlinked.
#[tokio::test]
async fn declared_shapes_are_checked_before_the_file_is_opened() {
    let model = model();
    let enc = start_with(args(&model, 64), std::sync::Arc::new(digest())).await;
    let (mut e, mut d) = clients(&enc).await;
    let file = ShmFile::new(
        &unique("iris-tensor-real"),
        &vec![0u8; FOUR_PATCHES as usize],
    );
    let name = file.0.file_name().unwrap().to_str().unwrap().to_owned();
    for (shape, nbytes) in [
        (vec![4, PATCH_DIM + 1], FOUR_PATCHES),
        (vec![4, PATCH_DIM], FOUR_PATCHES / 2),
        (vec![8, PATCH_DIM / 2], FOUR_PATCHES),
    ] {
        let status = e
            .encode(request(vec![shm_item(&name, shape.clone(), nbytes)], &[1]))
            .await
            .expect_err("refused before I/O");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{shape:?}: {status:?}"
        );
        assert!(file.exists(), "{shape:?}: the file was not consumed");
    }
    let unclaimed = fetch_waiting(&mut d, 1, 50).await.expect_err("no room");
    assert_eq!(unclaimed.code(), Code::NotFound);
    // The same handle, declared right, is read and consumed.
    e.encode(request(
        vec![shm_item(&name, vec![4, PATCH_DIM], FOUR_PATCHES)],
        &[2],
    ))
    .await
    .expect("accepted");
    assert!(!file.exists(), "a valid tensor is unlinked once read");
    fetch(&mut d, 2).await.expect("embedding");
}

/// An item above --max-patches-per-item, or above --max-batch-patches,
/// is refused with a message naming the limit, and claims no room.
#[tokio::test]
async fn items_larger_than_the_limits_are_refused_before_queueing() {
    let model = model();
    let per_item = EncoderArgs {
        max_patches_per_item: Some(8),
        ..args(&model, 64)
    };
    let enc = start_with(per_item, std::sync::Arc::new(digest())).await;
    let (mut e, mut d) = clients(&enc).await;
    let status = e
        .encode(request(vec![item(1.0, 4, 4, b"big")], &[1]))
        .await
        .expect_err("16 patches > 8");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("16 patches") && status.message().contains("(8:"),
        "{}",
        status.message()
    );
    assert_eq!(
        fetch_waiting(&mut d, 1, 50).await.unwrap_err().code(),
        Code::NotFound
    );
    e.encode(request(vec![item(1.0, 2, 2, b"small")], &[2]))
        .await
        .expect("4 patches fit");
    fetch(&mut d, 2).await.expect("embedding");

    let batch = EncoderArgs {
        max_batch_patches: 8,
        ..args(&model, 64)
    };
    let enc = start_with(batch, std::sync::Arc::new(digest())).await;
    let (mut e, _) = clients(&enc).await;
    let status = e
        .encode(request(vec![item(1.0, 4, 4, b"big")], &[1]))
        .await
        .expect_err("16 patches > a batch of 8");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

/// --max-message-mb bounds an Encode message: 1 MiB refuses an inline
/// image of 1.2 MB, while the default takes the largest item allowed.
#[tokio::test]
async fn encode_messages_are_bounded() {
    let model = model();
    let small = EncoderArgs {
        max_message_mb: Some(1),
        ..args(&model, 64)
    };
    let enc = start_with(small, std::sync::Arc::new(digest())).await;
    let (mut e, _) = clients(&enc).await;
    // 16 × 16 patches × 1176 × 4 bytes = 1.2 MB.
    let status = e
        .encode(request(vec![item(1.0, 16, 16, b"large")], &[1]))
        .await
        .expect_err("above 1 MiB");
    assert_ne!(status.code(), Code::Ok);
    e.encode(request(vec![item(1.0, 4, 4, b"fits")], &[2]))
        .await
        .expect("75 kB fits");

    let enc = start_with(args(&model, 64), std::sync::Arc::new(digest())).await;
    let (mut e, mut d) = clients(&enc).await;
    e.encode(request(vec![item(1.0, 16, 16, b"large")], &[1]))
        .await
        .expect("the default takes it");
    fetch(&mut d, 1).await.expect("embedding");
}
