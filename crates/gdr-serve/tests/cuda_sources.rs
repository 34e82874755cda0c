//! Every gdr-serve device program compiles with NVRTC for Hopper (sm_90) in a few seconds, at
//! most 8 each (a server compiles one at start; LeNet's, with the app in three kernels' code,
//! is the slowest). Needs NVRTC, no GPU (`GDR_NVRTC` may point at a libnvrtc.so); skipped
//! without it.

use gdr::cuda::nvrtc;
use gdr_serve::App;
use gdr_testing::skip_or_fail;
use std::time::{Duration, Instant};

const USER_APP: &str = r#"
// Negates every byte; shows the group API.
__device__ unsigned int gdr_serve_app(const gdr_serve_group &g, const unsigned char *req,
                                      unsigned int len, unsigned char *resp, unsigned int cap) {
    if (len > cap) return GDR_SERVE_FAILED;
    for (unsigned int i = g.rank; i < len; i += g.size) resp[i] = (unsigned char)~req[i];
    gdr_serve_sync(g);
    return len;
}
"#;

#[test]
fn every_app_and_worker_build_compiles_quickly_for_sm_90() {
    if let Err(e) = nvrtc::version() {
        skip_or_fail::<()>(
            "every_app_and_worker_build_compiles_quickly_for_sm_90",
            &e.to_string(),
        );
        return;
    }
    let apps = [
        App::builtin("echo", 1, 1024).unwrap(),
        App::builtin("lenet", 1, 1024).unwrap(),
        App::builtin("lenet", 50, 1024).unwrap(),
        App::builtin("vecadd", 1, 1024).unwrap(),
        App::user("negate.cu", USER_APP.into(), 100, 1, 512).unwrap(),
    ];
    // Every worker build: each RX format, with and without the stage clocks, and lenet's
    // clusters of 2, 4 and 8 blocks; each at the default block size for its shape, and
    // lenet's clusters of 8 also at 16 warps (--warps 16).
    let builds = [(false, false), (true, false), (false, true), (true, true)];
    for app in apps {
        let clusters: &[u32] = if app.has_cluster_form() {
            &[1, 2, 4, 8]
        } else {
            &[1]
        };
        for (rx_words, profile) in builds {
            let shapes = clusters
                .iter()
                .map(|&c| (c, app.default_warps_for(c)))
                .chain(app.has_cluster_form().then_some((8, 16)));
            for (cluster, warps) in shapes {
                if cluster > 1 && profile && rx_words {
                    continue; // the cluster code is the same with either format
                }
                let t = Instant::now();
                let prog = app
                    .worker_handler(rx_words, profile, cluster, warps)
                    .program();
                let what = format!(
                    "{} (rx_words {rx_words}, profile {profile}, cluster {cluster}, warps {warps})",
                    app.name()
                );
                match nvrtc::compile(app.name(), &prog, "90") {
                    Ok(cubin) => assert!(cubin.starts_with(b"\x7fELF"), "{what}: not a cubin"),
                    Err(e) => panic!("{what}: {e}"),
                }
                let took = t.elapsed();
                println!("{what} (work {}): {took:?}", app.work());
                assert!(took < Duration::from_secs(8), "{what}: {took:?}");
            }
        }
    }
}

#[test]
fn a_user_app_with_an_error_reports_it_by_file_name() {
    if nvrtc::version().is_err() {
        return; // reported above
    }
    let bad = "__device__ unsigned int gdr_serve_app(const gdr_serve_group &g, const unsigned \
               char *req, unsigned int len, unsigned char *resp, unsigned int cap) { return \
               nope; }";
    let app = App::user("broken_app.cu", bad.into(), 100, 1, 64).unwrap();
    let err = nvrtc::compile("broken", &app.handler().program(), "90")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("broken_app.cu") && err.contains("nope"),
        "{err}"
    );
}
