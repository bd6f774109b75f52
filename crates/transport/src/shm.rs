//! The shared-memory lane: a tensor written once into a file under
//! `/dev/shm`, handed over as a `ShmHandle`, read and unlinked by the receiver.
//!
//! Ownership: the sender creates `<prefix>-<pid>-<random>` (`O_CREAT|O_EXCL`,
//! mode 0600) and holds a [`ShmGuard`] that unlinks it on drop. Once the
//! receiver has acknowledged the message (the RPC succeeded) the sender calls
//! [`ShmGuard::handed_over`] and from then on only the receiver unlinks (it
//! does so once it has checked and mapped the file, before answering; it
//! maps the file rather than copying it, and the pages are freed with the
//! last mapping). On every other path — error, timeout, cancellation, a
//! retry elsewhere — the guard unlinks; an unlink of an already removed
//! file is ignored. A file left by a process that died is removed by
//! [`sweep_orphans`] at the next start.
//!
//! The receiver trusts no handle ([`read_and_unlink`]): it opens only
//! names with a known sender's prefix ([`ShmNames`]), never follows a
//! symlink, takes only regular files of its own user that nobody else may
//! write and that hold exactly the declared tensor, and unlinks nothing
//! else. Every refusal that involves the file reads "shm handle refused",
//! whether the file is missing, foreign or the wrong size.
//!
//! "Same /dev/shm" is proven with [`ShmIdentity`]: one side publishes a
//! token file and its identity string, the other reads the file back. A
//! TokenSpeed worker reports its tmpfs's [`namespace_id`] instead
//! (`<boot id>:<st_dev>`), compared with this process's by
//! [`same_namespace`].

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use iris_proto::common::ShmHandle;

/// Where POSIX shared memory lives on Linux.
pub const DEFAULT_SHM_DIR: &str = "/dev/shm";
/// Default name prefix of tensor files.
pub const DEFAULT_PREFIX: &str = "iris-tensor";
/// Default name prefix of identity token files.
pub const IDENTITY_PREFIX: &str = "iris-shmid";
/// Name prefix of the tensor files smg's gateway writes for TokenSpeed
/// workers (`smg-tokenspeed-<pid>-…`), accepted by default.
pub const SMG_PREFIX: &str = "smg-tokenspeed-";

/// Why a shared-memory operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("shared-memory name {0:?} is not a plain file name")]
    BadName(String),
    #[error("shared-memory prefix {0:?} must be non-empty ASCII letters, digits, '-' or '_'")]
    BadPrefix(String),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("shared-memory handle says {handle} bytes but the tensor needs {expected}")]
    SizeMismatch { handle: u64, expected: u64 },
    /// The name has none of the allowed senders' prefixes ([`ShmNames`]).
    #[error("shm handle refused: the name has no allowed sender prefix")]
    Unlisted(String),
    /// The file is missing, not a regular file, not this user's, writable
    /// by others or not exactly the declared tensor. The message says none
    /// of that (a caller must not learn which files exist or their sizes);
    /// [`ShmError::detail`] does, for the receiver's own debug log.
    #[error("shm handle refused")]
    Refused(String),
}

impl ShmError {
    /// What a [`ShmError::Refused`] hides (else the message itself): for
    /// the receiver's debug log, never for the caller.
    pub fn detail(&self) -> String {
        match self {
            ShmError::Refused(detail) => detail.clone(),
            other => other.to_string(),
        }
    }
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> ShmError + 'a {
    move |source| ShmError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// This process's owner id: `<boot id>:<pid>` (boot id from the kernel, or
/// `unknown-boot` where it cannot be read).
pub fn owner_id() -> String {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown-boot".to_owned());
    format!("{boot}:{}", std::process::id())
}

fn check_prefix(prefix: &str) -> Result<(), ShmError> {
    let ok = !prefix.is_empty()
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ShmError::BadPrefix(prefix.to_owned()))
    }
}

/// A fresh `<prefix>-<pid>-<16 hex digits>` name.
fn fresh_name(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
}

/// A handle's name as a plain file name: an optional leading `/` (as
/// `shm_open` names have) and nothing else that could leave the directory.
pub fn plain_name(name: &str) -> Result<&str, ShmError> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    let ok = !bare.is_empty() && bare != "." && bare != ".." && !bare.contains(['/', '\0']);
    if ok {
        Ok(bare)
    } else {
        Err(ShmError::BadName(name.to_owned()))
    }
}

/// Creates `path` exclusively with mode 0600 and writes `data`. A file
/// this call created is removed again if the write fails; an existing file
/// (someone else's) is left alone.
pub fn create_new_file(path: &Path, data: &[u8]) -> Result<(), ShmError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))?;
    file.write_all(data)
        .map_err(io_err("write", path))
        .inspect_err(|_| remove_quietly(path))
}

