//! A reader-writer lock whose readers run no atomic read-modify-write, for the handle table.
//!
//! Every `gdr_copy_to_mapping` and `gdr_copy_from_mapping` looks its handle up under the
//! table's lock, so that a made-up handle gets EINVAL and no `gdr_unmap` can pull the mapping
//! from under the copy. A `std::sync::RwLock` read costs two locked instructions (acquire and
//! release), a noticeable share of an 8-byte copy call. The table changes only at open, pin,
//! map, unmap, unpin and close, each of which takes microseconds anyway, so the cost is moved
//! to the writers. What it saves is measured in docs/perf.md (C API).
//!
//! # Protocol
//! Each thread owns a [`Slot`], a counter of the read sections it is in, written only by that
//! thread. A reader, on the fast path:
//! 1. raises its slot's counter (a plain store), then, with only a compiler fence between,
//! 2. loads [`ReadMostly::writer`]; when no writer is announced it reads the data, and
//! 3. lowers the counter with a release store when done.
//!
//! A writer takes the inner `RwLock` exclusively (which also shuts out the slow-path readers
//! below and other writers), stores `writer = true`, then runs `membarrier(2)`'s
//! `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, which makes every running thread of the process execute
//! a full memory barrier before it returns (and a thread that is not running has passed one in
//! its context switch). That barrier stands in for the readers' missing one, which makes
//! steps 1-2 and the writer's store-then-scan a Dekker pair: each reader either saw
//! `writer == true` (and backed off), or its raised counter is visible to the writer, which
//! then waits for it to come down. Only then does the writer change the data; it clears
//! `writer` with a release store, which the readers' acquire load of step 2 pairs with.
//!
//! A reader that finds a writer announced lowers its counter and takes the inner `RwLock`
//! shared instead (the slow path), which waits for the writer to finish; a read nested in the
//! thread's own fast section does not look (the writer is waiting for that section to end, so
//! the data cannot change under either), which keeps nested reads from deadlocking with a
//! writer that arrived between them. So do all readers
//! when the heavy barrier is unavailable (a kernel before 4.14, a seccomp filter refusing
//! `membarrier`, another OS), when the thread's slot cannot be had (thread teardown), and
//! until [`ReadMostly::enable_fast_reads`] has run: the lock then behaves as the `RwLock` it
//! wraps.
//!
//! Slots are process-wide (shared by every `ReadMostly`, of which the library has one): a
//! writer waits for readers of any instance, which is only conservative. A slot is leaked on
//! first use and handed to a later thread when its thread exits, so a program that starts
//! many short-lived threads keeps as many slots as it ever had threads alive at once.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One thread's count of the read sections it is in, on a cache line of its own so that
/// readers on different cores do not share a line.
#[repr(align(128))]
struct Slot {
    /// Read sections this thread is in (more than one when a read nests in another).
    depth: AtomicUsize,
    /// Whether a live thread owns this slot.
    owned: AtomicBool,
}

/// Every slot ever handed out; slots are never freed, only passed on.
static SLOTS: Mutex<Vec<&'static Slot>> = Mutex::new(Vec::new());

fn lock_slots() -> std::sync::MutexGuard<'static, Vec<&'static Slot>> {
    SLOTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A thread's hold on its slot; gives it back when the thread exits.
struct SlotHold(&'static Slot);

impl SlotHold {
    fn claim() -> SlotHold {
        let mut slots = lock_slots();
        for s in slots.iter() {
            // Under the mutex: no other thread claims at the same time.
            if !s.owned.load(Ordering::Relaxed) {
                s.owned.store(true, Ordering::Relaxed);
                return SlotHold(s);
            }
        }
        let s: &'static Slot = Box::leak(Box::new(Slot {
            depth: AtomicUsize::new(0),
            owned: AtomicBool::new(true),
        }));
        slots.push(s);
        SlotHold(s)
    }
}

impl Drop for SlotHold {
    fn drop(&mut self) {
        // The thread is exiting, so it is in no read section: depth is 0.
        let _slots = lock_slots();
        self.0.owned.store(false, Ordering::Relaxed);
    }
}

thread_local! {
    static SLOT: SlotHold = SlotHold::claim();
}

/// This thread's slot, or `None` while its thread-locals are being torn down.
fn my_slot() -> Option<&'static Slot> {
    SLOT.try_with(|h| h.0).ok()
}

