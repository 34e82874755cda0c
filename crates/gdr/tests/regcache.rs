//! The registration cache against a mock registrar that counts live registrations, records every
//! call, keeps a fake allocator for tags, and fails on demand.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gdr::peer::{CacheConfig, CacheError, RegCache, RegHandle, Registrar, Tag, GPU_PAGE_SIZE};
use rand::{Rng, SeedableRng};

const PAGE: u64 = GPU_PAGE_SIZE;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Register(u64, u64),
    Deregister(u64, u64),
    Tag(u64),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
enum MockError {
    #[error("injected failure")]
    Injected,
    #[error("out of BAR1 space")]
    NoSpace,
    #[error("tag query failed")]
    TagQuery,
}

#[derive(Default)]
struct MockState {
    calls: Vec<Call>,
    /// Live registrations by id: (start, len).
    live: HashMap<u64, (u64, u64)>,
    next_reg: u64,
    /// Allocations by start: (end, id).
    allocs: BTreeMap<u64, (u64, u64)>,
    next_alloc: u64,
    /// Fail this many upcoming `register` calls.
    fail_next: u32,
    /// Fail registrations longer than this.
    fail_longer_than: Option<u64>,
    /// Refuse with `NoSpace` past this many live bytes.
    capacity: Option<u64>,
    fail_tags: bool,
    /// Tags are reported (otherwise `Untracked`).
    tracked: bool,
    /// Deregistrations of unknown or already released registrations.
    bad_deregs: u64,
}

type Hook = Box<dyn FnOnce() + Send>;
type CacheHook = Box<dyn FnOnce(&RegCache<Mock>) + Send>;

#[derive(Default)]
struct Shared {
    state: Mutex<MockState>,
    live: AtomicU64,
    /// Runs inside the next `register` call, before it does anything else.
    during_register: Mutex<Option<Hook>>,
}

/// The registration: which one, and the range the cache asked for.
#[derive(Debug)]
struct MockReg {
    id: u64,
    start: u64,
    len: u64,
    /// Allocation tags live in the range when registered.
    tags: Vec<u64>,
}

#[derive(Clone, Default)]
struct Mock(Arc<Shared>);

impl Mock {
    fn tracked() -> Self {
        let m = Mock::default();
        m.st().tracked = true;
        m
    }
    fn st(&self) -> std::sync::MutexGuard<'_, MockState> {
        self.0.state.lock().unwrap()
    }
    fn live(&self) -> u64 {
        self.0.live.load(Ordering::SeqCst)
    }
    fn registers(&self) -> Vec<(u64, u64)> {
        self.st()
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::Register(s, l) => Some((*s, *l)),
                _ => None,
            })
            .collect()
    }
    fn deregisters(&self) -> Vec<(u64, u64)> {
        self.st()
            .calls
            .iter()
            .filter_map(|c| match c {
                Call::Deregister(s, l) => Some((*s, *l)),
                _ => None,
            })
            .collect()
    }
    fn alloc(&self, start: u64, len: u64) -> u64 {
        let mut st = self.st();
        st.next_alloc += 1;
        let id = st.next_alloc;
        st.allocs.insert(start, (start + len, id));
        id
    }
    fn free(&self, start: u64) {
        self.st()
            .allocs
            .remove(&start)
            .expect("freeing a live allocation");
    }
}

fn alloc_at(st: &MockState, addr: u64) -> Option<u64> {
    st.allocs
        .range(..=addr)
        .next_back()
        .filter(|(_, &(end, _))| addr < end)
        .map(|(_, &(_, id))| id)
}

impl Registrar for Mock {
    type Reg = MockReg;
    type Error = MockError;

    fn register(&self, start: u64, len: u64) -> Result<MockReg, MockError> {
        let hook = self.0.during_register.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        let mut st = self.st();
        st.calls.push(Call::Register(start, len));
        if st.fail_next > 0 {
            st.fail_next -= 1;
            return Err(MockError::Injected);
        }
        if st.fail_longer_than.is_some_and(|max| len > max) {
            return Err(MockError::Injected);
        }
        let live_bytes: u64 = st.live.values().map(|&(_, l)| l).sum();
        if st.capacity.is_some_and(|cap| live_bytes + len > cap) {
            return Err(MockError::NoSpace);
        }
        st.next_reg += 1;
        let id = st.next_reg;
        st.live.insert(id, (start, len));
        let tags = st
            .allocs
            .iter()
            .filter(|(&s, &(e, _))| s < start + len && start < e)
            .map(|(_, &(_, id))| id)
            .collect();
        self.0.live.fetch_add(1, Ordering::SeqCst);
        Ok(MockReg {
            id,
            start,
            len,
            tags,
        })
    }

