//! One module per subcommand. Each has its clap arguments, named for the command
//! (`check::CheckArgs`) so that each type name is defined once in the workspace, and a `run`
//! that takes them and returns a `CmdResult`.

pub mod apiperf;
pub mod capi_map;
pub mod check;
pub mod copybw;
pub mod copylat;
pub mod dma;
pub mod gpu;
pub mod info;
pub mod load;
pub mod measure;
pub mod mq;
pub mod plot;
pub mod pplat;
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
