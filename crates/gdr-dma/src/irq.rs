//! Interrupts as file descriptors: VFIO signals a device interrupt by bumping an eventfd, and a
//! wait is a `poll` with a timeout, so no wait can hang.

use crate::error::{DmaError, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Something an engine can block on until the device signals completion.
pub trait Interrupt: Send {
    /// Waits up to `timeout`; `Ok(true)` when the interrupt fired (and was consumed),
    /// `Ok(false)` on timeout.
    fn wait(&mut self, timeout: Duration) -> Result<bool>;
    /// Re-enables delivery after a fired interrupt (needed for level-triggered INTx).
    fn rearm(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A Linux eventfd counter.
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// A new counter at 0, non-blocking and closed on exec.
    ///
    /// # Errors
    /// [`DmaError::Sys`] when the kernel refuses an eventfd (descriptor limit reached).
    pub fn new() -> Result<Self> {
        // SAFETY: eventfd takes no pointers; it only returns a descriptor or -1, checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(DmaError::last_os("eventfd"));
        }
        // SAFETY: `fd` was just returned by eventfd, is valid, and nothing else owns or closes
        // it, so the OwnedFd becomes its only owner.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Another handle on the same counter (for the signalling side).
    pub fn try_clone(&self) -> Result<Self> {
        Ok(EventFd {
            fd: self
                .fd
                .try_clone()
                .map_err(|e| DmaError::io("dup eventfd", e))?,
        })
    }

    /// Adds `n` to the counter, waking a waiter.
    pub fn signal(&self, n: u64) -> Result<()> {
        let buf = n.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live stack buffer to our descriptor.
        let r = unsafe { libc::write(self.fd.as_raw_fd(), buf.as_ptr().cast(), 8) };
        if r == 8 {
            Ok(())
        } else {
            Err(DmaError::last_os("write eventfd"))
        }
    }

    /// Reads and resets the counter without blocking; 0 when nothing was signalled.
    pub fn take(&self) -> Result<u64> {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live stack buffer from our descriptor.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        if r == 8 {
            return Ok(u64::from_ne_bytes(buf));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EAGAIN) {
            Ok(0)
        } else {
            Err(DmaError::io("read eventfd", err))
        }
    }

    /// The descriptor, to hand to VFIO as an interrupt's eventfd; it stays owned by `self`.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Interrupt for EventFd {
    fn wait(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.take()? > 0 {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on the stack, count 1.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(DmaError::io("poll eventfd", err));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_signals_across_clones_and_times_out() {
        let mut a = EventFd::new().unwrap();
        let b = a.try_clone().unwrap();
        let t = Instant::now();
        assert!(!a.wait(Duration::from_millis(20)).unwrap());
        assert!(t.elapsed() >= Duration::from_millis(20));
        b.signal(3).unwrap();
        assert!(a.wait(Duration::from_millis(20)).unwrap());
        assert_eq!(a.take().unwrap(), 0, "wait consumed the count");
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            b.signal(1).unwrap();
        });
        assert!(a.wait(Duration::from_secs(5)).unwrap());
        h.join().unwrap();
    }
}
