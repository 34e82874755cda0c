//! Upper bounds on what a command-line number may size, checked before anything is allocated,
//! and the memory check that ties the rest to what this machine can hold. Each bound is fixed
//! with its reason here, and the CLI's help and docs/serve.md name them.

use crate::ServeError;

/// Datagrams per `sendmmsg`/`recvmmsg` (`--batch`) at most: the kernel takes at most
/// `UIO_MAXIOV` (1024) messages in one call and silently handles no more, so a larger batch
/// only allocates buffers that are never filled.
pub const MAX_BATCH: usize = 1024;

/// Threads at most (`gdr load --threads`, `gdr serve --threads`): each polls its own socket,
/// so past the cores they only take turns; 1024 is also the usual limit on open files per
/// process. The memory check below may refuse fewer.
pub const MAX_THREADS: usize = 1024;

/// `gdr load --outstanding` at most, per thread: a server queue holds at most `--slots` (1024
/// by default) requests, so more only wait in socket buffers to be shed.
pub const MAX_OUTSTANDING: usize = 65536;

/// Requests an open-loop client thread keeps waiting for at most: past it the thread sends
/// later (it falls behind the rate, as a saturated sender does), so that `--rate` times
/// `--timeout-ms` cannot grow its table of unanswered requests without end (about 40 MiB
/// at this bound).
pub const MAX_UNANSWERED: usize = 1 << 20;

/// `gdr load --timeout-ms` at most: a minute. An answer later than that is lost for any use.
pub const MAX_TIMEOUT_MS: u64 = 60_000;

/// `gdr load --rate` at most, requests per second: far above what one host sends (a few
/// million datagrams per second); the bound only keeps the arithmetic finite.
pub const MAX_RATE: f64 = 1e9;

/// `gdr load --images` at most: 2^20 distinct LeNet images, one per request of a
/// million-request run (about 830 MiB with their references, within the memory check).
pub const MAX_IMAGES: usize = 1 << 20;

/// Entries of `gdr serve --gpus` at most (GPUs, or CPU queue sets in CPU mode): the largest
/// nodes have 16 GPUs.
pub const MAX_QUEUE_SETS: usize = 64;

/// `gdr serve --max-in-flight` at most, per queue: a queue has at most 2^24 slots
/// (`gdr_mq::layout::Geometry`), and never holds more requests than its slots, so a larger
/// number would bound nothing.
pub const MAX_IN_FLIGHT: usize = 1 << 24;

/// `gdr serve --streams` at most (host-centric: requests in flight per thread and GPU, each
/// a CUDA stream with its buffers).
pub const MAX_STREAMS: usize = 1024;

/// `gdr serve --app-file` at most, in bytes: a CUDA source of a megabyte is already far past
/// any app; /dev/zero and other endless files stop here.
pub const MAX_APP_SOURCE: u64 = 1 << 20;

/// Stack reserved per thread (Rust's default), counted against the address space.
const THREAD_STACK: u64 = 2 << 20;

/// Bytes of memory this process may still take: the smaller of the kernel's `MemAvailable`
/// and what an address-space limit (`ulimit -v`) leaves. None when neither can be read.
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let avail = meminfo
        .as_deref()
        .and_then(|m| kib_field(m, "MemAvailable:"));
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct, which lives on this stack frame.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) };
    let as_left = if rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY {
        let used = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| kib_field(&s, "VmSize:"))
            .unwrap_or(0);
        Some(lim.rlim_cur.saturating_sub(used))
    } else {
        None
    };
    match (avail, as_left) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A `NAME:   1234 kB` line of /proc/meminfo or /proc/self/status, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses `need` bytes for `what` when they are more than half the memory this process may
/// still take (the other half for everything else), saying what to lower.
pub fn check_memory(what: &str, need: u64, lower: &str) -> Result<(), ServeError> {
    check_memory_against(what, need, lower, available_memory())
}

fn check_memory_against(
    what: &str,
    need: u64,
    lower: &str,
    available: Option<u64>,
) -> Result<(), ServeError> {
    match available {
        Some(avail) if need > avail / 2 => Err(ServeError::Config(format!(
            "{what} would take {} MiB, more than half of the {} MiB this process may still use: \
             {lower}",
            need >> 20,
            avail >> 20
        ))),
        _ => Ok(()),
    }
}

/// Bytes `threads` threads with a receive batch of `batch` buffers of `buf` bytes each and a
/// send batch take (the stacks included, which count against `ulimit -v`).
pub fn thread_bytes(threads: usize, batch: usize, buf: usize) -> u64 {
    let per = (batch as u64)
        .saturating_mul((buf as u64).saturating_add(2048))
        .saturating_add(THREAD_STACK);
    per.saturating_mul(threads as u64)
}

/// Refuses `value` of `--name` above `max`, naming the bound and why.
pub fn at_most(name: &str, value: usize, max: usize, why: &str) -> Result<(), ServeError> {
    if value > max {
        return Err(ServeError::Config(format!(
            "--{name} {value}: at most {max} ({why})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_past_half_of_what_is_left_is_refused() {
        assert!(check_memory_against("x", 10 << 20, "less", Some(100 << 20)).is_ok());
        let e = check_memory_against("buffers", 60 << 20, "a smaller --batch", Some(100 << 20))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "buffers would take 60 MiB, more than half of the 100 MiB this process may still \
             use: a smaller --batch"
        );
        // Unknown memory: nothing to compare with.
        assert!(check_memory_against("x", u64::MAX, "", None).is_ok());
        assert!(available_memory().is_some_and(|m| m > 0));
    }

    #[test]
    fn thread_bytes_saturate_instead_of_wrapping() {
        assert_eq!(thread_bytes(1, 32, 65536), 32 * (65536 + 2048) + (2 << 20));
        assert_eq!(thread_bytes(usize::MAX, usize::MAX, usize::MAX), u64::MAX);
    }
}
