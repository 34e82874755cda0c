//! The apps a server runs: `echo`, `lenet`, `vecadd`, or a user's CUDA C file; each with its
//! request checks, a CPU implementation (the reference tests compare against, and the CPU
//! backend), and its device source.

use crate::lenet;
use crate::wire::Status;
use crate::ServeError;
use std::sync::Arc;

/// The app id (request header offset 4) of `echo`: the response is the request's payload.
pub const ID_ECHO: u16 = 1;
/// The app id of `lenet`: a 784-byte 28x28 image in, ten f32 logits (40 bytes) out.
pub const ID_LENET: u16 = 2;
/// The app id of `vecadd`: n f32 `a` then n f32 `b` in (8n bytes), n f32 `a + b` out.
pub const ID_VECADD: u16 = 3;
/// Default id of a user app.
pub const ID_USER: u16 = 100;

/// Default weight seed of `lenet`.
pub const DEFAULT_SEED: u32 = 1;

/// Warps of a cluster worker's blocks when the user does not say: warp 0 and 7 app warps,
/// 224 threads for phases of at most 196 work items (LeNet over 8 SMs), so each phase runs in
/// one pass and more warps only add idle ones; under the 256-thread launch bound warp 0's loop
/// does not spill (docs/serve.md, "Architecture").
pub const CLUSTER_WARPS: u32 = 8;

const SERVE_CUH: &str = include_str!("cuda/serve.cuh");
const LENET_CUH: &str = include_str!("cuda/lenet.cuh");
const KERNELS_CU: &str = include_str!("cuda/kernels.cu");
/// The persistent worker kernel `kernels.cu` defines.
const WORKER_KERNEL: &str = "gdr_serve_worker";

/// Which app: one of the built-ins or a user's CUDA source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppKind {
    /// Answers with the request's payload ([`ID_ECHO`]).
    Echo,
    /// LeNet-5 inference on a 28x28 image ([`ID_LENET`]), with weights generated from a seed.
    Lenet {
        /// The seed of the weights (the same on the GPU and in the CPU reference).
        seed: u32,
    },
    /// Element-wise sum of two f32 vectors ([`ID_VECADD`]).
    Vecadd,
    /// A user's app, [`ID_USER`] unless given another id.
    User {
        /// CUDA C defining `gdr_serve_app` (see `docs/serve.md`).
        source: String,
    },
}

/// An app and its limits.
///
/// # Examples
///
/// ```
/// use gdr_serve::wire::Status;
/// use gdr_serve::App;
///
/// let vecadd = App::builtin("vecadd", 1, 1024)?;
/// // A request is two vectors of little-endian f32; the answer is their sum.
/// let (a, b) = ([1.5f32, 2.0], [10.0f32, -20.0]);
/// let req: Vec<u8> = a.iter().chain(&b).flat_map(|x| x.to_le_bytes()).collect();
/// assert_eq!(vecadd.check(req.len()), Ok(()));
/// let mut resp = [0u8; 8];
/// assert_eq!(vecadd.run_cpu(&req, &mut resp), Some(8));
/// assert_eq!(resp[..4], 11.5f32.to_le_bytes());
/// assert_eq!(resp[4..], (-18.0f32).to_le_bytes());
/// assert_eq!(vecadd.check(12), Err(Status::Truncated), "not whole pairs");
/// assert!(App::builtin("resnet", 1, 1024).is_err());
/// # Ok::<(), gdr_serve::ServeError>(())
/// ```
#[derive(Clone)]
pub struct App {
    kind: AppKind,
    name: String,
    id: u16,
    work: u32,
    max_request: usize,
    weights: Option<Arc<Vec<f32>>>,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field("id", &self.id)
            .field("work", &self.work)
            .field("max_request", &self.max_request)
            .finish()
    }
}