/// The membarrier(2) commands used (linux/membarrier.h).
#[cfg(target_os = "linux")]
mod membarrier {
    pub const QUERY: libc::c_int = 0;
    pub const PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    pub const REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    pub fn call(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier takes (cmd, flags, cpu_id) integers and touches no memory of ours.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        }
    }

    /// Registers the process for the expedited barrier; false when this kernel or sandbox
    /// does not offer it.
    pub fn register() -> bool {
        let have = call(QUERY);
        let need = (PRIVATE_EXPEDITED | REGISTER_PRIVATE_EXPEDITED) as libc::c_long;
        have >= 0 && have & need == need && call(REGISTER_PRIVATE_EXPEDITED) == 0
    }

    /// A full memory barrier on every running thread of this process.
    pub fn heavy() -> bool {
        call(PRIVATE_EXPEDITED) == 0
    }
}

#[cfg(not(target_os = "linux"))]
mod membarrier {
    pub fn register() -> bool {
        false
    }
    pub fn heavy() -> bool {
        false
    }
}

/// A reader-writer lock with cheap readers and expensive writers; see the module text.
pub(crate) struct ReadMostly<T> {
    /// Held exclusively by a writer for its whole section, shared by slow-path readers.
    lock: RwLock<()>,
    /// A writer is in (or entering) its section: readers take the slow path.
    writer: AtomicBool,
    /// The fast path is on: the heavy barrier is registered and works. Changed only under
    /// `lock` held exclusively.
    fast: AtomicBool,
    data: UnsafeCell<T>,
}

// SAFETY: the data is handed out as `&T` to readers on any thread and as `&mut T` to one writer
// at a time, never both (the protocol above), as `RwLock<T>` does; so the same bounds.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}
// SAFETY: moving the lock moves the data, which is Send.
unsafe impl<T: Send> Send for ReadMostly<T> {}

impl<T> ReadMostly<T> {
    /// A lock around `data`; readers take the slow path until [`Self::enable_fast_reads`].
    pub const fn new(data: T) -> ReadMostly<T> {
        ReadMostly {
            lock: RwLock::new(()),
            writer: AtomicBool::new(false),
            fast: AtomicBool::new(false),
            data: UnsafeCell::new(data),
        }
    }

    /// Turns the fast read path on where the kernel offers the expedited barrier; returns
    /// whether it is on. Idempotent.
    pub fn enable_fast_reads(&self) -> bool {
        let _w = self.lock.write().unwrap_or_else(|e| e.into_inner());
        if !self.fast.load(Ordering::Relaxed) && membarrier::register() {
            // Published under the exclusive lock: a reader that sees it comes after this
            // registration, and every later writer reads it under the lock.
            self.fast.store(true, Ordering::Release);
        }
        self.fast.load(Ordering::Relaxed)
    }

    /// Whether readers take the fast path.
    #[cfg(test)]
    pub fn fast_reads(&self) -> bool {
        self.fast.load(Ordering::Relaxed)
    }

    /// Shared access to the data.
    pub fn read(&self) -> ReadGuard<'_, T> {
        if self.fast.load(Ordering::Acquire) {
            if let Some(slot) = my_slot() {
                // Only this thread writes its slot, so a load and a store make the increment.
                let depth = slot.depth.load(Ordering::Relaxed);
                slot.depth.store(depth + 1, Ordering::Relaxed);
                // The writers' membarrier makes this a full fence (module text).
                compiler_fence(Ordering::SeqCst);
                // A read nested in this thread's fast section goes on even past an announced
                // writer: that writer is waiting for this slot's count, so it changes nothing
                // until the outer section ends. (Backing off to the inner lock would wait for
                // the writer, which waits for us.)
                if depth > 0 || !self.writer.load(Ordering::Acquire) {
                    return ReadGuard {
                        data: self,
                        hold: Hold::Slot(slot, depth),
                    };
                }
                slot.depth.store(depth, Ordering::Release);
            }
        }
        ReadGuard {
            data: self,
            hold: Hold::Lock(self.lock.read().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Exclusive access to the data: waits for every reader to leave.
    pub fn write(&self) -> WriteGuard<'_, T> {
        let lock = self.lock.write().unwrap_or_else(|e| e.into_inner());
        if self.fast.load(Ordering::Relaxed) {
            self.writer.store(true, Ordering::Relaxed);
            if !membarrier::heavy() {
                // membarrier(2) documents no failure for a registered process. Without the
                // barrier a reader's raised count may still sit in its store buffer, unseen,
                // while it misses `writer`: going on could unmap memory under a copy.
                eprintln!("libgdrapi: membarrier(PRIVATE_EXPEDITED) failed after registering");
                std::process::abort();
            }
            wait_for_readers();
        }
        WriteGuard { data: self, lock }
    }
}

/// Spins (then yields) until no thread is in a fast read section.
fn wait_for_readers() {
    let slots: Vec<&'static Slot> = lock_slots().clone();
    for s in slots {
        let mut spins = 0u32;
        while s.depth.load(Ordering::Acquire) != 0 {
            if spins < 1000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                // A reader may be in a long copy (the copy engine, many MiB).
                std::thread::yield_now();
            }
        }
    }
}

