//! gdrcopy's logging switches: `GDRCOPY_ENABLE_LOGGING` (set to anything) turns messages on,
//! `GDRCOPY_LOG_LEVEL` is the threshold (1 debug, 2 info, 3 warn, 4 error; errors only by
//! default). Messages go to stderr, one line each. Both variables are read once, at the first
//! message, as gdrcopy does.

use std::fmt;
use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
}

impl Level {
    fn tag(self) -> &'static str {
        match self {
            Level::Debug => "DBG",
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERR",
        }
    }
}

/// The threshold when logging is on, from the two variables' values.
fn threshold(enable: Option<&str>, level: Option<&str>) -> Option<i32> {
    enable?;
    Some(
        level
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(Level::Error as i32),
    )
}

fn config() -> Option<i32> {
    static CONFIG: OnceLock<Option<i32>> = OnceLock::new();
    *CONFIG.get_or_init(|| {
        let enable = std::env::var("GDRCOPY_ENABLE_LOGGING").ok();
        let level = std::env::var("GDRCOPY_LOG_LEVEL").ok();
        threshold(enable.as_deref(), level.as_deref())
    })
}

pub(crate) fn enabled(level: Level) -> bool {
    config().is_some_and(|t| level as i32 >= t)
}

pub(crate) fn emit(level: Level, args: fmt::Arguments<'_>) {
    eprintln!("gdrapi {}: {args}", level.tag());
}

/// `log!(Level::Info, "...", args)`: formats only when the level is on.
macro_rules! log {
    ($level:expr, $($arg:tt)*) => {
        if $crate::log::enabled($level) {
            $crate::log::emit($level, format_args!($($arg)*));
        }
    };
}
pub(crate) use log;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logging_is_off_unless_enabled_and_errors_only_by_default() {
        assert_eq!(threshold(None, Some("1")), None);
        assert_eq!(threshold(Some(""), None), Some(4));
        assert_eq!(threshold(Some("1"), Some(" 2 ")), Some(2));
        assert_eq!(threshold(Some("1"), Some("verbose")), Some(4));
        assert!(Level::Error > Level::Info);
    }
}