impl App {
    /// A built-in app by name: `echo` and `vecadd` take requests up to `max_payload` bytes;
    /// `lenet` exactly 784. `work` >= 1 repeats the computation that many times (same answer)
    /// to make a request heavier.
    pub fn builtin(name: &str, work: u32, max_payload: usize) -> Result<App, ServeError> {
        let (kind, id, max_request) = match name {
            "echo" => (AppKind::Echo, ID_ECHO, max_payload),
            "lenet" => (
                AppKind::Lenet { seed: DEFAULT_SEED },
                ID_LENET,
                lenet::IMAGE_BYTES,
            ),
            "vecadd" => (AppKind::Vecadd, ID_VECADD, max_payload / 8 * 8),
            other => {
                return Err(ServeError::Config(format!(
                    "unknown app `{other}` (echo, lenet, vecadd, or --app-file FILE.cu)"
                )))
            }
        };
        App::new(kind, name, id, work, max_request)
    }

    /// `lenet` with another weight seed.
    pub fn lenet(seed: u32, work: u32) -> Result<App, ServeError> {
        App::new(
            AppKind::Lenet { seed },
            "lenet",
            ID_LENET,
            work,
            lenet::IMAGE_BYTES,
        )
    }

    /// The CUDA source of a user app from `path`: a regular file of at most
    /// [`MAX_APP_SOURCE`](crate::limits::MAX_APP_SOURCE) bytes of UTF-8. FIFOs, devices and
    /// directories are refused before they are opened (a FIFO would block, /dev/zero never
    /// ends), and the read stops past the bound whatever the file claims.
    pub fn read_source(path: &std::path::Path) -> Result<String, ServeError> {
        use crate::limits::MAX_APP_SOURCE;
        use gdr::regular_file::{read, RegularFileError};
        let bytes = read(path, MAX_APP_SOURCE).map_err(|e| match e {
            RegularFileError::NotRegular { .. } => {
                ServeError::Config(format!("{e}: --app-file takes a CUDA C source file"))
            }
            RegularFileError::TooLong { .. } => {
                ServeError::Config(format!("{e}: an app source is far smaller"))
            }
            e => ServeError::Config(e.to_string()),
        })?;
        let bad = |why: &str| ServeError::Config(format!("{}: {why}", path.display()));
        String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text"))
    }

    /// A user app: `source` defines `gdr_serve_app`; requests up to `max_request` bytes,
    /// responses up to the same.
    pub fn user(
        name: &str,
        source: String,
        id: u16,
        work: u32,
        max_request: usize,
    ) -> Result<App, ServeError> {
        if !source.contains("gdr_serve_app") {
            return Err(ServeError::Config(format!(
                "{name}: the source must define `__device__ unsigned int gdr_serve_app(const \
                 gdr_serve_group &g, const unsigned char *req, unsigned int len, unsigned char \
                 *resp, unsigned int cap)`"
            )));
        }
        App::new(AppKind::User { source }, name, id, work, max_request)
    }

    fn new(
        kind: AppKind,
        name: &str,
        id: u16,
        work: u32,
        max_request: usize,
    ) -> Result<App, ServeError> {
        if work == 0 || work > 1_000_000 {
            return Err(ServeError::Config(format!(
                "--work must be in 1..=1000000, got {work}"
            )));
        }
        if max_request == 0 || max_request > crate::wire::MAX_DATAGRAM - crate::wire::HEADER_LEN {
            return Err(ServeError::Config(format!(
                "bad request size limit {max_request}"
            )));
        }
        let weights = match kind {
            AppKind::Lenet { seed } => Some(Arc::new(lenet::weights(seed))),
            _ => None,
        };
        Ok(App {
            kind,
            name: name.into(),
            id,
            work,
            max_request,
            weights,
        })
    }

    /// Which app this is.
    pub fn kind(&self) -> &AppKind {
        &self.kind
    }
    /// The app's name: the built-in's (`echo`, `lenet`, `vecadd`) or the one a user app was
    /// given (its file name); it names the device program and the reports.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The app id requests for it carry in the `Gdr` framing.
    pub fn id(&self) -> u16 {
        self.id
    }
    /// How many times each request's computation is repeated (1 to 1,000,000; the answer is
    /// the same, the request heavier).
    pub fn work(&self) -> u32 {
        self.work
    }
    /// Largest request payload in bytes (header excluded); longer ones are
    /// [`Status::Oversized`].
    pub fn max_request(&self) -> usize {
        self.max_request
    }