    fn deregister(&self, start: u64, len: u64, reg: MockReg) {
        let mut st = self.st();
        st.calls.push(Call::Deregister(start, len));
        if st.live.remove(&reg.id) != Some((start, len)) || (reg.start, reg.len) != (start, len) {
            st.bad_deregs += 1;
        }
        self.0.live.fetch_sub(1, Ordering::SeqCst);
    }

    fn tag(&self, addr: u64) -> Result<Tag, MockError> {
        let mut st = self.st();
        st.calls.push(Call::Tag(addr));
        if st.fail_tags {
            return Err(MockError::TagQuery);
        }
        if !st.tracked {
            return Ok(Tag::Untracked);
        }
        Ok(alloc_at(&st, addr).map_or(Tag::Freed, Tag::Id))
    }

    fn is_out_of_space(&self, err: &MockError) -> bool {
        *err == MockError::NoSpace
    }
}

/// Three read replicas whatever the machine, so that keeping them in step is tested.
fn cache(mock: &Mock, max_bytes: u64, max_entries: usize) -> RegCache<Mock> {
    let config = CacheConfig::new(max_bytes, max_entries).with_read_shards(3);
    RegCache::new(mock.clone(), config).unwrap()
}

fn big(mock: &Mock) -> RegCache<Mock> {
    cache(mock, u64::MAX, usize::MAX)
}

/// The handle covers exactly what the caller asked, with a page-rounded registration.
fn check_cover(h: &RegHandle<Mock>, addr: u64, len: u64) {
    assert_eq!(h.addr(), addr);
    assert_eq!(h.size(), len);
    assert_eq!(h.reg_start() % PAGE, 0);
    assert_eq!(h.reg_len() % PAGE, 0);
    assert!(h.reg_start() <= addr, "{h:?}");
    assert!(h.reg_start() + h.reg_len() >= addr + len, "{h:?}");
    assert_eq!(h.offset(), addr - h.reg_start());
    assert_eq!((h.reg().start, h.reg().len), (h.reg_start(), h.reg_len()));
}

fn finish(mock: &Mock, cache: RegCache<Mock>) {
    drop(cache);
    assert_eq!(mock.live(), 0, "registrations leaked");
    assert_eq!(mock.st().live.len(), 0);
    assert_eq!(mock.st().bad_deregs, 0);
    assert_eq!(
        mock.registers().len(),
        mock.deregisters().len() + count_failed(mock)
    );
}

fn count_failed(mock: &Mock) -> usize {
    // Registers that returned an error never get a deregister; the mock does not record results,
    // so recompute: every successful registration got an id.
    mock.registers().len() - mock.st().next_reg as usize
}

#[test]
fn miss_then_hit_shares_the_registration() {
    let mock = Mock::default();
    let c = big(&mock);
    let a = c.acquire(0x10000, 100).unwrap();
    check_cover(&a, 0x10000, 100);
    assert_eq!(mock.registers(), vec![(0x10000, PAGE)]);
    let b = c.acquire(0x10000, 100).unwrap();
    let inner = c.acquire(0x10010, 0x100).unwrap();
    check_cover(&inner, 0x10010, 0x100);
    assert_eq!(inner.offset(), 0x10);
    assert!(a.same_registration(&b) && a.same_registration(&inner));
    assert_eq!(mock.registers().len(), 1);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.registrations), (2, 1, 1));
    assert_eq!(
        (
            s.entries,
            s.bytes_cached,
            s.live_registrations,
            s.bytes_pinned
        ),
        (1, PAGE, 1, PAGE)
    );
    // Lazy unpinning: dropping every handle keeps the registration.
    drop((a, b, inner));
    assert_eq!(mock.live(), 1);
    assert!(mock.deregisters().is_empty());
    let again = c.acquire(0x1ff00, 0x100).unwrap();
    assert_eq!(again.reg().id, 1);
    drop(again);
    finish(&mock, c);
}

#[test]
fn rounds_out_to_gpu_pages() {
    let mock = Mock::default();
    let c = big(&mock);
    let h = c.acquire(0x10001, 10).unwrap();
    assert_eq!(
        (h.reg_start(), h.reg_len(), h.offset()),
        (0x10000, 0x10000, 1)
    );
    // Straddling a page boundary takes both pages.
    let h2 = c.acquire(0x2ffff, 2).unwrap();
    assert_eq!((h2.reg_start(), h2.reg_len()), (0x20000, 0x20000));
    drop((h, h2));
    finish(&mock, c);

    let mut rng = rand::rngs::StdRng::from_entropy();
    for _ in 0..2000 {
        let mock = Mock::default();
        let c = big(&mock);
        let addr = rng.gen_range(0..1u64 << 48);
        let len = rng.gen_range(1..4 * PAGE);
        let h = c.acquire(addr, len).unwrap();
        check_cover(&h, addr, len);
        // Minimal: no whole page to spare on either side.
        assert!(addr - h.reg_start() < PAGE);
        assert!(h.reg_start() + h.reg_len() - (addr + len) < PAGE);
        drop(h);
        finish(&mock, c);
    }
}

