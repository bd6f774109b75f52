//! Shared-memory lane: write, read and unlink, permissions, exclusive
//! creation, the clean-up guard, the orphan sweep and the identity token.
//! Files go to a temporary directory standing in for /dev/shm.

use std::fs;
use std::time::Duration;

use iris_transport::shm::{
    create_new_file, mode_of, owner_id, owner_pid, sweep_orphans, verify_identity, ShmError,
    ShmIdentity, ShmNames, ShmWriter,
};

fn dir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The receiver's allow-list in these tests: the defaults and the test
/// writers' prefixes.
fn names() -> ShmNames {
    ShmNames::default()
        .with_prefix("iris-test-")
        .and_then(|n| n.with_prefix("iris-transport-test-"))
        .unwrap()
}

fn read_and_unlink(
    dir: &std::path::Path,
    handle: &iris_proto::common::ShmHandle,
    expected: u64,
) -> Result<bytes::Bytes, ShmError> {
    iris_transport::shm::read_and_unlink(dir, handle, expected, &names())
}

#[test]
fn write_read_unlink() {
    let d = dir();
    let w = ShmWriter::new(d.path(), "iris-test").unwrap();
    let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
    let (handle, guard) = w.write(&data).unwrap();
    assert_eq!(handle.nbytes, 10_000);
    assert_eq!(handle.offset, 0);
    assert_eq!(handle.owner_id, owner_id());
    assert_eq!(
        owner_pid(&handle.name, "iris-test"),
        Some(std::process::id() as i32)
    );
    let path = d.path().join(&handle.name);
    assert_eq!(mode_of(&path).unwrap(), 0o600);
    guard.handed_over();
    let got = read_and_unlink(d.path(), &handle, 10_000).unwrap();
    assert_eq!(got.as_ref(), data.as_slice());
    assert!(!path.exists(), "the receiver unlinked the file");
    // A second read finds nothing, and says no more than any refusal.
    let err = read_and_unlink(d.path(), &handle, 10_000).unwrap_err();
    assert!(matches!(err, ShmError::Refused(_)), "{err:?}");
    assert_eq!(err.to_string(), "shm handle refused");
}

#[test]
fn unaligned_offsets_map_the_right_bytes_and_outlive_the_file() {
    let d = dir();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut kept = Vec::new();
    for (offset, nbytes) in [
        (1u64, 9_000u64),
        (4095, 2),
        (4096, 15_904),
        (19_999, 1),
        (7, 0),
    ] {
        let name = format!("iris-test-1-{offset:016x}");
        let end = (offset + nbytes) as usize;
        create_new_file(&d.path().join(&name), &data[..end]).unwrap();
        let handle = iris_proto::common::ShmHandle {
            name,
            offset,
            nbytes,
            owner_id: owner_id(),
        };
        let got = read_and_unlink(d.path(), &handle, nbytes).unwrap();
        let (start, end) = (offset as usize, (offset + nbytes) as usize);
        assert_eq!(got.as_ref(), &data[start..end], "offset {offset}");
        assert!(!d.path().join(&handle.name).exists());
        kept.push((got, start, end));
    }
    // The bytes stay readable after the files and their directory are gone.
    drop(d);
    for (got, start, end) in kept {
        assert_eq!(got.as_ref(), &data[start..end]);
    }
}