    /// Largest response in bytes.
    pub fn max_response(&self) -> usize {
        match self.kind {
            AppKind::Lenet { .. } => lenet::LOGITS_BYTES,
            AppKind::Vecadd => self.max_request / 2,
            _ => self.max_request,
        }
    }

    /// Bytes of the app's resident data (`GDR_SERVE_RESIDENT_FLOATS`, see serve.cuh), which
    /// a persistent worker block keeps in dynamic shared memory where the GPU allows: lenet's
    /// FC weights and biases; 0 for the others.
    pub fn resident_bytes(&self) -> u32 {
        match self.kind {
            AppKind::Lenet { .. } => lenet::RESIDENT_FLOATS as u32 * 4,
            _ => 0,
        }
    }

    /// A light app: a request's work is a few memory operations (echo, vecadd), less than
    /// what handing it to more warps would cost. Its workers are one warp a block, which
    /// receives, runs the app inlined and sends, with no block barrier; heavy apps (lenet,
    /// user apps) get a block whose other warps run the app.
    pub fn light(&self) -> bool {
        matches!(self.kind, AppKind::Echo | AppKind::Vecadd)
    }

    /// Warps per one-block worker when the user does not say: 1 for a light app, else 16
    /// ([`default_warps_for`](Self::default_warps_for) a cluster of 1).
    pub fn default_warps(&self) -> u32 {
        self.default_warps_for(1)
    }

    /// Warps per worker block when the user does not say, for workers of `cluster` blocks a
    /// queue: 1 for a light app; [`CLUSTER_WARPS`] for an app's cluster form (a block there
    /// runs 1/cluster of each request, for which LeNet's phases need at most 196 threads);
    /// else 16.
    pub fn default_warps_for(&self, cluster: u32) -> u32 {
        if self.light() {
            1
        } else if cluster > 1 && self.has_cluster_form() {
            CLUSTER_WARPS
        } else {
            16
        }
    }

    /// Whether the app has a form that runs one request over a thread-block cluster of
    /// several SMs (lenet.cuh's `gdr_app_lenet_cluster`; Hopper and later).
    pub fn has_cluster_form(&self) -> bool {
        matches!(self.kind, AppKind::Lenet { .. })
    }

    /// The RX format when the user does not say: words (one memory round trip to find and
    /// read a request) for a light app, whose round trip that is most of; header for the
    /// others, where it measured the same and batches are claimed by doorbell.
    pub fn default_rx_words(&self) -> bool {
        self.light()
    }

    /// Payload bytes a queue slot must hold (requests and responses share a slot size).
    pub fn slot_payload(&self) -> usize {
        self.max_request
            .max(self.max_response())
            .next_multiple_of(16)
    }

    /// Whether a request payload of `len` bytes is acceptable.
    pub fn check(&self, len: usize) -> Result<(), Status> {
        match self.kind {
            AppKind::Lenet { .. } if len < lenet::IMAGE_BYTES => Err(Status::Truncated),
            AppKind::Lenet { .. } if len > lenet::IMAGE_BYTES => Err(Status::Oversized),
            AppKind::Vecadd if len == 0 || !len.is_multiple_of(8) => Err(Status::Truncated),
            _ if len > self.max_request => Err(Status::Oversized),
            _ => Ok(()),
        }
    }

