//! Whether readers on other hosts READ the gateway's arena one-sided.
//!
//! Over an RDMA NIC (UCX's `rc`/`dc` transports) a reader's READ is served
//! by the NIC; on one host `cma` reads the sender's memory directly. Over
//! `tcp`, UCX has no one-sided READ: the sender's own UCX worker answers
//! each READ request ("software emulation" in `UCX_PROTO_INFO`). UCX 1.23
//! (the one NIXL 1.5 ships) ends the whole sending process with
//! `Fatal: unexpected error` when that answer fails because the reader
//! died mid-READ. The gateway cannot catch that abort, so it says at start
//! when its configuration leaves remote readers on the software path.

use std::path::Path;

/// UCX transports (and aliases) with one-sided READs across hosts.
const REMOTE_ONE_SIDED: &[&str] = &[
    "ib", "rc", "rc_v", "rc_verbs", "rc_x", "rc_mlx5", "dc", "dc_x", "dc_mlx5", "gga", "gga_mlx5",
];

/// Where the kernel lists RDMA devices.
pub const RDMA_DEVICES: &str = "/sys/class/infiniband";

/// Why READs from other hosts would be served in software by this process,
/// or `None` when they are one-sided. `ucx_tls` is `UCX_TLS` as set (an
/// unset, `all` or `^`-exclusion list lets UCX pick from the hardware, so
/// then `rdma_devices` decides).
pub fn software_read_reason(ucx_tls: Option<&str>, rdma_devices: bool) -> Option<String> {
    let tls = ucx_tls.map(str::trim).filter(|t| !t.is_empty());
    let picks_from_hardware = match tls {
        None => true,
        Some(t) => t.starts_with('^') || entries(t).any(|e| e == "all"),
    };
    if picks_from_hardware {
        return (!rdma_devices).then(|| {
            format!("this host has no RDMA device ({RDMA_DEVICES} is empty), so UCX reaches other hosts over tcp")
        });
    }
    let tls = tls.unwrap_or_default();
    let one_sided = entries(tls).any(|e| REMOTE_ONE_SIDED.contains(&e));
    (!one_sided).then(|| format!("UCX_TLS={tls} names no RDMA transport (rc, dc or ib)"))
}

/// `UCX_TLS`'s entries, without a `:aux`-style qualifier.
fn entries(tls: &str) -> impl Iterator<Item = &str> {
    tls.split(',')
        .map(|e| e.split(':').next().unwrap_or(e).trim())
        .filter(|e| !e.is_empty())
}

/// Whether `dir` lists at least one RDMA device.
pub fn has_rdma_devices(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// [`software_read_reason`] for this process's environment and host, with
/// what it means for the operator.
pub fn software_read_warning() -> Option<String> {
    let tls = std::env::var("UCX_TLS").ok();
    let reason = software_read_reason(tls.as_deref(), has_rdma_devices(Path::new(RDMA_DEVICES)))?;
    Some(format!(
        "{reason}: encoders on other hosts READ the arena through this process's UCX \
         (software emulation), and UCX aborts this process if such a reader dies mid-READ; \
         give the gateway an RDMA NIC (UCX_TLS with rc or dc), or use the shm lane (same \
         host) or the grpc lane"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_alone_or_with_host_local_transports_is_software() {
        for tls in ["tcp", "tcp,cma", "sm,tcp", "ud,tcp", " tcp,self "] {
            let reason = software_read_reason(Some(tls), true);
            assert!(reason.is_some_and(|r| r.contains(tls.trim())), "{tls}");
        }
    }

    #[test]
    fn rdma_transports_are_one_sided_whatever_the_host() {
        for tls in ["rc", "tcp,rc_x", "dc_mlx5,sm", "ib", "rc:aux,tcp"] {
            assert_eq!(software_read_reason(Some(tls), false), None, "{tls}");
        }
    }

    #[test]
    fn an_open_choice_depends_on_the_host_having_rdma_devices() {
        for tls in [None, Some(""), Some("all"), Some("^ib"), Some("^tcp")] {
            assert_eq!(software_read_reason(tls, true), None, "{tls:?}");
            let reason = software_read_reason(tls, false);
            assert!(
                reason.is_some_and(|r| r.contains("no RDMA device")),
                "{tls:?}"
            );
        }
    }

    #[test]
    fn devices_are_counted_from_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!has_rdma_devices(dir.path()));
        assert!(!has_rdma_devices(&dir.path().join("missing")));
        std::fs::create_dir(dir.path().join("mlx5_0")).unwrap();
        assert!(has_rdma_devices(dir.path()));
    }
}