/// Writes tensors into the shm directory (the sender side).
#[derive(Debug, Clone)]
pub struct ShmWriter {
    dir: PathBuf,
    prefix: String,
    owner: String,
}

impl ShmWriter {
    /// A writer into `dir` (normally [`DEFAULT_SHM_DIR`]) naming files `<prefix>-<pid>-<random>`.
    pub fn new(dir: impl Into<PathBuf>, prefix: &str) -> Result<ShmWriter, ShmError> {
        check_prefix(prefix)?;
        Ok(ShmWriter {
            dir: dir.into(),
            prefix: prefix.to_owned(),
            owner: owner_id(),
        })
    }

    /// The directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `data` once into a new file and returns its handle and guard.
    /// On any failure the partly written file is already removed.
    pub fn write(&self, data: &[u8]) -> Result<(ShmHandle, ShmGuard), ShmError> {
        let name = fresh_name(&self.prefix);
        let path = self.dir.join(&name);
        create_new_file(&path, data)?;
        let guard = ShmGuard { path: Some(path) };
        let handle = ShmHandle {
            name,
            offset: 0,
            nbytes: data.len() as u64,
            owner_id: self.owner.clone(),
        };
        Ok((handle, guard))
    }
}

fn remove_quietly(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a shared-memory file")
        }
    }
}

/// Unlinks the sender's file on drop unless ownership was handed over.
#[derive(Debug)]
#[must_use = "dropping the guard removes the shared-memory file"]
pub struct ShmGuard {
    path: Option<PathBuf>,
}

impl ShmGuard {
    /// The receiver acknowledged the message: it unlinks the file now.
    pub fn handed_over(mut self) {
        self.path.take();
    }

    /// The file this guard removes.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl Drop for ShmGuard {
    fn drop(&mut self) {
        if let Some(path) = self.path.take() {
            remove_quietly(&path);
        }
    }
}

/// The shm names a receiver opens: those starting with one of its
/// prefixes. By default Iris's own gateway's (`iris-tensor-`) and smg's
/// ([`SMG_PREFIX`]); a receiver adds other senders' with
/// [`ShmNames::with_prefix`]. The identity token files are never on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmNames {
    prefixes: Vec<String>,
}

impl Default for ShmNames {
    fn default() -> Self {
        ShmNames {
            prefixes: vec![format!("{DEFAULT_PREFIX}-"), SMG_PREFIX.to_owned()],
        }
    }
}

impl ShmNames {
    /// Also accepts names starting with `prefix` (letters, digits, `-`, `_`).
    pub fn with_prefix(mut self, prefix: &str) -> Result<ShmNames, ShmError> {
        check_prefix(prefix)?;
        if !self.prefixes.iter().any(|p| p == prefix) {
            self.prefixes.push(prefix.to_owned());
        }
        Ok(self)
    }

    /// The accepted prefixes.
    pub fn prefixes(&self) -> &[String] {
        &self.prefixes
    }

    /// Whether the plain file name `name` has an accepted prefix (and more).
    pub fn allows(&self, name: &str) -> bool {
        self.prefixes
            .iter()
            .any(|p| name.len() > p.len() && name.starts_with(p.as_str()))
    }
}

/// Reads a handle's bytes from `dir` and unlinks the file (the receiver
/// side). `expected` is shape × dtype size; the handle must agree with it.
///
/// Checked before any file is touched: the name is a plain file name with
/// a prefix `names` allows, and `nbytes` is `expected`. Then the file is
/// opened without following symlinks (and without blocking on a FIFO),
/// and must be a regular file owned by this process's user, writable by
/// nobody else, exactly `offset + nbytes` long. Only a file that passed
/// all of this and was mapped is unlinked (and only if its name still
/// points at it); anything else is left where it is.
pub fn read_and_unlink(
    dir: &Path,
    handle: &ShmHandle,
    expected: u64,
    names: &ShmNames,
) -> Result<Bytes, ShmError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    read_owned_by(dir, handle, expected, names, me)
}