    /// Runs the app on the CPU: the reference for tests and the CPU backend. Returns the
    /// response length, or None when there is no CPU version (user apps) or it failed.
    pub fn run_cpu(&self, req: &[u8], resp: &mut [u8]) -> Option<usize> {
        match self.kind {
            AppKind::Echo => {
                let out = resp.get_mut(..req.len())?;
                for _ in 0..self.work {
                    out.copy_from_slice(req);
                }
                Some(req.len())
            }
            AppKind::Vecadd => {
                let n = req.len() / 8;
                if !req.len().is_multiple_of(8) || resp.len() < n * 4 {
                    return None;
                }
                let f = |b: &[u8], i: usize| {
                    f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().expect("4"))
                };
                for i in 0..n {
                    let c = f(req, i) + f(req, n + i);
                    resp[i * 4..i * 4 + 4].copy_from_slice(&c.to_le_bytes());
                }
                Some(n * 4)
            }
            AppKind::Lenet { .. } => {
                let img: &[u8; lenet::IMAGE_BYTES] = req.try_into().ok()?;
                let w = self.weights.as_ref()?;
                let l = lenet::forward(w, img);
                resp.get_mut(..lenet::LOGITS_BYTES)?
                    .copy_from_slice(&lenet::logits_bytes(&l));
                Some(lenet::LOGITS_BYTES)
            }
            AppKind::User { .. } => None,
        }
    }

    /// The CPU weights of `lenet`.
    pub fn lenet_weights(&self) -> Option<&[f32]> {
        self.weights.as_deref().map(|v| &v[..])
    }

    /// The device program body (after gdr_mq's device header): the app and our kernels, for
    /// workers on header-format queues without stage timing.
    pub fn device_source(&self) -> String {
        self.device_source_for(false, false, 1, 16)
    }

    /// As [`device_source`](Self::device_source), for workers whose queues are in mq's word
    /// format (`rx_words`) and that time their stages (`profile`): the worker kernel carries
    /// the code of one RX format, and the stage clocks only when asked (kernels.cu). With
    /// `cluster` above 1 (an app with [`has_cluster_form`](Self::has_cluster_form); 2, 4 or
    /// 8), each queue's worker is a thread-block cluster of that many blocks. Blocks are of
    /// `warps` warps (1 to 16), which the kernels are compiled for: their launch bound is that
    /// block size, so a smaller block's threads may use the registers a 512-thread block
    /// would not leave them (warp 0's receive and send loop spills at 512).
    pub fn device_source_for(
        &self,
        rx_words: bool,
        profile: bool,
        cluster: u32,
        warps: u32,
    ) -> String {
        let mut s = format!("#define GDR_SERVE_WORK {}u\n", self.work);
        // Before serve.cuh, which defaults it to 1, and lenet.cuh, which has the cluster form.
        let clustered = cluster > 1 && self.has_cluster_form();
        if clustered {
            s += &format!("#define GDR_SERVE_CLUSTER {cluster}\n");
        }
        s += SERVE_CUH;
        s += "\n";
        match &self.kind {
            AppKind::Echo => s += "#define GDR_SERVE_APP gdr_app_echo\n",
            AppKind::Vecadd => s += "#define GDR_SERVE_APP gdr_app_vecadd\n",
            AppKind::Lenet { seed } => {
                let layers: Vec<String> = lenet::LAYERS
                    .iter()
                    .map(|&(start, count, fan_in)| {
                        format!(
                            "{{{start}u, {count}u, 0x{:08x}u}}",
                            lenet::layer_scale2(fan_in).to_bits()
                        )
                    })
                    .collect();
                s += &format!(
                    "#define GDR_LENET_SEED {seed}u\n#define GDR_LENET_LAYERS {{{}}}\n{LENET_CUH}\n\
                     #define GDR_SERVE_APP gdr_app_lenet\n#define GDR_SERVE_APP_INIT gdr_lenet_init\n\
                     #define GDR_SERVE_APP_LOAD gdr_lenet_load\n",
                    layers.join(", ")
                );
            }
            AppKind::User { source } => {
                s += &format!(
                    "#line 1 \"{}\"\n{source}\n#define GDR_SERVE_APP gdr_serve_app\n",
                    self.name.replace(['"', '\\', '\n'], "_")
                );
            }
        }
        s += &format!(
            "#define GDR_SERVE_RX_WORDS {}\n#define GDR_SERVE_PROFILE {}\n\
             #define GDR_SERVE_MAX_THREADS {}\n",
            u8::from(rx_words),
            u8::from(profile),
            32 * warps.clamp(1, 16)
        );
        if clustered {
            s += "#define GDR_SERVE_APP_CLUSTER gdr_app_lenet_cluster\n\
                  #define GDR_SERVE_APP_CLUSTER_ANSWERS 1\n\
                  #define GDR_SERVE_CL_RESIDENT gdr_lenet_cl_resident\n";
        }
        if self.light() {
            // kernels.cu: inlined in a one-warp block, and a lone response of up to 1 KiB
            // (echo's default --max-payload) kept in shared memory.
            s += "#define GDR_SERVE_SOLO_INLINE 1\n#define GDR_SERVE_LONE_RESP_BYTES 1024\n";
        }
        s += "#line 1 \"gdr-serve/kernels.cu\"\n";
        s += KERNELS_CU;
        s
    }

    /// The mq handler whose program carries our kernels: an application kernel (mq's
    /// [`Handler::with_kernel`](gdr_mq::Handler::with_kernel) hook), so mq launches our
    /// block-wide worker and its program has no per-lane handler. For header-format queues
    /// without stage timing ([`worker_handler`](Self::worker_handler)); the host-centric
    /// baseline launches its `gdr_serve_oneshot`.
    pub fn handler(&self) -> gdr_mq::Handler {
        self.worker_handler(false, false, 1, 16)
    }

    /// The handler for workers on queues in the given RX format, timing their stages or not,
    /// in clusters of `cluster` blocks of `warps` warps
    /// ([`device_source_for`](Self::device_source_for)).
    pub fn worker_handler(
        &self,
        rx_words: bool,
        profile: bool,
        cluster: u32,
        warps: u32,
    ) -> gdr_mq::Handler {
        let cluster_tag = if cluster > 1 && self.has_cluster_form() {
            format!("_cluster{cluster}")
        } else {
            String::new()
        };
        gdr_mq::Handler::new(
            &format!(
                "serve_{}{}{}{cluster_tag}_w{warps}",
                self.name,
                if rx_words { "_words" } else { "" },
                if profile { "_profile" } else { "" }
            ),
            &self.device_source_for(rx_words, profile, cluster, warps),
        )
        .with_kernel(WORKER_KERNEL)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_checks_per_app() {
        let echo = App::builtin("echo", 1, 1024).unwrap();
        assert_eq!(echo.check(0), Ok(()));
        assert_eq!(echo.check(1024), Ok(()));
        assert_eq!(echo.check(1025), Err(Status::Oversized));
        let l = App::builtin("lenet", 1, 1024).unwrap();
        assert_eq!(l.check(784), Ok(()));
        assert_eq!(l.check(783), Err(Status::Truncated));
        assert_eq!(l.check(785), Err(Status::Oversized));
        assert_eq!(l.max_response(), 40);
        assert_eq!(l.slot_payload(), 784);
        let v = App::builtin("vecadd", 1, 1024).unwrap();
        assert_eq!(v.check(16), Ok(()));
        assert_eq!(v.check(12), Err(Status::Truncated));
        assert_eq!(v.check(0), Err(Status::Truncated));
        assert_eq!(v.check(1032), Err(Status::Oversized));
        assert!(App::builtin("resnet", 1, 1024).is_err());
        assert!(App::builtin("echo", 0, 1024).is_err());
        assert!(App::user("u", "nothing here".into(), 100, 1, 64).is_err());
    }

    #[test]
    fn cpu_versions_compute_their_answers() {
        use rand::Rng;
        let mut rng = rand::thread_rng();
        let echo = App::builtin("echo", 3, 1024).unwrap();
        let req: Vec<u8> = (0..333).map(|_| rng.gen()).collect();
        let mut resp = vec![0xeeu8; 1024];
        assert_eq!(echo.run_cpu(&req, &mut resp), Some(333));
        assert_eq!(&resp[..333], &req[..]);
        let v = App::builtin("vecadd", 1, 1024).unwrap();
        let a: Vec<f32> = (0..20).map(|_| rng.gen_range(-1e3..1e3)).collect();
        let b: Vec<f32> = (0..20).map(|_| rng.gen_range(-1e3..1e3)).collect();
        let req: Vec<u8> = a.iter().chain(&b).flat_map(|x| x.to_le_bytes()).collect();
        let mut resp = vec![0u8; 512];
        assert_eq!(v.run_cpu(&req, &mut resp), Some(80));
        for i in 0..20 {
            let c = f32::from_le_bytes(resp[i * 4..i * 4 + 4].try_into().unwrap());
            assert_eq!(c, a[i] + b[i]);
        }
        let l = App::builtin("lenet", 1, 1024).unwrap();
        let img = lenet::image(5, 9);
        let mut resp = vec![0u8; 64];
        assert_eq!(l.run_cpu(&img, &mut resp), Some(40));
        let want = lenet::forward(&lenet::weights(DEFAULT_SEED), &img);
        assert_eq!(lenet::parse_logits(&resp[..40]).unwrap(), want);
        assert_eq!(l.run_cpu(&img[..700], &mut resp), None);
    }

    #[test]
    fn device_source_names_the_app_and_work() {
        let l = App::builtin("lenet", 7, 1024).unwrap();
        let s = l.device_source();
        assert!(s.contains("#define GDR_SERVE_WORK 7u"));
        assert!(s.contains("#define GDR_SERVE_APP gdr_app_lenet"));
        assert!(s.contains(&format!("0x{:08x}u", lenet::layer_scale2(150).to_bits())));
        assert!(s.contains("#define GDR_SERVE_APP_LOAD gdr_lenet_load"));
        assert!(s.contains(&format!(
            "void __launch_bounds__(GDR_SERVE_MAX_THREADS) GDR_SERVE_CLUSTER_DIMS\n    {WORKER_KERNEL}("
        )));
        assert!(!s.contains("#define gdr_mq_worker"));
        assert_eq!(l.handler().kernel(), WORKER_KERNEL);
        let e = App::builtin("echo", 1, 64).unwrap().device_source();
        assert!(!e.contains("#define GDR_SERVE_APP_LOAD"));
    }

    #[test]
    fn worker_builds_name_their_rx_format_and_profiling_before_the_kernels() {
        let l = App::builtin("lenet", 1, 1024).unwrap();
        let kernels = "#line 1 \"gdr-serve/kernels.cu\"";
        for (rx_words, profile) in [(false, false), (true, false), (false, true), (true, true)] {
            let s = l.device_source_for(rx_words, profile, 1, 16);
            let words = format!("#define GDR_SERVE_RX_WORDS {}\n", u8::from(rx_words));
            let prof = format!("#define GDR_SERVE_PROFILE {}\n", u8::from(profile));
            let at = |what: &str| s.find(what).unwrap_or_else(|| panic!("no {what:?}"));
            assert!(at(&words) < at(kernels) && at(&prof) < at(kernels));
            let h = l.worker_handler(rx_words, profile, 1, 16);
            assert_eq!(h.kernel(), WORKER_KERNEL);
            assert!(h.program().contains(&s));
        }
        assert_eq!(l.device_source(), l.device_source_for(false, false, 1, 16));
    }

    /// Light apps get one-warp word-format workers that run them inlined, with room for a
    /// 1 KiB lone response; heavy apps a 16-warp block that calls them, with the defaults.
    #[test]
    fn light_apps_run_inlined_in_one_warp_blocks() {
        let inline = "#define GDR_SERVE_SOLO_INLINE 1\n";
        for (name, light) in [("echo", true), ("vecadd", true), ("lenet", false)] {
            let a = App::builtin(name, 1, 1024).unwrap();
            assert_eq!(a.light(), light, "{name}");
            assert_eq!(a.default_warps(), if light { 1 } else { 16 }, "{name}");
            assert_eq!(a.default_rx_words(), light, "{name}");
            let s = a.device_source_for(light, false, 1, a.default_warps());
            let kernels = s.find("#line 1 \"gdr-serve/kernels.cu\"").unwrap();
            match s.find(inline) {
                Some(at) => assert!(light && at < kernels, "{name}"),
                None => assert!(!light, "{name}"),
            }
        }
        let src = "__device__ unsigned int gdr_serve_app(const gdr_serve_group &g, \
                   const unsigned char *req, unsigned int len, unsigned char *resp, \
                   unsigned int cap) { return 0; }";
        let user = App::user("u.cu", src.into(), ID_USER, 1, 64).unwrap();
        assert!(!user.light() && !user.device_source().contains(inline));
    }

    /// Workers default to the block size of their shape, and each build's kernels are bound
    /// to its block size (before kernels.cu, which otherwise assumes 512 threads).
    #[test]
    fn worker_builds_are_bound_to_their_block_size() {
        let l = App::builtin("lenet", 1, 1024).unwrap();
        let e = App::builtin("echo", 1, 64).unwrap();
        let src = "__device__ unsigned int gdr_serve_app(const gdr_serve_group &g, \
                   const unsigned char *req, unsigned int len, unsigned char *resp, \
                   unsigned int cap) { return 0; }";
        let u = App::user("u.cu", src.into(), ID_USER, 1, 64).unwrap();
        for c in [2, 4, 8] {
            assert_eq!(l.default_warps_for(c), CLUSTER_WARPS);
            assert_eq!(e.default_warps_for(c), 1);
            assert_eq!(u.default_warps_for(c), 16, "no cluster form");
        }
        assert_eq!(l.default_warps_for(1), 16);
        assert_eq!(e.default_warps(), 1);
        let kernels = "#line 1 \"gdr-serve/kernels.cu\"";
        for (warps, threads) in [(1, 32), (2, 64), (8, 256), (16, 512)] {
            let s = l.device_source_for(false, false, 8, warps);
            let bound = format!("#define GDR_SERVE_MAX_THREADS {threads}\n");
            let at = s.find(&bound).unwrap_or_else(|| panic!("no {bound:?}"));
            let k = s.find(kernels).unwrap();
            assert!(at < k);
            assert_eq!(s[..k].matches("#define GDR_SERVE_MAX_THREADS").count(), 1);
        }
        assert_ne!(
            l.worker_handler(false, false, 8, 8).program(),
            l.worker_handler(false, false, 8, 16).program()
        );
    }

    /// Only LeNet's cluster builds have its cluster form write a lone request's answer itself
    /// (kernels.cu's GDR_SERVE_APP_CLUSTER_ANSWERS), and the define comes before kernels.cu;
    /// the one-block worker and other apps answer through `resp` and the mq warp.
    #[test]
    fn only_cluster_lenet_writes_its_own_answers() {
        let answers = "#define GDR_SERVE_APP_CLUSTER_ANSWERS 1\n";
        let kernels = "#line 1 \"gdr-serve/kernels.cu\"";
        let l = App::builtin("lenet", 1, 1024).unwrap();
        for cluster in [2, 4, 8] {
            for rx_words in [false, true] {
                let s = l.device_source_for(rx_words, false, cluster, CLUSTER_WARPS);
                let at = s
                    .find(answers)
                    .unwrap_or_else(|| panic!("cluster {cluster}"));
                assert!(at < s.find(kernels).unwrap());
            }
        }
        assert!(!l.device_source_for(false, false, 1, 16).contains(answers));
        let e = App::builtin("echo", 1, 64).unwrap();
        assert!(!e.device_source_for(true, false, 8, 1).contains(answers));
    }

    /// The device's resident layout (lenet.cuh's defines) is the one the host sizes the
    /// dynamic shared memory for.
    #[test]
    fn lenet_resident_size_matches_the_device_layout() {
        let define = |name: &str| -> usize {
            let line = LENET_CUH
                .lines()
                .find(|l| l.starts_with(&format!("#define {name} ")))
                .unwrap_or_else(|| panic!("{name} not defined"));
            line.split_whitespace().nth(2).unwrap().parse().unwrap()
        };
        assert_eq!(define("GDR_LENET_F1W"), lenet::offsets::F1W);
        assert_eq!(define("GDR_LENET_TOTAL"), lenet::offsets::TOTAL);
        let r = define("GDR_LENET_RESIDENT_FLOATS");
        assert_eq!(r, lenet::RESIDENT_FLOATS);
        assert!(r.is_multiple_of(4));
        let l = App::builtin("lenet", 1, 1024).unwrap();
        assert_eq!(l.resident_bytes() as usize, r * 4);
        assert_eq!(App::builtin("echo", 1, 64).unwrap().resident_bytes(), 0);
    }
}