enum Hold<'a> {
    /// Fast path: this thread's slot, and its depth before this section.
    Slot(&'static Slot, usize),
    /// Slow path: the inner lock, shared.
    Lock(#[allow(dead_code)] RwLockReadGuard<'a, ()>),
}

/// Shared access to a [`ReadMostly`]'s data; leaves the read section when dropped.
pub(crate) struct ReadGuard<'a, T> {
    data: &'a ReadMostly<T>,
    hold: Hold<'a>,
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is a read section: no writer changes the data until it drops.
        unsafe { &*self.data.data.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    fn drop(&mut self) {
        if let Hold::Slot(slot, depth) = self.hold {
            // Release: this section's reads of the data happen before a writer that sees the
            // count come down (its acquire load in wait_for_readers) changes it.
            slot.depth.store(depth, Ordering::Release);
        }
    }
}

/// Exclusive access to a [`ReadMostly`]'s data; lets readers in again when dropped.
pub(crate) struct WriteGuard<'a, T> {
    data: &'a ReadMostly<T>,
    #[allow(dead_code)]
    lock: RwLockWriteGuard<'a, ()>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the writer's section: no reader and no other writer is in.
        unsafe { &*self.data.data.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in deref; `&mut self` makes this the only reference handed out.
        unsafe { &mut *self.data.data.get() }
    }
}

impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        // Release: the changes made in this section are visible to a fast reader that loads
        // `writer == false` (acquire). The inner lock, still held, is released after this.
        self.data.writer.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// Slots are process-wide: the tests that count them run one at a time.
    static SERIAL: Mutex<()> = Mutex::new(());
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn reads_and_writes_see_the_data_and_nest() {
        let _serial = serial();
        let l = ReadMostly::new(vec![1u32, 2, 3]);
        let fast = l.enable_fast_reads();
        assert_eq!(fast, l.fast_reads());
        assert_eq!(l.enable_fast_reads(), fast, "idempotent");
        {
            let a = l.read();
            // Nested on one thread. Where membarrier works (any Linux since 4.14 outside a
            // strict seccomp filter), the reads are the fast kind.
            let b = l.read();
            assert_eq!(matches!(b.hold, Hold::Slot(_, 1)), fast);
            assert_eq!((a.len(), b[2]), (3, 3));
        }
        l.write().push(4);
        assert_eq!(*l.read(), [1, 2, 3, 4]);
        let slot = my_slot().expect("a slot");
        assert_eq!(slot.depth.load(Ordering::Relaxed), 0, "sections left");
    }

    #[test]
    fn without_the_fast_path_it_is_the_rwlock() {
        let _serial = serial();
        let l = ReadMostly::new(5u64);
        assert!(!l.fast_reads());
        let g = l.read();
        assert!(matches!(g.hold, Hold::Lock(_)));
        drop(g);
        *l.write() += 1;
        assert_eq!(*l.read(), 6);
    }

    #[test]
    fn a_writer_waits_for_a_reader_in_its_section() {
        let _serial = serial();
        let l = Arc::new(ReadMostly::new(0u64));
        l.enable_fast_reads();
        let r = l.read();
        let (l2, done) = (l.clone(), Arc::new(AtomicBool::new(false)));
        let d2 = done.clone();
        let w = std::thread::spawn(move || {
            *l2.write() = 7;
            d2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "the writer went in past a reader"
        );
        assert_eq!(*r, 0);
        drop(r);
        w.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        assert_eq!(*l.read(), 7);
    }

    /// A thread in a read section reads again after another thread has started to write (as
    /// `with_allocation`'s closure does when it copies): the nested read must not wait for the
    /// writer, which waits for the outer section.
    #[test]
    fn a_nested_read_does_not_wait_for_a_writer_that_waits_for_it() {
        let _serial = serial();
        let l = Arc::new(ReadMostly::new(0u64));
        if !l.enable_fast_reads() {
            println!("skipped: no membarrier here, the slow path is std's RwLock");
            return;
        }
        // The reader on a thread of its own, so that a deadlock fails the test (the receive's
        // bound) instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let (lr, lw) = (l.clone(), l.clone());
        let reader = std::thread::spawn(move || {
            let outer = lr.read();
            let w = std::thread::spawn(move || *lw.write() = 9);
            // Let the writer announce itself and start waiting for this thread's section.
            let t0 = Instant::now();
            while !lr.writer.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(5) {
                std::thread::yield_now();
            }
            let inner = lr.read();
            let seen = (
                lr.writer.load(Ordering::SeqCst),
                matches!(inner.hold, Hold::Slot(_, 1)),
                *outer,
                *inner,
            );
            drop(inner);
            drop(outer);
            tx.send(seen).unwrap();
            w.join().unwrap();
        });
        let seen = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the nested read waited for the writer, which waits for it");
        assert_eq!(
            seen,
            (true, true, 0, 0),
            "(writer announced, fast nested read, data)"
        );
        reader.join().unwrap();
        assert_eq!(*l.read(), 9);
    }

    #[test]
    fn a_panicking_reader_and_writer_leave_the_lock_usable() {
        let _serial = serial();
        let l = ReadMostly::new(1u32);
        l.enable_fast_reads();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.read();
            panic!("in a read section");
        }));
        assert!(r.is_err());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut g = l.write();
            *g = 2;
            panic!("in a write section");
        }));
        assert!(r.is_err());
        // Neither left a count or the writer flag behind: both paths still work.
        assert_eq!(*l.read(), 2);
        *l.write() = 3;
        assert_eq!(*l.read(), 3);
    }

    /// Readers check an invariant a writer breaks inside its section (two halves that must
    /// match); a reader that overlapped a writer would see them differ.
    #[test]
    fn readers_never_see_a_writer_half_done() {
        let _serial = serial();
        struct Pair {
            a: u64,
            b: u64,
        }
        let l = Arc::new(ReadMostly::new(Pair { a: 0, b: 0 }));
        l.enable_fast_reads();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let g = l.read();
                        let a = g.a;
                        std::hint::spin_loop();
                        // Volatile: read b after a, from memory, not folded with a.
                        // SAFETY: a valid, aligned field of the guarded data.
                        let b = unsafe { std::ptr::read_volatile(&g.b) };
                        assert_eq!(a, b, "a reader overlapped a writer");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let t0 = Instant::now();
        let mut writes = 0u64;
        while t0.elapsed() < Duration::from_millis(300) {
            let mut g = l.write();
            g.a += 1;
            // SAFETY: a valid, aligned field of the guarded data.
            unsafe { std::ptr::write_volatile(&mut g.b, g.a) };
            writes += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(writes > 10 && reads > 10, "{writes} writes, {reads} reads");
        let g = l.read();
        assert_eq!((g.a, g.b), (writes, writes));
    }

    #[test]
    fn an_exited_threads_slot_is_reused() {
        let _serial = serial();
        let first = std::thread::spawn(|| my_slot().unwrap() as *const Slot as usize)
            .join()
            .unwrap();
        let owned_after = lock_slots()
            .iter()
            .find(|s| (**s as *const Slot as usize) == first)
            .map(|s| s.owned.load(Ordering::Relaxed));
        assert_eq!(owned_after, Some(false), "given back at thread exit");
        let before: Vec<usize> = lock_slots()
            .iter()
            .map(|s| *s as *const Slot as usize)
            .collect();
        let second = std::thread::spawn(|| my_slot().unwrap() as *const Slot as usize)
            .join()
            .unwrap();
        assert!(before.contains(&second), "a free slot was taken, none made");
    }
}
