//! One module per subcommand. Each has its clap arguments, named for the command
//! (`check::CheckArgs`) so that each type name is defined once in the workspace, and a `run`
//! that takes them and returns a `CmdResult`.

pub mod apiperf;
pub mod check;
pub mod copybw;
pub mod copylat;
pub mod dma;
pub mod gpu;
pub mod info;
pub mod load;
pub mod mq;
pub mod plot;
pub mod pplat;
pub mod report;
pub mod run;
pub mod sanity;
pub mod serve;
pub mod storebw;
pub mod table;
pub mod topo;

/// What a subcommand returns: an exit code, or an error the CLI prints as one line.
pub type CmdResult = Result<std::process::ExitCode, Box<dyn std::error::Error + Send + Sync>>;

/// The longest `--duration` a command takes: a day. A longer run leaves `--duration` out and
/// is stopped with SIGINT or SIGTERM.
pub const MAX_SECONDS: f64 = 86_400.0;

/// A `--NAME` given in seconds, checked: a finite number from 0 to [`MAX_SECONDS`] (clap
/// parses `nan`, `inf` and `1e20` as numbers; `Duration::from_secs_f64` panics on them).
pub fn seconds(name: &str, s: f64) -> Result<std::time::Duration, String> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(format!(
            "--{name} {s:?}: must be a finite number of seconds, at least 0"
        ));
    }
    if s > MAX_SECONDS {
        return Err(format!(
            "--{name} {s:?}: at most {MAX_SECONDS} seconds (a day); leave it out and stop the run \
             with SIGINT for longer ones"
        ));
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// [`seconds`] for a `--NAME` that must be more than 0 (a run of no time measures nothing).
pub fn positive_seconds(name: &str, s: f64) -> Result<std::time::Duration, String> {
    if !(s.is_finite() && s > 0.0) {
        return Err(format!(
            "--{name} {s:?}: must be a finite number of seconds, more than 0"
        ));
    }
    seconds(name, s)
}

/// The longest `--budget-ms` a measuring command takes per path and size: a minute. The timer
/// keeps at most 201 samples anyway, and a budget near `u64::MAX` overflowed the `Duration`
/// product of budget and paths (a panic after the GPU was opened).
pub const MAX_BUDGET_MS: u64 = 60_000;

/// `--budget-ms`, checked before the GPU is opened: from 1 to [`MAX_BUDGET_MS`].
pub fn budget_ms(ms: u64) -> Result<std::time::Duration, String> {
    if !(1..=MAX_BUDGET_MS).contains(&ms) {
        return Err(format!(
            "--budget-ms {ms}: must be from 1 to {MAX_BUDGET_MS}"
        ));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// The most CPU threads a copy may be asked to run on: far past any core count that helps,
/// and a bound on the threads spawned.
pub const MAX_COPY_THREADS: usize = 256;

/// The largest copy size a command takes (1 TiB): past any GPU's memory, so nothing real is
/// refused, and far from where size arithmetic (a doubled size, a sum over threads) wraps.
pub const MAX_COPY_SIZE: usize = 1 << 40;

/// A non-empty list of `--NAME` values, each from `min` to `max`, checked before the GPU is
/// opened.
pub fn in_range<T: Copy + PartialOrd + std::fmt::Display>(
    name: &str,
    values: &[T],
    min: T,
    max: T,
) -> Result<(), String> {
    in_range_shown(name, values, min, max, |v| v.to_string())
}

/// [`in_range`] for sizes, written as the help writes them (4K, 1024G).
pub fn sizes_in_range(name: &str, values: &[usize], min: usize, max: usize) -> Result<(), String> {
    in_range_shown(name, values, min, max, table::size)
}

fn in_range_shown<T: Copy + PartialOrd>(
    name: &str,
    values: &[T],
    min: T,
    max: T,
    show: impl Fn(T) -> String,
) -> Result<(), String> {
    if values.is_empty() {
        return Err(format!("--{name} needs at least one value"));
    }
    match values.iter().find(|&&v| v < min || v > max) {
        Some(&v) => Err(format!(
            "--{name} {}: must be from {} to {}",
            show(v),
            show(min),
            show(max)
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_refuses_what_a_duration_cannot_hold() {
        assert_eq!(
            seconds("duration", 2.5),
            Ok(std::time::Duration::from_millis(2500))
        );
        assert_eq!(seconds("duration", 0.0), Ok(std::time::Duration::ZERO));
        assert_eq!(
            seconds("duration", MAX_SECONDS),
            Ok(std::time::Duration::from_secs(86_400))
        );
        for bad in [
            -1.0,
            f64::NAN,
            f64::INFINITY,
            -f64::INFINITY,
            1e20,
            MAX_SECONDS + 1.0,
        ] {
            let e = seconds("duration", bad).expect_err("refused");
            assert!(e.starts_with("--duration "), "{e}");
        }
        // Where 0 is refused, the message does not say 0 is allowed.
        for bad in [-1.0, 0.0, f64::NAN] {
            let e = positive_seconds("duration", bad).expect_err("refused");
            assert!(e.ends_with("more than 0"), "{e}");
        }
        assert_eq!(
            positive_seconds("duration", 0.5),
            Ok(std::time::Duration::from_millis(500))
        );
    }
}
