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

use std::panic::{catch_unwind, AssertUnwindSafe};

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