/// [`read_and_unlink`] taking only files owned by `owner`.
fn read_owned_by(
    dir: &Path,
    handle: &ShmHandle,
    expected: u64,
    names: &ShmNames,
    owner: u32,
) -> Result<Bytes, ShmError> {
    if handle.nbytes != expected {
        return Err(ShmError::SizeMismatch {
            handle: handle.nbytes,
            expected,
        });
    }
    let name = plain_name(&handle.name)?;
    if !names.allows(name) {
        return Err(ShmError::Unlisted(handle.name.clone()));
    }
    let path = dir.join(name);
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| refused(&path, format!("open: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| refused(&path, format!("fstat: {e}")))?;
    check_file(&meta, owner, handle.offset, handle.nbytes).map_err(|why| refused(&path, why))?;
    let data = map_range(&file, handle.offset, handle.nbytes)
        .map_err(|e| refused(&path, format!("map: {e}")))?;
    unlink_if_same(&path, &meta);
    Ok(data)
}

/// A [`ShmError::Refused`] whose detail names the file and the reason.
fn refused(path: &Path, why: String) -> ShmError {
    ShmError::Refused(format!("{}: {why}", path.display()))
}

/// The opened file may be taken: a regular file of `owner` (this
/// process's user), writable by nobody else (so no other user can truncate
/// it under the mapping), of exactly `offset + nbytes` bytes.
fn check_file(meta: &fs::Metadata, owner: u32, offset: u64, nbytes: u64) -> Result<(), String> {
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != owner {
        return Err(format!("owned by uid {}, not {owner}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "mode {:o} lets others write it",
            meta.mode() & 0o777
        ));
    }
    let end = offset
        .checked_add(nbytes)
        .ok_or("offset + nbytes overflows")?;
    if meta.len() != end {
        return Err(format!(
            "{} bytes, not offset {offset} + nbytes {nbytes}",
            meta.len()
        ));
    }
    Ok(())
}

/// Removes `path` if it still names the file `meta` describes (nobody
/// swapped it since it was opened).
fn unlink_if_same(path: &Path, meta: &fs::Metadata) {
    match fs::symlink_metadata(path) {
        Ok(now) if now.dev() == meta.dev() && now.ino() == meta.ino() => remove_quietly(path),
        Ok(_) => {
            tracing::debug!(path = %path.display(), "shm name now points elsewhere: not unlinked")
        }
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "shm file gone before unlink")
        }
    }
}

fn map_range(file: &File, offset: u64, nbytes: u64) -> io::Result<Bytes> {
    let size = usize::try_from(nbytes).map_err(|_| io::Error::other("too large"))?;
    if size == 0 {
        return Ok(Bytes::new());
    }
    // Mapped, not copied: the tensor's pages are already in memory (tmpfs),
    // so a populated read-only mapping hands them over without a copy or a
    // page fault per page. Only this user can write the file (checked), and
    // the sender (the gateway) closes its descriptor after the one write and
    // never truncates, so the mapped range stays backed.
    // SAFETY: the mapping is read-only and private to this receiver; the
    // range was checked against the file's length.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(offset)
            .len(size)
            .populate()
            .map(file)
    }?;
    Ok(Bytes::from_owner(map))
}

/// What [`sweep_orphans`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Files removed (their owner pid is dead).
    pub removed: Vec<String>,
    /// Files of this prefix kept (owner alive, too young, or unparsable).
    pub kept: usize,
}

/// The pid encoded in `<prefix>-<pid>-<random>`, if `name` is such a name.
pub fn owner_pid(name: &str, prefix: &str) -> Option<i32> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('-')?;
    let (pid, random) = rest.split_once('-')?;
    if random.is_empty() || !random.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    pid.parse::<i32>().ok().filter(|p| *p > 0)
}

/// Whether a process with `pid` exists (as seen from this pid namespace).
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission; no signal is sent.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes files `<prefix>-<pid>-<random>` in `dir` whose pid is dead and
/// that are older than `min_age` (a guard against another pid namespace
/// sharing the directory). Run once at start-up.
pub fn sweep_orphans(dir: &Path, prefix: &str, min_age: Duration) -> Result<SweepReport, ShmError> {
    check_prefix(prefix)?;
    let mut report = SweepReport::default();
    for entry in fs::read_dir(dir).map_err(io_err("list", dir))? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name, prefix) else {
            continue;
        };
        let old_enough = entry
            .metadata()
            .and_then(|m| m.modified())
            .map(|t| t.elapsed().map(|age| age >= min_age).unwrap_or(false))
            .unwrap_or(false);
        if pid_alive(pid) || !old_enough {
            report.kept += 1;
            continue;
        }
        match fs::remove_file(entry.path()) {
            Ok(()) => report.removed.push(name),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(_) => report.kept += 1,
        }
    }
    Ok(report)
}

/// A published "same /dev/shm" token: a mode-0600 file holding a random
/// token, removed on drop. Its [`ShmIdentity::identity`] string
/// (`<file name>:<token>`) travels to the peer (e.g. in `GetServerInfo`),
/// which calls [`verify_identity`] against its own shm directory.
#[derive(Debug)]
pub struct ShmIdentity {
    path: PathBuf,
    identity: String,
}