#[test]
fn another_page_size() {
    let mock = Mock::default();
    let c = RegCache::new(
        mock.clone(),
        CacheConfig::new(u64::MAX, 8)
            .with_page_size(4096)
            .with_read_shards(1),
    )
    .unwrap();
    let h = c.acquire(0x1234, 0x10).unwrap();
    assert_eq!((h.reg_start(), h.reg_len()), (0x1000, 0x1000));
    drop(h);
    finish(&mock, c);
    let err = RegCache::new(Mock::default(), CacheConfig::new(1, 1).with_page_size(3000));
    assert!(err.is_err());
}

#[test]
fn bad_ranges_are_refused_without_registering() {
    let mock = Mock::default();
    let c = big(&mock);
    assert!(matches!(
        c.acquire(0x1000, 0),
        Err(CacheError::Empty { addr: 0x1000 })
    ));
    assert!(matches!(
        c.acquire(u64::MAX - 10, 11),
        Err(CacheError::Overflow { .. })
    ));
    // Ends within the last page: rounding up overflows.
    assert!(matches!(
        c.acquire(u64::MAX - 100, 50),
        Err(CacheError::Overflow { .. })
    ));
    assert!(matches!(
        c.acquire_checked(5, 0),
        Err(CacheError::Empty { .. })
    ));
    assert!(mock.st().calls.is_empty());
    finish(&mock, c);
}

#[test]
fn adjacent_ranges_stay_separate() {
    let mock = Mock::default();
    let c = big(&mock);
    let a = c.acquire(0, PAGE).unwrap();
    let b = c.acquire(PAGE, PAGE).unwrap();
    assert!(!a.same_registration(&b));
    assert_eq!(mock.registers(), vec![(0, PAGE), (PAGE, PAGE)]);
    assert!(c.acquire(0x100, 0x10).unwrap().same_registration(&a));
    assert!(c.acquire(PAGE + 0x100, 0x10).unwrap().same_registration(&b));
    assert_eq!(c.stats().entries, 2);

    // A request spanning both overlaps both: their union is registered, they are retired but
    // stay valid for their holders.
    let both = c.acquire(PAGE / 2, PAGE).unwrap();
    assert_eq!((both.reg_start(), both.reg_len()), (0, 2 * PAGE));
    assert_eq!(mock.registers().last(), Some(&(0, 2 * PAGE)));
    assert_eq!(c.stats().entries, 1);
    assert_eq!(mock.live(), 3);
    assert!(!a.is_invalidated(), "replaced is not invalidated");
    drop(a);
    assert_eq!(mock.deregisters(), vec![(0, PAGE)]);
    drop(b);
    assert_eq!(mock.live(), 1);
    // Both halves now hit the union.
    assert!(c.acquire(0, 1).unwrap().same_registration(&both));
    assert!(c.acquire(2 * PAGE - 1, 1).unwrap().same_registration(&both));
    drop(both);
    finish(&mock, c);
}

#[test]
fn partial_overlap_registers_the_union() {
    let mock = Mock::default();
    let c = big(&mock);
    drop(c.acquire(0, 2 * PAGE).unwrap());
    drop(c.acquire(5 * PAGE, PAGE).unwrap());
    let h = c.acquire(PAGE + 5, 2 * PAGE).unwrap();
    check_cover(&h, PAGE + 5, 2 * PAGE);
    assert_eq!((h.reg_start(), h.reg_len()), (0, 4 * PAGE));
    // The old [0, 2 pages) entry was unused: deregistered at once. The far one is untouched.
    assert_eq!(mock.deregisters(), vec![(0, 2 * PAGE)]);
    let s = c.stats();
    assert_eq!(
        (s.entries, s.bytes_cached, s.live_registrations),
        (2, 5 * PAGE, 2)
    );
    assert_eq!(s.misses, 3);
    drop(h);
    finish(&mock, c);
}

/// Growing an entry into a union counts the bytes the replaced entry gives back: no needless
/// eviction when the result fits.
#[test]
fn union_within_budget_evicts_nothing() {
    let mock = Mock::default();
    let c = cache(&mock, 3 * PAGE, 10);
    drop(c.acquire(0, PAGE).unwrap());
    drop(c.acquire(5 * PAGE, PAGE).unwrap());
    drop(c.acquire(PAGE / 2, PAGE).unwrap());
    let s = c.stats();
    assert_eq!(
        (s.evictions, s.entries, s.bytes_pinned),
        (0, 2, 3 * PAGE),
        "{s:?}"
    );
    // Held, the old entry does not give its bytes back: the other one must go.
    let held = c.acquire(0, 1).unwrap();
    drop(c.acquire(PAGE, 2 * PAGE).unwrap());
    let s = c.stats();
    assert_eq!((s.evictions, s.entries), (1, 1), "{s:?}");
    assert_eq!(mock.deregisters(), vec![(0, PAGE), (5 * PAGE, PAGE)]);
    drop(held);
    finish(&mock, c);
}

