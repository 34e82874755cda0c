//! A worker block waiting for block 0's one-time app setup gives up after
//! `GDR_SERVE_INIT_TIMEOUT_NS` and traps: a setup that never ends (or a block 0 that never
//! runs) fails the launch, reported to the host, instead of holding the GPU forever. Its own
//! test binary: the trap leaves this process's CUDA context unusable.

use gdr_serve::apps::ID_USER;
use gdr_serve::gpu::{launch_workers, GpuShape};
use gdr_serve::App;
use gdr_testing::gpu_context;
use std::time::{Duration, Instant};

/// A user app whose one-time setup (block 0) takes 300 ms, with a 1 ms bound on the wait.
const SLOW_INIT: &str = r#"
#define GDR_SERVE_INIT_TIMEOUT_NS 1000000ull
#define GDR_SERVE_APP_INIT gdr_test_slow_init
__device__ void gdr_test_slow_init(unsigned t, unsigned n) {
    const gdr_u64 t0 = gdr_globaltimer_ns();
    while (gdr_globaltimer_ns() - t0 < 300000000ull) { }
}
__device__ unsigned int gdr_serve_app(const gdr_serve_group &g, const unsigned char *req,
                                      unsigned int len, unsigned char *resp, unsigned int cap) {
    return 0;
}
"#;

#[test]
fn blocks_waiting_for_a_setup_past_the_bound_trap() {
    let name = "blocks_waiting_for_a_setup_past_the_bound_trap";
    let Some(ctx) = gpu_context(name) else { return };
    let app = App::user("slow_init", SLOW_INIT.into(), ID_USER, 1, 64).unwrap();
    let shape = GpuShape {
        slots: 64,
        warps: 1,
        blocks_per_queue: 2,
        ..Default::default()
    };
    let t = Instant::now();
    let w = launch_workers(&ctx, &app, 1, &shape).unwrap_or_else(|e| panic!("{name}: {e}"));
    // Block 1 traps about 1 ms into its wait, well before block 0's setup ends at 300 ms.
    let err = loop {
        match w.running() {
            Err(e) => break e,
            Ok(true) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Ok(running) => panic!(
                "{name}: no failure after {:?} (running: {running})",
                t.elapsed()
            ),
        }
    };
    let msg = err.to_string();
    assert!(
        msg.contains("CUDA") || msg.contains("cuStreamQuery"),
        "{msg}"
    );
    println!("{name}: the launch failed after {:?}: {msg}", t.elapsed());
}

/// The app above compiles into a whole worker program (NVRTC only; skipped without it).
#[test]
fn the_slow_init_app_compiles() {
    let name = "the_slow_init_app_compiles";
    if let Err(e) = gdr::cuda::nvrtc::version() {
        gdr_testing::skip_or_fail::<()>(name, &e.to_string());
        return;
    }
    let app = App::user("slow_init", SLOW_INIT.into(), ID_USER, 1, 64).unwrap();
    let program = app.handler().program();
    let cubin = gdr::cuda::nvrtc::compile(name, &program, "90").unwrap_or_else(|e| panic!("{e}"));
    assert!(cubin.starts_with(b"\x7fELF"));
}
