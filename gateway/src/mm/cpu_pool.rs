//! CPU-bound image work (decode + preprocess) on rayon's fixed-size pool.
//!
//! Preprocessing keeps per-thread scratch buffers sized to the largest image
//! a thread has seen (decoded pixels, the resize intermediate, the resized
//! image). On tokio's blocking pool, which grows a thread per concurrent
//! call and retires idle ones, that scratch multiplies with the request
//! concurrency and churns through the allocator: the gateway's memory grew
//! with load instead of with the number of cores. rayon's pool has one
//! thread per core, so scratch is bounded by `cores × largest image` and
//! reused, and no more images are decoded at once than there are cores to
//! decode them.
//!
//! "One thread per core" means the cores the container may use: the pool
//! is sized from the cgroup's CPU quota (v2 `cpu.max`, v1
//! `cpu.cfs_quota_us` / `cpu.cfs_period_us`, the tightest of the process's
//! cgroup and its ancestors), rounded up and capped by the CPUs the process
//! may run on ([`init_global`]). A pod limited to 2 CPUs on a 64-core node
//! decodes two images at a time, not 64, each with its scratch.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The CPUs a cgroup v2 `cpu.max` ("QUOTA PERIOD" or "max PERIOD")
/// allows, rounded up; `None` when unlimited or unreadable.
pub fn cpus_from_cpu_max(text: &str) -> Option<usize> {
    let mut fields = text.split_whitespace();
    let (quota, period) = (fields.next()?, fields.next().unwrap_or("100000"));
    cpus_from_quota(quota, period)
}

/// The CPUs a cgroup v1 quota and period (`cpu.cfs_quota_us`,
/// `cpu.cfs_period_us`; a quota of -1 is unlimited) allow, rounded up.
pub fn cpus_from_quota(quota: &str, period: &str) -> Option<usize> {
    let quota: u64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok().filter(|&p| p > 0)?;
    usize::try_from(quota.div_ceil(period).max(1)).ok()
}

/// The tightest CPU quota of the cgroup (v2 or v1) this process is in,
/// or of any of its ancestors.
fn cgroup_cpus() -> Option<usize> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut tightest: Option<usize> = None;
    for dir in cgroup_dirs(&membership) {
        let v2 = read(&dir.join("cpu.max")).and_then(|t| cpus_from_cpu_max(&t));
        let v1 = match (
            read(&dir.join("cpu.cfs_quota_us")),
            read(&dir.join("cpu.cfs_period_us")),
        ) {
            (Some(q), Some(p)) => cpus_from_quota(&q, &p),
            _ => None,
        };
        for cpus in [v2, v1].into_iter().flatten() {
            tightest = Some(tightest.map_or(cpus, |t| t.min(cpus)));
        }
    }
    tightest
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Directories that may hold this process's CPU quota: for each line of
/// `/proc/self/cgroup` (v2 `0::/path`, v1 `N:cpu,cpuacct:/path`), the
/// cgroup's directory and its ancestors under the usual mount points.
/// With a cgroup namespace the path is `/` and the mount root is the
/// container's own cgroup.
pub fn cgroup_dirs(membership: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let roots: &[&str] = if controllers.is_empty() {
            &["/sys/fs/cgroup"]
        } else if controllers.split(',').any(|c| c == "cpu") {
            &["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"]
        } else {
            continue;
        };
        for root in roots {
            let mut dir = PathBuf::from(root);
            dirs.push(dir.clone());
            for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
                dir.push(part);
                dirs.push(dir.clone());
            }
        }
    }
    dirs
}

/// Threads for the pool: the cgroup quota capped by the CPUs this process
/// may run on (at least 1).
pub fn pool_threads() -> usize {
    let allowed = std::thread::available_parallelism().map_or(1, |n| n.get());
    cgroup_cpus().map_or(allowed, |q| q.min(allowed)).max(1)
}

/// Builds rayon's global pool with [`pool_threads`] threads, unless
/// `RAYON_NUM_THREADS` chooses or the pool already exists; logs the size.
pub fn init_global() {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        tracing::info!(
            threads = rayon::current_num_threads(),
            "image CPU pool sized by RAYON_NUM_THREADS"
        );
        return;
    }
    let threads = pool_threads();
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("iris-image-{i}"))
        .build_global()
    {
        Ok(()) => tracing::info!(threads, "image CPU pool sized to the container's CPUs"),
        Err(e) => tracing::debug!(error = %e, "image CPU pool already built"),
    }
}

/// Runs `job` on rayon's global pool and waits for it without blocking the
/// async runtime. A panic in `job` becomes `Err` with its message instead
/// of aborting the process (rayon aborts on a panic in a spawned job).
pub async fn run<R, F>(job: F) -> Result<R, String>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    rayon::spawn(move || {
        let outcome =
            catch_unwind(AssertUnwindSafe(job)).map_err(|payload| panic_message(&*payload));
        // The caller may have gone (client disconnected): nothing to tell.
        let _ = tx.send(outcome);
    });
    rx.await
        .map_err(|_| "the CPU pool dropped the job".to_owned())?
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let detail = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    format!("panicked: {detail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_quotas_parse_to_rounded_up_cpus() {
        assert_eq!(cpus_from_cpu_max("max 100000\n"), None);
        assert_eq!(cpus_from_cpu_max("200000 100000\n"), Some(2));
        assert_eq!(cpus_from_cpu_max("150000 100000"), Some(2));
        assert_eq!(cpus_from_cpu_max("50000 100000"), Some(1));
        assert_eq!(cpus_from_cpu_max("400000"), Some(4));
        assert_eq!(cpus_from_cpu_max(""), None);
        assert_eq!(cpus_from_cpu_max("200000 0"), None);
        assert_eq!(cpus_from_quota("-1\n", "100000\n"), None);
        assert_eq!(cpus_from_quota("300000\n", "100000\n"), Some(3));
        assert_eq!(cpus_from_quota("garbage", "100000"), None);
    }

    #[test]
    fn cgroup_dirs_cover_the_cgroup_and_its_ancestors() {
        let v2 = cgroup_dirs("0::/kubepods/pod1/ctr\n");
        let v2: Vec<_> = v2.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            v2,
            [
                "/sys/fs/cgroup",
                "/sys/fs/cgroup/kubepods",
                "/sys/fs/cgroup/kubepods/pod1",
                "/sys/fs/cgroup/kubepods/pod1/ctr"
            ]
        );
        let v1 = cgroup_dirs("12:memory:/x\n4:cpu,cpuacct:/docker/abc\n");
        assert!(v1
            .iter()
            .any(|p| p == Path::new("/sys/fs/cgroup/cpu,cpuacct/docker/abc")));
        assert!(v1.iter().all(|p| !p.starts_with("/sys/fs/cgroup/memory")));
        assert!(cgroup_dirs("0::/\n")
            .iter()
            .eq([PathBuf::from("/sys/fs/cgroup")].iter()));
        assert!(pool_threads() >= 1);
    }

    #[tokio::test]
    async fn returns_the_result_from_a_pool_thread() {
        let on_pool = run(|| rayon::current_thread_index().is_some()).await;
        assert_eq!(on_pool, Ok(true));
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_not_an_abort() {
        let outcome: Result<(), String> = run(|| panic!("bad image {}", 3)).await;
        assert_eq!(outcome, Err("panicked: bad image 3".to_owned()));
        // The pool still works afterwards.
        assert_eq!(run(|| 2 + 2).await, Ok(4));
    }
}
