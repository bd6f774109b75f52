//! CPU time of a process from `/proc/<pid>/stat` (user + system, in clock
//! ticks converted with `sysconf(_SC_CLK_TCK)`), so a run can report CPU
//! microseconds per request of the gateway, the engine and itself.

use std::time::Duration;

use anyhow::{bail, Context};

/// Which process to watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proc {
    /// This load generator.
    This,
    Pid(u32),
}

impl Proc {
    fn stat_path(self) -> String {
        match self {
            Proc::This => "/proc/self/stat".to_owned(),
            Proc::Pid(pid) => format!("/proc/{pid}/stat"),
        }
    }

    /// The process's command name (`/proc/<pid>/comm`), or "?".
    pub fn name(self) -> String {
        let path = match self {
            Proc::This => "/proc/self/comm".to_owned(),
            Proc::Pid(pid) => format!("/proc/{pid}/comm"),
        };
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "?".to_owned())
    }
}

/// Clock ticks per second from `sysconf(_SC_CLK_TCK)`; 100 (the Linux
/// default) if sysconf does not say.
#[allow(unsafe_code)]
pub fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// utime + stime, in clock ticks, from the text of a `stat` file. The
/// command name (field 2) may hold spaces and parentheses, so fields are
/// counted after its last `)`: utime and stime are fields 14 and 15.
pub fn parse_stat_ticks(stat: &str) -> anyhow::Result<u64> {
    let Some(close) = stat.rfind(')') else {
        bail!("no ')' after the command name");
    };
    let fields: Vec<&str> = stat[close + 1..].split_ascii_whitespace().collect();
    // fields[0] is field 3 (state), so field k is fields[k - 3].
    let field = |k: usize| -> anyhow::Result<u64> {
        let raw = fields
            .get(k - 3)
            .with_context(|| format!("stat has no field {k}"))?;
        raw.parse::<u64>()
            .with_context(|| format!("stat field {k} is not a number: {raw:?}"))
    };
    Ok(field(14)? + field(15)?)
}

/// CPU time the process has used so far.
pub fn cpu_time(proc_: Proc, ticks_per_sec: u64) -> anyhow::Result<Duration> {
    let path = proc_.stat_path();
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let ticks = parse_stat_ticks(&text).with_context(|| format!("cannot parse {path}"))?;
    Ok(ticks_to_duration(ticks, ticks_per_sec))
}

fn ticks_to_duration(ticks: u64, ticks_per_sec: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / ticks_per_sec.max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_user_plus_system_ticks() {
        let stat = "4242 (iris) S 1 4242 4242 0 -1 4194560 1000 0 0 0 731 69 0 0 20 0 5 0 1234 0 0";
        assert_eq!(parse_stat_ticks(stat).unwrap(), 800);
    }

    #[test]
    fn command_names_with_spaces_and_parens() {
        let stat = "7 (a b) (c)) R 1 7 7 0 -1 0 0 0 0 0 12 3 0 0";
        assert_eq!(parse_stat_ticks(stat).unwrap(), 15);
    }

    #[test]
    fn rejects_truncated_or_garbled_stat() {
        assert!(parse_stat_ticks("1 (x) S 1 2").is_err());
        assert!(parse_stat_ticks("no parens").is_err());
        assert!(parse_stat_ticks("1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 3").is_err());
    }

    #[test]
    fn reads_its_own_cpu_time() {
        let ticks = clock_ticks_per_sec();
        assert!(ticks > 0);
        assert!(cpu_time(Proc::This, ticks).is_ok());
        assert_eq!(ticks_to_duration(250, 100), Duration::from_millis(2500));
    }
}