#[test]
fn union_refused_falls_back_to_the_request() {
    let mock = Mock::default();
    let c = big(&mock);
    drop(c.acquire(0, 2 * PAGE).unwrap());
    mock.st().fail_longer_than = Some(2 * PAGE);
    let h = c.acquire(PAGE, 2 * PAGE).unwrap();
    assert_eq!((h.reg_start(), h.reg_len()), (PAGE, 2 * PAGE));
    assert_eq!(
        mock.registers(),
        vec![(0, 2 * PAGE), (0, 3 * PAGE), (PAGE, 2 * PAGE)]
    );
    // The overlapped entry was replaced all the same: the map never holds overlaps.
    let s = c.stats();
    assert_eq!((s.entries, s.registration_failures), (1, 1));
    assert_eq!(mock.deregisters(), vec![(0, 2 * PAGE)]);
    drop(h);
    // [0, 1 page) is no longer covered: a miss again.
    drop(c.acquire(0, 10).unwrap());
    assert_eq!(mock.registers().last(), Some(&(0, PAGE)));
    finish(&mock, c);
}

#[test]
fn byte_budget_evicts_least_recently_used() {
    let mock = Mock::default();
    let c = cache(&mock, 4 * PAGE, 100);
    for i in 0..4 {
        drop(c.acquire(i * PAGE, 1).unwrap());
    }
    // Touch page 0 so that page 1 is the least recently used.
    drop(c.acquire(0, 1).unwrap());
    drop(c.acquire(10 * PAGE, 1).unwrap());
    assert_eq!(mock.deregisters(), vec![(PAGE, PAGE)]);
    let s = c.stats();
    assert_eq!((s.evictions, s.entries, s.bytes_pinned), (1, 4, 4 * PAGE));
    // A two-page request evicts two more, oldest first (pages 2 and 3).
    drop(c.acquire(20 * PAGE, 2 * PAGE).unwrap());
    assert_eq!(
        mock.deregisters()[1..],
        [(2 * PAGE, PAGE), (3 * PAGE, PAGE)]
    );
    assert!(c.stats().bytes_pinned <= 4 * PAGE);
    // Page 0 survived all of it.
    drop(c.acquire(0, 1).unwrap());
    assert_eq!(mock.registers().len(), 6);
    finish(&mock, c);
}

#[test]
fn count_budget_evicts_least_recently_used() {
    let mock = Mock::default();
    let c = cache(&mock, u64::MAX, 3);
    for i in [0, 1, 2] {
        drop(c.acquire(i * PAGE, 1).unwrap());
    }
    drop(c.acquire(0, 1).unwrap());
    drop(c.acquire(2 * PAGE, 1).unwrap());
    drop(c.acquire(7 * PAGE, 1).unwrap());
    assert_eq!(mock.deregisters(), vec![(PAGE, PAGE)]);
    assert_eq!(c.stats().entries, 3);
    // Recency counts from the latest miss: page 0, used after it, outranks page 2 (the lower
    // address, which would win a tie) and the new page 7.
    drop(c.acquire(0, 1).unwrap());
    drop(c.acquire(8 * PAGE, 1).unwrap());
    assert_eq!(mock.deregisters(), vec![(PAGE, PAGE), (2 * PAGE, PAGE)]);
    drop(c.acquire(9 * PAGE, 1).unwrap());
    assert_eq!(mock.deregisters()[2], (7 * PAGE, PAGE));
    finish(&mock, c);
}

#[test]
fn entries_in_use_are_never_evicted() {
    let mock = Mock::default();
    let c = cache(&mock, 2 * PAGE, 2);
    let held: Vec<_> = (0..2).map(|i| c.acquire(i * PAGE, 1).unwrap()).collect();
    // Over budget: nothing can go, so the cache goes over rather than fail.
    let third = c.acquire(5 * PAGE, 1).unwrap();
    assert!(mock.deregisters().is_empty());
    let s = c.stats();
    assert_eq!(
        (s.evictions, s.live_registrations, s.bytes_pinned),
        (0, 3, 3 * PAGE)
    );
    assert!(held.iter().all(|h| !h.is_invalidated()));
    // Released, the older ones go when room is next needed.
    drop(held);
    drop(third);
    drop(c.acquire(9 * PAGE, 1).unwrap());
    let s = c.stats();
    assert!(s.bytes_pinned <= 2 * PAGE && s.entries <= 2, "{s:?}");
    assert_eq!(mock.deregisters().len(), 2);
    finish(&mock, c);
}

