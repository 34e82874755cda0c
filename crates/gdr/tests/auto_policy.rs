//! The auto copier's decisions without a GPU: the typical calibration a machine without a cached
//! one gets (the C library uses it), and the size below which a caller may skip asking.

use gdr::bar::auto::{class_of, AutoCopier, Calibration, Direction, Path, CLASSES};

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[test]
fn typical_reads_use_the_copy_engine_from_16_kib_and_writes_threads_from_32_kib() {
    let cal = Calibration::typical();
    assert_eq!((cal.to_gpu.len(), cal.from_gpu.len()), (CLASSES, CLASSES));
    assert!(cal.points.is_empty());
    for k in 0..CLASSES {
        let want_from = if k < 14 {
            Path::Mapping { threads: 1 }
        } else {
            Path::CopyEngine
        };
        assert_eq!(cal.from_gpu[k], want_from, "gpu->cpu class {k}");
        let want_threads = match k {
            0..=14 => 1,
            15 => 2,
            16..=21 => 4,
            _ => 8,
        }
        .min(cores());
        assert_eq!(
            cal.to_gpu[k],
            Path::Mapping {
                threads: want_threads
            },
            "cpu->gpu class {k}"
        );
    }
}

#[test]
fn smallest_off_one_thread_is_the_first_class_that_leaves_it() {
    let copier = AutoCopier::fixed(Calibration::typical());
    assert_eq!(
        copier.smallest_off_one_thread(Direction::FromGpu),
        16 * 1024
    );
    let to = copier.smallest_off_one_thread(Direction::ToGpu);
    if cores() > 1 {
        assert_eq!(to, 32 * 1024);
    } else {
        assert_eq!(to, usize::MAX, "one core: every write stays on one thread");
    }
    // Below the threshold the copier's own choice is the one-thread mapping.
    for len in [1, 8, 4095, 16 * 1024 - 1] {
        assert_eq!(
            copier.path_for(Direction::FromGpu, len),
            Path::Mapping { threads: 1 },
            "{len} bytes"
        );
    }
    assert_eq!(
        copier.path_for(Direction::FromGpu, 1 << 20),
        Path::CopyEngine
    );
    assert_eq!(class_of(16 * 1024), 14);
}

#[test]
fn copy_with_calls_once_with_the_chosen_path_and_returns_its_result() {
    let copier = AutoCopier::fixed(Calibration::typical());
    let mut seen = Vec::new();
    let r: Result<(), &str> = copier.copy_with(Direction::FromGpu, 1 << 20, |p| {
        seen.push(p);
        Err("from the copy")
    });
    assert_eq!(r, Err("from the copy"));
    assert_eq!(seen, vec![Path::CopyEngine]);
}