#[test]
fn leading_slash_names_are_accepted_and_escapes_refused() {
    let d = dir();
    let w = ShmWriter::new(d.path(), "iris-test").unwrap();
    let (mut handle, guard) = w.write(b"12345678").unwrap();
    handle.name = format!("/{}", handle.name);
    assert_eq!(
        read_and_unlink(d.path(), &handle, 8).unwrap().as_ref(),
        b"12345678"
    );
    drop(guard);
    for bad in ["../etc/passwd", "a/b", "", "/", "..", "x\0y"] {
        handle.name = bad.into();
        assert!(
            matches!(
                read_and_unlink(d.path(), &handle, 8),
                Err(ShmError::BadName(_))
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn size_mismatch_is_an_error_and_short_files_are_caught() {
    let d = dir();
    let w = ShmWriter::new(d.path(), "iris-test").unwrap();
    let (mut handle, _guard) = w.write(&[1u8; 16]).unwrap();
    let err = read_and_unlink(d.path(), &handle, 24).unwrap_err();
    assert!(
        matches!(
            err,
            ShmError::SizeMismatch {
                handle: 16,
                expected: 24
            }
        ),
        "{err}"
    );
    assert!(
        d.path().join(&handle.name).exists(),
        "a refused handle leaves the file to its guard"
    );
    handle.nbytes = 24;
    let err = read_and_unlink(d.path(), &handle, 24).unwrap_err();
    assert!(matches!(err, ShmError::Refused(_)), "{err}");
    assert!(err.detail().contains("16 bytes"), "{}", err.detail());
    assert!(d.path().join(&handle.name).exists(), "a short file is kept");
}

#[test]
fn create_new_refuses_an_existing_file() {
    let d = dir();
    let path = d.path().join("taken");
    fs::write(&path, b"someone else's").unwrap();
    let err = create_new_file(&path, b"mine").unwrap_err();
    assert!(matches!(err, ShmError::Io { op: "create", .. }), "{err}");
    assert_eq!(
        fs::read(&path).unwrap(),
        b"someone else's",
        "left intact, not removed"
    );
    let fresh = d.path().join("fresh");
    create_new_file(&fresh, b"mine").unwrap();
    assert_eq!(fs::read(&fresh).unwrap(), b"mine");
    assert_eq!(mode_of(&fresh).unwrap(), 0o600);
    // Every write gets a fresh name.
    let w = ShmWriter::new(d.path(), "iris-test").unwrap();
    let (h1, _g1) = w.write(b"a").unwrap();
    let (h2, _g2) = w.write(b"b").unwrap();
    assert_ne!(h1.name, h2.name);
}

#[test]
fn guard_removes_the_file_unless_handed_over() {
    let d = dir();
    let w = ShmWriter::new(d.path(), "iris-test").unwrap();
    let (h, guard) = w.write(b"dropped").unwrap();
    let path = d.path().join(&h.name);
    assert!(path.exists());
    drop(guard);
    assert!(
        !path.exists(),
        "dropping the guard (error or cancellation) unlinks"
    );
    let (h, guard) = w.write(b"kept").unwrap();
    guard.handed_over();
    assert!(
        d.path().join(&h.name).exists(),
        "handed over: the receiver owns it now"
    );
    // The receiver already unlinked: the guard's unlink is harmless.
    let (h, guard) = w.write(b"raced").unwrap();
    read_and_unlink(d.path(), &h, 5).unwrap();
    drop(guard);
}

#[test]
fn failed_write_leaves_no_file() {
    let d = dir();
    let missing = d.path().join("not-there");
    let w = ShmWriter::new(&missing, "iris-test").unwrap();
    assert!(matches!(
        w.write(b"x"),
        Err(ShmError::Io { op: "create", .. })
    ));
    assert!(ShmWriter::new(d.path(), "bad/prefix").is_err());
    assert!(ShmWriter::new(d.path(), "").is_err());
}

fn dead_pid() -> i32 {
    // A child that has exited and been reaped: its pid is free.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

#[test]
fn sweep_removes_only_dead_owners_files() {
    let d = dir();
    let dead = dead_pid();
    let me = std::process::id();
    let orphan = format!("iris-test-{dead}-00000000deadbeef");
    let live = format!("iris-test-{me}-00000000cafef00d");
    let other = format!("other-{dead}-00000000deadbeef");
    let odd = "iris-test-notapid-1234".to_owned();
    for n in [&orphan, &live, &other, &odd] {
        fs::write(d.path().join(n), b"x").unwrap();
    }
    let report = sweep_orphans(d.path(), "iris-test", Duration::ZERO).unwrap();
    assert_eq!(report.removed, vec![orphan.clone()]);
    assert!(!d.path().join(&orphan).exists());
    for n in [&live, &other, &odd] {
        assert!(d.path().join(n).exists(), "{n} kept");
    }
}

#[test]
fn sweep_spares_young_files() {
    let d = dir();
    let orphan = format!("iris-test-{}-00000000deadbeef", dead_pid());
    fs::write(d.path().join(&orphan), b"x").unwrap();
    let report = sweep_orphans(d.path(), "iris-test", Duration::from_secs(3600)).unwrap();
    assert!(report.removed.is_empty());
    assert_eq!(report.kept, 1);
}

#[test]
fn identity_verifies_only_in_the_same_directory() {
    let here = dir();
    let elsewhere = dir();
    let id = ShmIdentity::publish(here.path(), "iris-shmid").unwrap();
    assert!(verify_identity(here.path(), id.identity()));
    assert!(
        !verify_identity(elsewhere.path(), id.identity()),
        "another /dev/shm"
    );
    let (name, token) = id.identity().rsplit_once(':').unwrap();
    let wrong = format!("{name}:{}", "0".repeat(token.len()));
    assert!(!verify_identity(here.path(), &wrong), "wrong token");
    assert!(!verify_identity(here.path(), "garbage"));
    assert!(!verify_identity(here.path(), "../x:0123456789abcdef0123"));
    let path = here.path().join(name);
    assert_eq!(mode_of(&path).unwrap(), 0o600);
    drop(id);
    assert!(!path.exists(), "the token file goes with its publisher");
}

#[test]
fn real_dev_shm_round_trip_and_identity() {
    let shm = std::path::Path::new(iris_transport::shm::DEFAULT_SHM_DIR);
    let w = ShmWriter::new(shm, "iris-transport-test").unwrap();
    let (handle, guard) = w.write(&[7u8; 4096]).unwrap();
    assert_eq!(mode_of(&shm.join(&handle.name)).unwrap(), 0o600);
    guard.handed_over();
    assert_eq!(
        read_and_unlink(shm, &handle, 4096).unwrap().as_ref(),
        &[7u8; 4096][..]
    );
    assert!(!shm.join(&handle.name).exists());
    let id = ShmIdentity::publish(shm, "iris-transport-test-id").unwrap();
    assert!(verify_identity(shm, id.identity()));
}

/// A handle for `name` in a test directory, asking for `nbytes` at 0.
fn handle_for(name: &str, nbytes: u64) -> iris_proto::common::ShmHandle {
    iris_proto::common::ShmHandle {
        name: name.into(),
        offset: 0,
        nbytes,
        owner_id: String::new(),
    }
}

/// Asserts a refusal that says nothing about the file, and that the file
/// (or link, FIFO, directory) is still there.
fn assert_refused_and_kept(d: &std::path::Path, name: &str, nbytes: u64) {
    let err = read_and_unlink(d, &handle_for(name, nbytes), nbytes).unwrap_err();
    assert!(matches!(err, ShmError::Refused(_)), "{name}: {err:?}");
    assert_eq!(err.to_string(), "shm handle refused", "{name}");
    assert!(
        fs::symlink_metadata(d.join(name)).is_ok(),
        "{name} must not be unlinked"
    );
}

/// Only names with a known sender's prefix are opened: anything else in
/// the directory, however well sized, is refused untouched.
#[test]
fn names_without_an_allowed_prefix_are_refused_untouched() {
    let d = dir();
    for name in ["victim", "iris-shmid-1-00", "iris-tensor", "iris-testx-1"] {
        fs::write(d.path().join(name), [0u8; 8]).unwrap();
        let err = read_and_unlink(d.path(), &handle_for(name, 8), 8).unwrap_err();
        assert!(matches!(err, ShmError::Unlisted(_)), "{name}: {err:?}");
        assert!(d.path().join(name).exists(), "{name} kept");
    }
    let defaults = ShmNames::default();
    assert!(defaults.allows("iris-tensor-1-00ff"));
    assert!(defaults.allows("smg-tokenspeed-7-1-2"));
    assert!(
        !defaults.allows("iris-shmid-1-00ff"),
        "identity files never"
    );
    assert!(
        !defaults.allows("smg-tokenspeed-"),
        "a bare prefix is no name"
    );
    assert!(ShmNames::default().with_prefix("bad/prefix").is_err());
}

/// A symlink is never followed (neither its target read nor it removed),
/// and a FIFO, a directory, a world-writable file or a file longer than
/// the declared tensor is refused and left in place.
#[test]
fn links_fifos_directories_shared_and_oversized_files_are_refused_and_kept() {
    let d = dir();
    let outside = dir();
    let target = outside.path().join("secret");
    fs::write(&target, [1u8; 8]).unwrap();
    std::os::unix::fs::symlink(&target, d.path().join("iris-test-link")).unwrap();
    assert_refused_and_kept(d.path(), "iris-test-link", 8);
    assert!(target.exists(), "the link's target is untouched");

    let fifo = std::ffi::CString::new(
        d.path()
            .join("iris-test-fifo")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    assert_refused_and_kept(d.path(), "iris-test-fifo", 8);

    fs::create_dir(d.path().join("iris-test-dir")).unwrap();
    assert_refused_and_kept(d.path(), "iris-test-dir", 8);

    let shared = d.path().join("iris-test-shared");
    fs::write(&shared, [2u8; 8]).unwrap();
    fs::set_permissions(&shared, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    assert_refused_and_kept(d.path(), "iris-test-shared", 8);

    fs::write(d.path().join("iris-test-long"), [3u8; 9]).unwrap();
    assert_refused_and_kept(d.path(), "iris-test-long", 8);

    // A missing file reads exactly like all of these.
    let err = read_and_unlink(d.path(), &handle_for("iris-test-none", 8), 8).unwrap_err();
    assert_eq!(err.to_string(), "shm handle refused");
}