#[test]
fn oversized_request_is_served_uncached() {
    let mock = Mock::default();
    let c = cache(&mock, 2 * PAGE, 10);
    drop(c.acquire(0, 1).unwrap());
    let h = c.acquire(10 * PAGE, 3 * PAGE).unwrap();
    let s = c.stats();
    assert_eq!((s.uncached, s.entries), (1, 0), "{s:?}");
    drop(h);
    assert_eq!(mock.live(), 0);
    finish(&mock, c);

    let mock = Mock::default();
    let c = cache(&mock, u64::MAX, 0);
    drop(c.acquire(0, 1).unwrap());
    assert_eq!((mock.live(), c.stats().uncached), (0, 1));
    finish(&mock, c);
}

#[test]
fn out_of_space_evicts_unused_and_retries() {
    let mock = Mock::default();
    mock.st().capacity = Some(3 * PAGE);
    let c = big(&mock);
    let keep = c.acquire(0, 1).unwrap();
    drop(c.acquire(PAGE, 1).unwrap());
    drop(c.acquire(2 * PAGE, 1).unwrap());
    let h = c.acquire(3 * PAGE, 1).unwrap();
    let s = c.stats();
    assert_eq!(
        (s.registration_failures, s.evictions, s.entries),
        (1, 2, 2),
        "{s:?}"
    );
    assert!(!keep.is_invalidated());
    // With everything held, the error reaches the caller.
    let err = c.acquire(4 * PAGE, 2 * PAGE).unwrap_err();
    match err {
        CacheError::Register { start, len, source } => {
            assert_eq!(
                (start, len, source),
                (4 * PAGE, 2 * PAGE, MockError::NoSpace)
            );
        }
        other => panic!("{other:?}"),
    }
    drop((keep, h));
    finish(&mock, c);
}

#[test]
fn registrar_error_is_propagated_and_nothing_cached() {
    let mock = Mock::default();
    let c = big(&mock);
    mock.st().fail_next = 1;
    let err = c.acquire(0x30005, 7).unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::Register {
                start: 0x30000,
                len: PAGE,
                source: MockError::Injected
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "registering 0x30000+0x10000 failed: injected failure"
    );
    let s = c.stats();
    assert_eq!(
        (s.entries, s.live_registrations, s.registration_failures),
        (0, 0, 1)
    );
    // The next try registers for real.
    let h = c.acquire(0x30005, 7).unwrap();
    assert_eq!(mock.registers().len(), 2);
    drop(h);
    finish(&mock, c);
}

#[test]
fn reallocation_at_the_same_address_is_detected_by_tag() {
    let mock = Mock::tracked();
    let c = big(&mock);
    let base = 0x7000_0000;
    let first = mock.alloc(base, 3 * PAGE);
    let old = c.acquire_checked(base + 10, 100).unwrap();
    assert_eq!(old.reg().tags, vec![first]);
    assert!(c
        .acquire_checked(base, PAGE)
        .unwrap()
        .same_registration(&old));

    mock.free(base);
    let second = mock.alloc(base, 3 * PAGE);
    assert_ne!(first, second);
    // A plain lookup does not look: it still returns the cached registration.
    assert!(c.acquire(base, 1).unwrap().same_registration(&old));
    let new = c.acquire_checked(base + 10, 100).unwrap();
    assert!(!new.same_registration(&old));
    assert_eq!(new.reg().tags, vec![second]);
    assert!(old.is_invalidated() && !new.is_invalidated());
    let s = c.stats();
    assert_eq!(
        (s.invalidations, s.entries, s.live_registrations),
        (1, 1, 2)
    );
    // The old registration lives on for its holder, and is never handed out again.
    assert!(c.acquire(base, 1).unwrap().same_registration(&new));
    drop(old);
    assert_eq!(mock.live(), 1);
    drop(new);
    finish(&mock, c);
}

#[test]
fn freed_memory_is_detected_by_tag() {
    let mock = Mock::tracked();
    let c = big(&mock);
    mock.alloc(0x100000, PAGE);
    drop(c.acquire_checked(0x100000, 64).unwrap());
    mock.free(0x100000);
    let err = c.acquire_checked(0x100000, 64).unwrap_err();
    assert!(
        matches!(err, CacheError::Freed { addr: 0x100000 }),
        "{err:?}"
    );
    let s = c.stats();
    assert_eq!(
        (s.invalidations, s.entries, s.live_registrations),
        (1, 0, 0)
    );
    assert_eq!(mock.deregisters(), vec![(0x100000, PAGE)]);
    // Nothing cached and nothing to register: a checked miss on freed memory fails too.
    let err = c.acquire_checked(0x100000, 64).unwrap_err();
    assert!(matches!(err, CacheError::Freed { .. }));
    assert_eq!(mock.registers().len(), 1);
    finish(&mock, c);
}

