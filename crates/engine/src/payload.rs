//! Reading a tensor's bytes from whichever payload carries them.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use iris_proto::common::ShmHandle;
use iris_proto::scheduler::{tensor_data::Payload, TensorData};
use tonic::Status;

/// Where POSIX shared-memory objects live.
const SHM_DIR: &str = "/dev/shm";

/// The bytes of `tensor`. Inline payloads are shared, not copied; shared
/// memory is read and unlinked (blocking: runs on the blocking pool).
pub async fn read(tensor: &TensorData) -> Result<Bytes, Status> {
    match &tensor.payload {
        Some(Payload::Inline(bytes)) => Ok(bytes.clone()),
        Some(Payload::Shm(handle)) => {
            let handle = handle.clone();
            tokio::task::spawn_blocking(move || read_shm(Path::new(SHM_DIR), &handle))
                .await
                .map_err(|e| Status::internal(format!("shared-memory read task failed: {e}")))?
        }
        Some(Payload::Remote(handle)) => Err(Status::failed_precondition(format!(
            "remote tensor transport {:?} is not enabled on this worker; send the tensor inline or in shared memory",
            handle.transport
        ))),
        None => Err(Status::invalid_argument("tensor has no payload")),
    }
}

/// Reads `handle` under `dir` and unlinks the object, whatever the outcome.
pub fn read_shm(dir: &Path, handle: &ShmHandle) -> Result<Bytes, Status> {
    let path = shm_path(dir, &handle.name)?;
    let result = read_range(&path, handle.offset, handle.nbytes);
    // The reader owns the object once it has the handle.
    let _ = std::fs::remove_file(&path);
    result
}

fn shm_path(dir: &Path, name: &str) -> Result<PathBuf, Status> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    let valid = !bare.is_empty()
        && bare != "."
        && bare != ".."
        && !bare.contains('/')
        && !bare.contains('\0');
    if !valid {
        return Err(Status::invalid_argument(format!(
            "invalid shared-memory object name {name:?}"
        )));
    }
    Ok(dir.join(bare))
}

fn read_range(path: &Path, offset: u64, nbytes: u64) -> Result<Bytes, Status> {
    use std::io::{Read, Seek, SeekFrom};
    let not_found = |e: std::io::Error| {
        Status::not_found(format!("shared-memory object {}: {e}", path.display()))
    };
    let mut file = std::fs::File::open(path).map_err(not_found)?;
    let size = file.metadata().map_err(not_found)?.len();
    let end = offset.checked_add(nbytes).filter(|end| *end <= size).ok_or_else(|| {
        Status::invalid_argument(format!(
            "shared-memory object {} has {size} bytes; the handle asks for {nbytes} at offset {offset}",
            path.display()
        ))
    })?;
    let len = usize::try_from(end - offset)
        .map_err(|_| Status::invalid_argument("shared-memory range too large for this host"))?;
    let mut buf = vec![0u8; len];
    file.seek(SeekFrom::Start(offset)).map_err(not_found)?;
    file.read_exact(&mut buf).map_err(not_found)?;
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(name: &str, offset: u64, nbytes: u64) -> ShmHandle {
        ShmHandle {
            name: name.into(),
            offset,
            nbytes,
            owner_id: "test".into(),
        }
    }

    #[test]
    fn reads_range_and_unlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("obj"), b"0123456789").unwrap();
        let bytes = read_shm(dir.path(), &handle("/obj", 2, 5)).unwrap();
        assert_eq!(&bytes[..], b"23456");
        assert!(!dir.path().join("obj").exists());
    }

    #[test]
    fn refuses_bad_names_and_ranges() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["", "..", "a/b", "/../etc"] {
            let err = read_shm(dir.path(), &handle(name, 0, 1)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name}");
        }
        std::fs::write(dir.path().join("short"), b"abc").unwrap();
        let err = read_shm(dir.path(), &handle("short", 1, 5)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(!dir.path().join("short").exists(), "unlinked even on error");
        let err = read_shm(dir.path(), &handle("missing", 0, 1)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
    }
}