impl ShmIdentity {
    /// Writes a fresh token file into `dir`.
    pub fn publish(dir: &Path, prefix: &str) -> Result<ShmIdentity, ShmError> {
        check_prefix(prefix)?;
        let name = fresh_name(prefix);
        let token = format!(
            "{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let path = dir.join(&name);
        create_new_file(&path, token.as_bytes())?;
        Ok(ShmIdentity {
            path,
            identity: format!("{name}:{token}"),
        })
    }

    /// The string to hand to the peer.
    pub fn identity(&self) -> &str {
        &self.identity
    }
}

impl Drop for ShmIdentity {
    fn drop(&mut self) {
        remove_quietly(&self.path);
    }
}

/// True when `identity` (from a peer's [`ShmIdentity`]) names a token file
/// in `dir` holding that very token: the peer shares this `/dev/shm`.
/// Any malformed identity or unreadable file is simply `false`.
pub fn verify_identity(dir: &Path, identity: &str) -> bool {
    let Some((name, token)) = identity.rsplit_once(':') else {
        return false;
    };
    if token.len() < 16 {
        return false;
    }
    let Ok(name) = plain_name(name) else {
        return false;
    };
    let path = dir.join(name);
    // The token file is tiny; refuse anything large rather than read it.
    match fs::metadata(&path) {
        Ok(m) if m.is_file() && m.len() <= 256 => {}
        _ => return false,
    }
    fs::read(&path)
        .map(|b| b == token.as_bytes())
        .unwrap_or(false)
}

/// The identity of the tmpfs behind `dir` as TokenSpeed workers report
/// it in GetServerInfo's `scheduler_info` ([`crate::SHM_NAMESPACE_FIELD`]):
/// `<boot id>:<st_dev>`, the kernel's boot id and the device number of
/// `dir`'s filesystem in decimal. Two processes with the same value see
/// the same `/dev/shm` (containers sharing it by a bind mount or the IPC
/// namespace included). `None` when either part cannot be read.
pub fn namespace_id(dir: &Path) -> Option<String> {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim();
    let dev = fs::metadata(dir).ok()?.dev();
    (!boot.is_empty()).then(|| format!("{boot}:{dev}"))
}

/// True when a peer's reported namespace id (see [`namespace_id`]) equals
/// this process's for `dir`: the peer shares that `/dev/shm`. An empty or
/// unreadable id on either side is `false`.
pub fn same_namespace(dir: &Path, theirs: &str) -> bool {
    !theirs.is_empty() && namespace_id(dir).is_some_and(|ours| ours == theirs)
}

/// The permission bits of a file (tests and diagnostics).
pub fn mode_of(path: &Path) -> io::Result<u32> {
    Ok(fs::metadata(path)?.permissions().mode() & 0o777)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of another user is refused and kept, with the same message
    /// as a missing one (tested as a reader of another uid, so it runs as
    /// any user).
    #[test]
    fn another_users_file_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let name = "iris-tensor-1-00000000000000aa";
        create_new_file(&dir.path().join(name), &[5u8; 16]).unwrap();
        let handle = ShmHandle {
            name: name.into(),
            offset: 0,
            nbytes: 16,
            owner_id: String::new(),
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let other = unsafe { libc::geteuid() }.wrapping_add(1);
        let names = ShmNames::default();
        let err = read_owned_by(dir.path(), &handle, 16, &names, other).unwrap_err();
        assert_eq!(err.to_string(), "shm handle refused");
        assert!(err.detail().contains("owned by uid"), "{}", err.detail());
        assert!(dir.path().join(name).exists(), "not unlinked");
        let data = read_and_unlink(dir.path(), &handle, 16, &names).unwrap();
        assert_eq!(data.as_ref(), &[5u8; 16]);
        assert!(
            !dir.path().join(name).exists(),
            "its owner's reader unlinks"
        );
    }

    #[test]
    fn the_namespace_id_is_the_boot_id_and_the_filesystems_device() {
        let dir = tempfile::tempdir().unwrap();
        let ours = namespace_id(dir.path()).expect("readable");
        let (boot, dev) = ours.rsplit_once(':').unwrap();
        let kernel = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(boot, kernel.trim());
        assert_eq!(
            dev.parse::<u64>().unwrap(),
            dir.path().metadata().unwrap().dev()
        );
        assert!(same_namespace(dir.path(), &ours));
        // Another filesystem, another boot, nothing reported: not shared.
        assert!(!same_namespace(
            dir.path(),
            &format!("{boot}:{}", dev.parse::<u64>().unwrap() + 1)
        ));
        assert!(!same_namespace(
            dir.path(),
            &format!("00000000-0000-0000-0000-000000000000:{dev}")
        ));
        assert!(!same_namespace(dir.path(), ""));
        assert_eq!(namespace_id(&dir.path().join("missing")), None);
    }
}