#[test]
fn tag_errors() {
    let mock = Mock::tracked();
    let c = big(&mock);
    mock.alloc(0, 4 * PAGE);
    drop(c.acquire_checked(0, 1).unwrap());
    mock.st().fail_tags = true;
    let err = c.acquire_checked(0, 1).unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::Tag {
                addr: 0,
                source: MockError::TagQuery
            }
        ),
        "{err:?}"
    );
    let err = c.acquire_checked(2 * PAGE, 1).unwrap_err();
    assert!(matches!(err, CacheError::Tag { .. }), "{err:?}");
    assert_eq!(mock.registers().len(), 1);
    // Plain lookups do not depend on tags: the miss registers an untagged entry...
    let h = c.acquire(2 * PAGE, 1).unwrap();
    assert_eq!(mock.registers().len(), 2);
    drop(h);
    mock.st().fail_tags = false;
    // ...which a checked lookup does not trust: it registers afresh.
    let h = c.acquire_checked(2 * PAGE, 1).unwrap();
    assert_eq!(mock.registers().len(), 3);
    assert_eq!(c.stats().invalidations, 1);
    drop(h);
    finish(&mock, c);
}

#[test]
fn allocations_sharing_a_page_converge() {
    let mock = Mock::tracked();
    let c = big(&mock);
    // Two small allocations in one GPU page (as cudaMalloc packs them).
    let a = mock.alloc(0x40000, 0x200);
    let b = mock.alloc(0x40200, 0x200);
    let ha = c.acquire_checked(0x40000, 0x200).unwrap();
    // The registration saw both allocations, but the entry only vouches for the one looked up.
    assert_eq!(ha.reg().tags, vec![a, b]);
    let hb = c.acquire_checked(0x40200, 0x200).unwrap();
    assert!(!hb.same_registration(&ha));
    // From now on both hit the same entry.
    for _ in 0..3 {
        assert!(c
            .acquire_checked(0x40000, 0x200)
            .unwrap()
            .same_registration(&hb));
        assert!(c
            .acquire_checked(0x40200, 0x200)
            .unwrap()
            .same_registration(&hb));
    }
    assert_eq!(mock.registers().len(), 2);
    drop((ha, hb));
    finish(&mock, c);
}

#[test]
fn untracked_registrar_trusts_entries() {
    let mock = Mock::default();
    let c = big(&mock);
    let h = c.acquire_checked(0x5000, 1).unwrap();
    assert!(c.acquire_checked(0x5000, 1).unwrap().same_registration(&h));
    assert_eq!(c.stats().hits, 1);
    drop(h);
    finish(&mock, c);
}

#[test]
fn explicit_invalidate_removes_overlapping_entries() {
    let mock = Mock::default();
    let c = big(&mock);
    for i in [0, 2, 4, 6] {
        drop(c.acquire(i * PAGE, 2 * PAGE).unwrap());
    }
    let held = c.acquire(2 * PAGE, 1).unwrap();
    assert_eq!(c.invalidate(3 * PAGE, 0), 0);
    // One byte in [2,4) pages and one in [4,6): both go; [0,2) and [6,8) stay.
    assert_eq!(c.invalidate(4 * PAGE - 1, 2), 2);
    let s = c.stats();
    assert_eq!(
        (s.entries, s.invalidations, s.live_registrations),
        (2, 2, 3)
    );
    assert_eq!(mock.deregisters(), vec![(4 * PAGE, 2 * PAGE)]);
    // The held one is flagged, still registered, and never returned again.
    assert!(held.is_invalidated());
    let fresh = c.acquire(2 * PAGE, 1).unwrap();
    assert!(!fresh.same_registration(&held));
    drop(held);
    assert_eq!(mock.deregisters().len(), 2);
    assert!(c.acquire(PAGE, 1).unwrap().reg().id == 1);
    // Invalidating everything.
    assert_eq!(c.invalidate(0, u64::MAX), 3);
    assert_eq!(c.stats().entries, 0);
    drop(fresh);
    finish(&mock, c);
}

/// A registration that raced with an overlapping invalidation (the allocator freeing the memory
/// while it was being registered) is handed out but not cached; one that raced with unrelated
/// invalidations is cached.
#[test]
fn registration_racing_an_invalidation_is_not_cached() {
    let mock = Mock::default();
    let c = Arc::new(big(&mock));
    let during = |f: CacheHook| {
        let c2 = Arc::clone(&c);
        *mock.0.during_register.lock().unwrap() = Some(Box::new(move || f(&c2)));
    };

    during(Box::new(|c| assert_eq!(c.invalidate(PAGE + 100, 1), 0)));
    let h = c.acquire(PAGE, 10).unwrap();
    let s = c.stats();
    assert_eq!((s.uncached, s.entries), (1, 0));
    drop(h);
    assert_eq!(mock.live(), 0);

    during(Box::new(|c| {
        c.invalidate(10 * PAGE, PAGE);
        c.invalidate(0, PAGE);
    }));
    drop(c.acquire(PAGE, 10).unwrap());
    let s = c.stats();
    assert_eq!((s.uncached, s.entries), (1, 1));

    // More unrelated invalidations than the log remembers: cached no more (conservative).
    during(Box::new(|c| {
        for i in 0..100 {
            c.invalidate((100 + i) * PAGE, 1);
        }
    }));
    drop(c.acquire(3 * PAGE, 10).unwrap());
    let s = c.stats();
    assert_eq!((s.uncached, s.entries), (2, 1));
    let c = Arc::into_inner(c).unwrap();
    finish(&mock, c);
}

