//! `file://` URLs, served only from under the configured local media
//! directory.
//!
//! A path is first compared lexically with the directory (so nothing
//! outside it is even looked at, and the answer does not reveal whether a
//! file outside exists), then canonicalised (symlinks resolved) and
//! compared again, so a symlink inside the directory that points outside
//! is refused. Only regular files are read (no FIFOs or devices), at most
//! `max_bytes` of them.
//!
//! Residual risk: someone who can write inside the directory could swap a
//! checked path for a symlink between the check and the open. Remote API
//! clients cannot; the directory should not be writable by untrusted users.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use url::{Host, Url};

use crate::error::ConfigError;
use crate::MediaError;

/// The directory `file://` URLs may read under.
#[derive(Debug, Clone)]
pub(crate) struct LocalRoot {
    /// As configured, made absolute (may contain symlinks).
    configured: PathBuf,
    /// Canonical form.
    canonical: PathBuf,
}

impl LocalRoot {
    pub(crate) fn new(path: &Path) -> Result<Self, ConfigError> {
        let fail = |reason: String| ConfigError::LocalMediaPath {
            path: path.display().to_string(),
            reason,
        };
        let configured = std::path::absolute(path).map_err(|e| fail(e.to_string()))?;
        let canonical = std::fs::canonicalize(path).map_err(|e| fail(e.to_string()))?;
        if !canonical.is_dir() {
            return Err(fail("not a directory".to_owned()));
        }
        Ok(LocalRoot {
            configured,
            canonical,
        })
    }

    /// Reads the file `url` names, when it lies under this directory.
    pub(crate) async fn read(&self, url: &Url, max_bytes: u64) -> Result<Bytes, MediaError> {
        let path = self.local_path(url)?;
        let canonical = tokio::fs::canonicalize(&path)
            .await
            .map_err(|e| read_error(&e))?;
        if !canonical.starts_with(&self.canonical) {
            return Err(MediaError::FileNotAllowed);
        }
        read_regular_file(&canonical, max_bytes).await
    }

    /// The path of a `file://` URL with no host (or `localhost`), when it
    /// lexically lies under the directory.
    fn local_path(&self, url: &Url) -> Result<PathBuf, MediaError> {
        match url.host() {
            None => {}
            Some(Host::Domain(d)) if d.eq_ignore_ascii_case("localhost") => {}
            Some(_) => return Err(MediaError::FileNotAllowed),
        }
        let path = url
            .to_file_path()
            .map_err(|()| MediaError::FileNotAllowed)?;
        if path.starts_with(&self.configured) || path.starts_with(&self.canonical) {
            Ok(path)
        } else {
            Err(MediaError::FileNotAllowed)
        }
    }
}

fn read_error(e: &io::Error) -> MediaError {
    let reason = match e.kind() {
        io::ErrorKind::NotFound => "no such file".to_owned(),
        io::ErrorKind::PermissionDenied => "permission denied".to_owned(),
        _ => e.to_string(),
    };
    MediaError::FileRead(reason)
}

async fn read_regular_file(path: &Path, max_bytes: u64) -> Result<Bytes, MediaError> {
    let meta = tokio::fs::metadata(path)
        .await
        .map_err(|e| read_error(&e))?;
    if !meta.is_file() {
        return Err(MediaError::FileRead("not a regular file".to_owned()));
    }
    if meta.len() > max_bytes {
        return Err(MediaError::TooLarge {
            limit: max_bytes,
            size: Some(meta.len()),
        });
    }
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| read_error(&e))?;
    // The file may grow between stat and read: read one byte past the cap
    // to notice.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| read_error(&e))?;
    if bytes.len() as u64 > max_bytes {
        return Err(MediaError::TooLarge {
            limit: max_bytes,
            size: None,
        });
    }
    Ok(Bytes::from(bytes))
}
