//! SIGINT / SIGTERM as a flag: the server and the load generator poll it and wind down
//! (drain in-flight requests, print totals) instead of dying mid-request.
//!
//! Before there is anything to drain (a server still setting up: compiling, launching
//! workers, allocating queues) a signal ends the process as the signal's default would: setup
//! steps do not look at a flag, and some take seconds. A second signal ends the process at
//! once too, whatever is left to drain.

use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);
/// A signal sets [`STOP`] (true), or ends the process (false: still setting up).
static GRACEFUL: AtomicBool = AtomicBool::new(true);

const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

extern "C" fn on_signal(sig: libc::c_int) {
    // SAFETY: signal(2) and raise(3) are async-signal-safe; restoring the default disposition
    // makes the next SIGINT or SIGTERM (or the raise below) end the process.
    unsafe {
        for s in SIGNALS {
            libc::signal(s, libc::SIG_DFL);
        }
        if !GRACEFUL.load(Ordering::SeqCst) {
            libc::raise(sig);
        }
    }
    STOP.store(true, Ordering::SeqCst);
}

fn install(graceful: bool) -> &'static AtomicBool {
    GRACEFUL.store(graceful, Ordering::SeqCst);
    // SAFETY: the handler only stores to atomics and calls async-signal-safe functions.
    unsafe {
        for s in SIGNALS {
            libc::signal(s, on_signal as *const () as libc::sighandler_t);
        }
    }
    &STOP
}

/// Installs the handler for SIGINT and SIGTERM and returns the flag it sets: the first signal
/// sets it, a second ends the process.
pub fn stop_flag() -> &'static AtomicBool {
    install(true)
}

/// As [`stop_flag`], but until [`stop_when_ready`] is called a signal ends the process (as if
/// no handler were installed): for a server, whose setup has nothing to drain and does not
/// look at the flag.
pub fn stop_flag_after_setup() -> &'static AtomicBool {
    install(false)
}

/// Setup is over: from now on a signal sets the flag (see [`stop_flag_after_setup`]).
pub fn stop_when_ready() {
    GRACEFUL.store(true, Ordering::SeqCst);
}
