//! Median and minimum thread CPU time of a call repeated after a warm-up,
//! for the examples that time processors one thread each.

use std::time::Duration;

use crate::cpu;

/// (median, minimum) thread CPU of `iters` calls of `f`, after one warm-up.
pub fn cpu_times(iters: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    f();
    let mut times: Vec<Duration> = (0..iters.max(1))
        .map(|_| {
            let start = cpu::thread_cpu();
            f();
            cpu::thread_cpu() - start
        })
        .collect();
    times.sort();
    (times[times.len() / 2], times[0])
}
