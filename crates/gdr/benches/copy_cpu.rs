//! CPU-only sanity benchmark of the `gdr::copy` kernels on ordinary memory, against
//! `ptr::copy_nonoverlapping` in the same run.
//!
//! Ordinary memory is not a write-combined BAR mapping: streaming stores here bypass the cache
//! (so they lose to `memcpy` on sizes that fit in it) and streaming loads act as plain loads. The
//! table is a quick check that nothing is pathologically slow, not a claim about GPU copies.
//!
//! Run: `cargo bench -p gdr --bench copy_cpu` (add `-- quick` for fewer repetitions).

use std::hint::black_box;
use std::time::Instant;

use gdr::copy::{self, Isa};

/// Aligned scratch memory with room for offsets.
struct Buf {
    mem: Vec<u8>,
    base: usize,
}

impl Buf {
    fn new(len: usize) -> Buf {
        let mut mem = vec![0u8; len + 4096 + 64];
        for (i, b) in mem.iter_mut().enumerate() {
            *b = (i * 31 + 7) as u8;
        }
        let addr = mem.as_ptr() as usize;
        let base = ((addr + 63) & !63) - addr;
        Buf { mem, base }
    }

    fn ptr(&mut self) -> *mut u8 {
        self.mem[self.base..].as_mut_ptr()
    }

    fn slice(&self, len: usize) -> &[u8] {
        &self.mem[self.base..self.base + len]
    }

    fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        &mut self.mem[self.base..self.base + len]
    }
}

/// Median over `samples` of the mean time of `batch` calls, in nanoseconds.
fn median_ns(samples: usize, batch: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..samples)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..batch {
                f();
            }
            t.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times[times.len() / 2]
}

#[derive(Clone, Copy)]
enum Way {
    Memcpy,
    Isa(Isa),
    Parallel(usize),
}

impl Way {
    fn label(self) -> String {
        match self {
            Way::Memcpy => "memcpy".to_string(),
            Way::Isa(isa) => isa.to_string(),
            Way::Parallel(t) => format!("default x{t}"),
        }
    }
}

fn store(way: Way, dst: *mut u8, src: &[u8]) {
    match way {
        // SAFETY: `dst` has room for `src.len()` bytes and does not overlap `src`.
        Way::Memcpy => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) },
        // SAFETY: as above; only available ISAs are benchmarked.
        Way::Isa(isa) => unsafe { copy::copy_to_mapping_with(isa, dst, src) }.expect("available"),
        // SAFETY: as above.
        Way::Parallel(t) => unsafe { copy::copy_to_mapping_parallel(dst, src, t) },
    }
}

fn load(way: Way, dst: &mut [u8], src: *const u8) {
    match way {
        // SAFETY: `src` has `dst.len()` readable bytes (and whole lines) and does not overlap.
        Way::Memcpy => unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) },
        // SAFETY: as above; only available ISAs are benchmarked.
        Way::Isa(isa) => unsafe { copy::copy_from_mapping_with(isa, dst, src) }.expect("available"),
        // SAFETY: as above.
        Way::Parallel(t) => unsafe { copy::copy_from_mapping_parallel(dst, src, t) },
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let scale = if quick { 5 } else { 1 };
    println!("gdr::copy on ordinary memory (sanity check; not a BAR mapping)");
    println!(
        "CPU ISAs available: {}; plain routines use store {} / load {}",
        Isa::available()
            .iter()
            .map(|i| i.name())
            .collect::<Vec<_>>()
            .join(" "),
        Isa::detected_store(),
        Isa::detected_load()
    );

    let small = [1usize, 8, 64, 256, 4096];
    let large = [64usize << 10, 1 << 20, 16 << 20];
    let mut src = Buf::new(16 << 20);
    let mut dst = Buf::new(16 << 20);

    for (title, ways) in [
        ("store (to mapping)", store_ways()),
        ("load (from mapping)", load_ways()),
    ] {
        let is_store = title.starts_with("store");
        println!("\n{title}: median ns per copy");
        print!("{:>14}", "way");
        for s in small {
            print!("{s:>10}");
        }
        println!();
        for &way in ways.iter().filter(|w| !matches!(w, Way::Parallel(_))) {
            print!("{:>14}", way.label());
            for s in small {
                let ns = median_ns(200 / scale, 200, || {
                    if is_store {
                        store(way, black_box(dst.ptr()), black_box(src.slice(s)));
                    } else {
                        let from = src.ptr();
                        load(way, black_box(dst.slice_mut(s)), black_box(from));
                    }
                });
                print!("{ns:>10.1}");
            }
            println!();
        }
        println!("{title}: GB/s (median)");
        print!("{:>14}", "way");
        for s in large {
            print!("{:>9}K", s >> 10);
        }
        println!();
        for &way in &ways {
            print!("{:>14}", way.label());
            for s in large {
                let reps = (64 << 20) / s / scale;
                let ns = median_ns(reps.max(3), 1, || {
                    if is_store {
                        store(way, black_box(dst.ptr()), black_box(src.slice(s)));
                    } else {
                        let from = src.ptr();
                        load(way, black_box(dst.slice_mut(s)), black_box(from));
                    }
                });
                print!("{:>10.1}", s as f64 / ns);
            }
            println!();
        }
    }
}

fn store_ways() -> Vec<Way> {
    let mut v = vec![Way::Memcpy];
    v.extend(Isa::available_for_store().into_iter().map(Way::Isa));
    v.extend([2, 4].map(Way::Parallel));
    v
}

fn load_ways() -> Vec<Way> {
    let mut v = vec![Way::Memcpy];
    v.extend(Isa::available_for_load().into_iter().map(Way::Isa));
    v.extend([2, 4].map(Way::Parallel));
    v
}