#[test]
fn handles_outlive_the_cache() {
    let mock = Mock::default();
    let c = big(&mock);
    let h = c.acquire(0, 1).unwrap();
    drop(c.acquire(PAGE, 1).unwrap());
    drop(c);
    assert_eq!(mock.live(), 1);
    assert_eq!(h.reg().start, 0);
    drop(h);
    assert_eq!(mock.live(), 0);
    assert_eq!(mock.st().bad_deregs, 0);
}

#[test]
fn evict_unused_spares_held_entries() {
    let mock = Mock::default();
    let c = big(&mock);
    let h = c.acquire(0, 1).unwrap();
    drop(c.acquire(PAGE, 1).unwrap());
    drop(c.acquire(2 * PAGE, 1).unwrap());
    assert_eq!(c.evict_unused(), 2);
    assert_eq!(c.stats().entries, 1);
    assert!(c.acquire(0, 1).unwrap().same_registration(&h));
    drop(h);
    finish(&mock, c);
}

/// Eight threads acquire random ranges (plain and checked), hold some handles a while, and
/// invalidate or reallocate at random. Every handle must cover its request with a registration
/// that is alive; counts must add up; nothing may leak.
#[test]
fn eight_threads_hammering() {
    const SPAN: u64 = 256 * PAGE;
    const ALLOC: u64 = 4 * PAGE;
    const OPS: usize = 4000;
    let mock = Mock::tracked();
    for i in 0..SPAN / ALLOC {
        mock.alloc(i * ALLOC, ALLOC);
    }
    let c = Arc::new(cache(&mock, 64 * PAGE, 24));
    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let acquires = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (c, mock, acquires) = (Arc::clone(&c), mock.clone(), Arc::clone(&acquires));
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed + t);
                let mut held: Vec<RegHandle<Mock>> = Vec::new();
                for _ in 0..OPS {
                    match rng.gen_range(0..100) {
                        0..=2 => {
                            let start = rng.gen_range(0..SPAN);
                            c.invalidate(start, rng.gen_range(1..8 * PAGE));
                        }
                        3 => {
                            // Free and reallocate one allocation in place (new tag).
                            let a = rng.gen_range(0..SPAN / ALLOC) * ALLOC;
                            let mut st = mock.st();
                            st.next_alloc += 1;
                            let id = st.next_alloc;
                            st.allocs.insert(a, (a + ALLOC, id));
                        }
                        r => {
                            // Stay inside one allocation, as real users do.
                            let a = rng.gen_range(0..SPAN / ALLOC) * ALLOC;
                            let off = rng.gen_range(0..ALLOC - 1);
                            let len = rng.gen_range(1..=ALLOC - off);
                            let checked = r >= 50;
                            let id_before = alloc_at(&mock.st(), a);
                            let h = if checked {
                                c.acquire_checked(a + off, len)
                            } else {
                                c.acquire(a + off, len)
                            }
                            .unwrap_or_else(|e| panic!("acquire {:#x}+{len:#x}: {e}", a + off));
                            acquires.fetch_add(1, Ordering::Relaxed);
                            check_cover(&h, a + off, len);
                            // A checked lookup never hands out a registration made before the
                            // allocation it was asked about (unless that changed meanwhile).
                            if checked && id_before == alloc_at(&mock.st(), a) {
                                let id = id_before.unwrap();
                                assert!(h.reg().tags.contains(&id), "{h:?} lacks tag {id}");
                            }
                            assert!(mock.st().live.contains_key(&h.reg().id));
                            if rng.gen_bool(0.3) {
                                held.push(h);
                            }
                            if held.len() > 6 {
                                held.swap_remove(rng.gen_range(0..held.len()));
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = c.stats();
    assert_eq!(s.hits + s.misses, acquires.load(Ordering::Relaxed), "{s:?}");
    assert_eq!(s.registration_failures, 0);
    assert_eq!(s.registrations, mock.st().next_reg);
    // Only the cache holds registrations now.
    assert_eq!(s.live_registrations, s.entries, "{s:?}");
    assert_eq!(s.live_registrations, mock.live());
    assert_eq!(s.bytes_cached, s.bytes_pinned);
    assert!(
        s.hits > 0 && s.evictions > 0 && s.invalidations > 0,
        "{s:?}"
    );
    // Threads held handles while inserting, so the cache may be over budget; with nothing held,
    // the next miss brings it back.
    drop(c.acquire(SPAN + PAGE, 1).unwrap());
    let s = c.stats();
    assert!(s.entries <= 24 && s.bytes_cached <= 64 * PAGE, "{s:?}");
    let c = Arc::into_inner(c).unwrap();
    finish(&mock, c);
}

/// A registrar that, like a CUDA export, registers only the part of the asked range inside the
/// caller's allocation (two 4 KiB allocations share one 64 KiB page here).
struct Clamping {
    allocs: Vec<(u64, u64)>,
    registered: Mutex<Vec<(u64, u64)>>,
}

impl Registrar for Clamping {
    type Reg = (u64, u64);
    type Error = MockError;

    fn register(&self, start: u64, len: u64) -> Result<(u64, u64), MockError> {
        self.registered.lock().unwrap().push((start, len));
        Ok((start, start + len))
    }

    fn register_around(
        &self,
        start: u64,
        len: u64,
        addr: u64,
        size: u64,
    ) -> Result<(u64, u64), MockError> {
        let &(a, b) = self
            .allocs
            .iter()
            .find(|&&(a, b)| a <= addr && addr + size <= b)
            .ok_or(MockError::Injected)?;
        let (s, e) = (start.max(a), (start + len).min(b));
        self.registered.lock().unwrap().push((s, e - s));
        Ok((s, e))
    }

    fn covers(&self, reg: &(u64, u64), addr: u64, size: u64) -> bool {
        reg.0 <= addr && addr + size <= reg.1
    }
}

#[test]
fn registrations_smaller_than_the_page_are_replaced_when_they_do_not_cover() {
    let a = (5 * PAGE, 5 * PAGE + 4096);
    let b = (5 * PAGE + 4096, 5 * PAGE + 8192);
    let cache = RegCache::new(
        Clamping {
            allocs: vec![a, b],
            registered: Mutex::new(Vec::new()),
        },
        CacheConfig::new(u64::MAX, 100),
    )
    .unwrap();
    let ha = cache.acquire(a.0 + 10, 100).unwrap();
    assert_eq!(*ha.reg(), a);
    // Same allocation again: a hit.
    let ha2 = cache.acquire(a.0 + 200, 50).unwrap();
    assert!(ha.same_registration(&ha2));
    // The other allocation in the same page: the entry does not cover it, so it is replaced.
    let hb = cache.acquire(b.0, 4096).unwrap();
    assert_eq!(*hb.reg(), b);
    assert!(!hb.same_registration(&ha));
    assert!(ha.is_invalidated(), "the replaced entry is retired");
    // The holder of the old registration keeps it.
    assert_eq!(*ha.reg(), a);
    let hb2 = cache.acquire_checked(b.0 + 1, 1).unwrap();
    assert!(hb.same_registration(&hb2));
    assert_eq!(
        *cache.registrar().registered.lock().unwrap(),
        vec![(a.0, 4096), (b.0, 4096)]
    );
    let s = cache.stats();
    assert_eq!((s.hits, s.misses, s.entries), (2, 2, 1));
}

/// A registrar that registers less than the cache asks for: only the host pages around the
/// caller's range (as a dma-buf export fitted to a small allocation does).
struct Fitted;

impl Registrar for Fitted {
    type Reg = (u64, u64);
    type Error = std::io::Error;

    fn register(&self, start: u64, len: u64) -> Result<(u64, u64), std::io::Error> {
        Ok((start, len))
    }

    fn register_around(
        &self,
        _start: u64,
        _len: u64,
        addr: u64,
        size: u64,
    ) -> Result<(u64, u64), std::io::Error> {
        let s = addr & !0xfff;
        Ok((s, (addr + size - s).next_multiple_of(0x1000)))
    }

    fn reg_range(&self, reg: &(u64, u64)) -> Option<(u64, u64)> {
        Some(*reg)
    }
}

#[test]
fn handles_describe_what_was_really_registered() {
    let cache = RegCache::new(Fitted, CacheConfig::new(1 << 30, 64)).unwrap();
    let addr = 7 * PAGE + 0x2345;
    let h = cache.acquire(addr, 100).unwrap();
    // The cache's key is the whole 64 KiB page; the registration is the 4 KiB page around it,
    // and offset() must be relative to the registration, where an importer would use it.
    assert_eq!(*h.reg(), (7 * PAGE + 0x2000, 0x1000));
    assert_eq!((h.reg_start(), h.reg_len()), (7 * PAGE + 0x2000, 0x1000));
    assert_eq!(h.offset(), 0x345);
}
