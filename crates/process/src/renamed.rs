//! Environment variables of renamed flags. A flag renamed to follow the
//! naming rule (`_ms`/`_secs`/`_mb`/`_bytes`) keeps its old spelling as a
//! clap alias; clap reads one variable per flag, so the old variable is
//! carried over here, before parsing: when only the old one is set, its
//! value becomes the new one's. Setting both is refused (which one wins
//! would be a guess). The old names used are logged as deprecated by
//! [`init_logging`](crate::init_logging), once logging is up.

use std::sync::Mutex;

/// An old environment variable and the one that replaced it.
pub type Renamed = (&'static str, &'static str);

/// The renamed variables carried over and not yet logged.
static USED: Mutex<Vec<Renamed>> = Mutex::new(Vec::new());

/// Copies each old variable that is set to its new name when that is
/// unset; returns the old names used (also kept for the deprecation
/// warning [`warn_used`] logs). Call it at the top of `main`, before any
/// thread is started (it changes the process environment).
pub fn carry_over(renamed: &[Renamed]) -> Result<Vec<&'static str>, String> {
    let mut used = Vec::new();
    for &(old, new) in renamed {
        let Some(value) = std::env::var_os(old) else {
            continue;
        };
        if std::env::var_os(new).is_some() {
            return Err(format!(
                "both {old} and {new} are set; {old} is the old name of {new}: unset it"
            ));
        }
        std::env::set_var(new, value);
        used.push(old);
        if let Ok(mut pending) = USED.lock() {
            pending.push((old, new));
        }
    }
    Ok(used)
}

/// Logs one warning for each old variable carried over since the last call.
pub fn warn_used() {
    let pending = match USED.lock() {
        Ok(mut pending) => std::mem::take(&mut *pending),
        Err(_) => return,
    };
    for (old, new) in pending {
        tracing::warn!("{old} is deprecated: set {new} instead");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test touches the environment, with names no other test uses.
    #[test]
    fn old_names_carry_over_and_both_set_is_refused() {
        const RENAMED: &[Renamed] = &[
            ("IRIS_TEST_RENAMED_OLD_A", "IRIS_TEST_RENAMED_NEW_A"),
            ("IRIS_TEST_RENAMED_OLD_B", "IRIS_TEST_RENAMED_NEW_B"),
        ];
        std::env::set_var("IRIS_TEST_RENAMED_OLD_A", "42");
        assert_eq!(carry_over(RENAMED).unwrap(), ["IRIS_TEST_RENAMED_OLD_A"]);
        assert_eq!(std::env::var("IRIS_TEST_RENAMED_NEW_A").unwrap(), "42");
        // Now both are set: refused, naming both.
        let err = carry_over(RENAMED).unwrap_err();
        assert!(err.contains("IRIS_TEST_RENAMED_OLD_A") && err.contains("IRIS_TEST_RENAMED_NEW_A"));
        std::env::remove_var("IRIS_TEST_RENAMED_OLD_A");
        assert!(carry_over(RENAMED).unwrap().is_empty());
    }
}
