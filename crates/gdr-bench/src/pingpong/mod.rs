//! CPU <-> GPU ping-pong with a persistent GPU thread (gdrcopy's `pplat`), and the
//! host-centric round trip (copy in, launch, copy out, synchronize) it is compared with.
//!
//! Memory ordering, per round `i`:
//! - CPU: a volatile 4-byte store of `i` into the flag, then `sfence` (drains the
//!   write-combining buffer when the flag is in BAR-mapped GPU memory).
//! - GPU: volatile loads of the flag (they bypass L1), then a volatile store of `i` into the
//!   answer; with [`GpuLoop::fence`], `__threadfence_system()` after it (the store is one
//!   aligned word that leaves the SM by itself; the fence makes the thread wait for it to land
//!   before it polls again).
//! - CPU: volatile loads of the answer until it reads `i`.
//!
//! Every wait on the persistent thread is bounded: the GPU thread has a watchdog, the CPU a
//! deadline after which it stops the thread (flag = u32::MAX) and reports a timeout. The
//! host-centric loop synchronizes plainly: its kernel is one store and cannot spin.

use crate::stats::Summary;
use gdr::bar::{BarError, MappedBuffer, VulkanBackend};
use gdr::cuda::{
    Context, CudaError, DeviceBuffer, DeviceMemory, Graph, HostBuffer, KernelArgs, LaunchConfig,
    Module, Stream,
};
use std::time::{Duration, Instant};

/// The CUDA C of the ping-pong and host-centric kernels.
pub const SOURCE: &str = include_str!("pingpong.cu");
const STOP: u32 = u32::MAX;

/// What can go wrong in [`ping_pong`] and [`host_centric`]. Rounds are numbered from 1,
/// warm-up rounds included.
#[derive(Debug, thiserror::Error)]
pub enum PingPongError {
    /// Allocating or mapping a word in GPU memory through BAR1 failed.
    #[error(transparent)]
    Bar(#[from] BarError),
    /// A CUDA driver or NVRTC call failed (compiling, allocating, launching, copying).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The CPU saw no answer within the timeout; it then asked the GPU thread to stop.
    #[error("no answer from the GPU thread in round {round} within {timeout:?} ({placement})")]
    Timeout {
        /// The round that got no answer.
        round: u32,
        /// The bound the CPU waited per round.
        timeout: Duration,
        /// Where the two words were.
        placement: PingPongPlacement,
    },
    /// The GPU thread saw no flag for the round within the timeout and gave up (it wrote
    /// `u32::MAX` into the answer).
    #[error("the GPU thread's watchdog fired in round {round} ({placement})")]
    Watchdog {
        /// The round the CPU was waiting for.
        round: u32,
        /// Where the two words were.
        placement: PingPongPlacement,
    },
    /// Warm-up plus measured rounds reach `u32::MAX`, the value that tells the GPU thread to
    /// stop. Nothing was run.
    #[error("{warmup} warm-up + {rounds} rounds is too many (at most {} in all)", STOP - 1)]
    TooManyRounds {
        /// Warm-up rounds asked for.
        warmup: u32,
        /// Measured rounds asked for.
        rounds: u32,
    },
    /// The host-centric kernel answered round `round` with something other than `round + 1`.
    #[error("wrong answer in round {round}: got {got}")]
    WrongAnswer {
        /// The round answered wrongly.
        round: u32,
        /// The word the kernel wrote back.
        got: u32,
    },
}

/// Where the flag (CPU -> GPU) and the answer (GPU -> CPU) words live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum PingPongPlacement {
    /// Flag in GPU memory written through the BAR mapping; answer in mapped host memory.
    GpuFlagHostAnswer,
    /// Both in mapped host memory: the GPU polls over PCIe.
    HostFlagHostAnswer,
    /// Flag in GPU memory (BAR write); answer in GPU memory read by the CPU over BAR1.
    GpuFlagGpuAnswer,
    /// Flag in mapped host memory; answer in GPU memory read over BAR1.
    HostFlagGpuAnswer,
}

impl PingPongPlacement {
    /// The four placements, in the order `gdr pplat` runs them: the queues' Lynx placement
    /// (flag in GPU memory, answer in host memory) first.
    pub const ALL: [PingPongPlacement; 4] = [
        PingPongPlacement::GpuFlagHostAnswer,
        PingPongPlacement::HostFlagHostAnswer,
        PingPongPlacement::GpuFlagGpuAnswer,
        PingPongPlacement::HostFlagGpuAnswer,
    ];
}

impl std::fmt::Display for PingPongPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PingPongPlacement::GpuFlagHostAnswer => {
                "flag in GPU mem (BAR write), answer in host mem"
            }
            PingPongPlacement::HostFlagHostAnswer => "flag in host mem, answer in host mem",
            PingPongPlacement::GpuFlagGpuAnswer => {
                "flag in GPU mem (BAR write), answer in GPU mem (BAR read)"
            }
            PingPongPlacement::HostFlagGpuAnswer => {
                "flag in host mem, answer in GPU mem (BAR read)"
            }
        })
    }
}

/// The most polling warps [`GpuLoop::pollers`] takes: one block of 1024 threads.
pub const MAX_POLLERS: u32 = 32;
/// The most loads of the flag one poll issues ([`GpuLoop::loads`]).
pub const MAX_LOADS: u32 = 8;

/// How the persistent GPU thread polls and answers (the knobs of `pingpong.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct GpuLoop {
    /// Polls of the flag between two reads of the GPU's timer for the watchdog (1: every poll).
    pub timer_every: u32,
    /// `__threadfence_system()` after each answer.
    pub fence: bool,
    /// Warps polling the flag (lane 0 of each, 1 to 32; values outside are clamped): the first
    /// to see a round's flag claims it with a compare-and-swap in shared memory and answers.
    pub pollers: u32,
    /// Loads of the flag one poll issues back to back, so that they are in flight together
    /// (1 to [`MAX_LOADS`], values outside clamped; one poller only, several pollers load
    /// once a poll).
    pub loads: u32,
    /// The pollers are separate blocks (thread 0 of each) instead of warps of one block, each
    /// with its own copy of the flag and of the answer, a 128-byte line each: the CPU writes
    /// every flag copy (then one store fence) and takes the first answer copy with its round.
    /// Meaningless with one poller.
    pub blocks: bool,
}

impl GpuLoop {
    /// The loop `gdr pplat` reports: the watchdog's timer read on every poll and a fence after
    /// every answer. Timed beside [`GpuLoop::LEAN`], it ties where the flag is in GPU memory
    /// and is faster where the GPU polls host memory:
    /// there, without the fence, the next poll's PCIe read leaves at once, before the CPU can
    /// have written the next flag, and the new value waits for the read after it.
    pub const TIMER_EACH_POLL_FENCED: GpuLoop = GpuLoop {
        timer_every: 1,
        fence: true,
        pollers: 1,
        loads: 1,
        blocks: false,
    };
    /// The timer read every 1024 polls and no fence: a shorter poll loop, timed as a variant.
    pub const LEAN: GpuLoop = GpuLoop {
        timer_every: 1024,
        fence: false,
        pollers: 1,
        loads: 1,
        blocks: false,
    };
}

impl std::fmt::Display for GpuLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.timer_every {
            1 => write!(f, "timer every poll")?,
            n => write!(f, "timer every {n} polls")?,
        }
        f.write_str(if self.fence { ", fence" } else { ", no fence" })?;
        match self.pollers.clamp(1, MAX_POLLERS) {
            1 => {}
            n if self.blocks => write!(f, ", {n} pollers in separate blocks")?,
            n => write!(f, ", {n} pollers")?,
        }
        match self.loads.clamp(1, MAX_LOADS) {
            1 => Ok(()),
            n => write!(f, ", {n} loads a poll"),
        }
    }
}

/// Words between two copies of a word ([`GpuLoop::blocks`]): one 128-byte line each.
const STRIDE_WORDS: usize = 32;

/// One word shared between the CPU and a GPU thread, or `copies` of it, a 128-byte line each
/// (one for each block of [`GpuLoop::blocks`]).
enum Word {
    Gpu(MappedBuffer, usize),
    Host(HostBuffer, usize),
}

impl Word {
    fn new(be: &VulkanBackend, on_gpu: bool, copies: usize) -> Result<Word, PingPongError> {
        let copies = copies.max(1);
        let bytes = copies * STRIDE_WORDS * 4;
        let w = if on_gpu {
            let b = be.alloc(bytes, 128)?;
            b.write(0, &vec![0u8; bytes])?;
            Word::Gpu(b, copies)
        } else {
            // Zeroed by HostBuffer::new.
            Word::Host(HostBuffer::new(be.context(), bytes)?, copies)
        };
        Ok(w)
    }

    fn copies(&self) -> usize {
        match self {
            Word::Gpu(_, n) | Word::Host(_, n) => *n,
        }
    }

    fn ptr(&self) -> *mut u32 {
        match self {
            Word::Gpu(b, _) => b.host_ptr().cast(),
            Word::Host(h, _) => h.host_ptr().cast(),
        }
    }

    fn device_ptr(&self) -> u64 {
        match self {
            Word::Gpu(b, _) => b.device_ptr(),
            Word::Host(h, _) => h.device_ptr(),
        }
    }

    /// `v` into every copy, first to last, then a store fence.
    #[inline]
    fn store(&self, v: u32) {
        for k in 0..self.copies() {
            // SAFETY: copy k's word is inside the buffer (copies lines of STRIDE_WORDS),
            // which self owns and shares only with the GPU threads, which read it with
            // volatile loads.
            unsafe { std::ptr::write_volatile(self.ptr().add(k * STRIDE_WORDS), v) };
        }
        gdr::copy::store_fence();
    }

    /// Copy `k` of the word.
    #[inline]
    fn load(&self, k: usize) -> u32 {
        debug_assert!(k < self.copies());
        // SAFETY: as in store; the GPU writes each copy with a single aligned 4-byte store.
        unsafe { std::ptr::read_volatile(self.ptr().add(k * STRIDE_WORDS)) }
    }
}

/// Waits for `stream` to finish, at most `timeout`.
fn wait_stream(stream: &Stream, timeout: Duration) -> Result<bool, CudaError> {
    let end = Instant::now() + timeout;
    loop {
        if stream.query()? {
            return Ok(true);
        }
        if Instant::now() > end {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Runs `rounds` ping-pong rounds (after `warmup` unmeasured ones) and returns the round-trip
/// times in microseconds.
pub fn ping_pong(
    be: &VulkanBackend,
    placement: PingPongPlacement,
    gpu_loop: GpuLoop,
    warmup: u32,
    rounds: u32,
    timeout: Duration,
) -> Result<Summary, PingPongError> {
    let ctx = be.context();
    ctx.bind()?;
    let module = Module::from_source(ctx, "pingpong.cu", SOURCE)?;
    let pollers = gpu_loop.pollers.clamp(1, MAX_POLLERS);
    // Pollers in blocks of their own, each with its own flag and answer.
    let blocks = pollers > 1 && gpu_loop.blocks;
    let kernel = module.function(if pollers == 1 {
        "gdr_pingpong"
    } else if blocks {
        "gdr_pingpong_blocks"
    } else {
        "gdr_pingpong_pollers"
    })?;
    let (flag_gpu, answer_gpu) = match placement {
        PingPongPlacement::GpuFlagHostAnswer => (true, false),
        PingPongPlacement::HostFlagHostAnswer => (false, false),
        PingPongPlacement::GpuFlagGpuAnswer => (true, true),
        PingPongPlacement::HostFlagGpuAnswer => (false, true),
    };
    let copies = if blocks { pollers as usize } else { 1 };
    let flag = Word::new(be, flag_gpu, copies)?;
    let answer = Word::new(be, answer_gpu, copies)?;
    let stream = Stream::new(ctx)?;
    let total = warmup
        .checked_add(rounds)
        .filter(|&t| t < STOP)
        .ok_or(PingPongError::TooManyRounds { warmup, rounds })?;
    let (fp, ap, n, to): (u64, u64, u32, u64) = (
        flag.device_ptr(),
        answer.device_ptr(),
        total,
        u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
    );
    let (every, fence, loads, stride): (u32, u32, u32, u32) = (
        gpu_loop.timer_every.max(1),
        u32::from(gpu_loop.fence),
        gpu_loop.loads.clamp(1, MAX_LOADS),
        STRIDE_WORDS as u32,
    );
    let args = KernelArgs::new()
        .arg(&fp)
        .arg(&ap)
        .arg(&n)
        .arg(&to)
        .arg(&every)
        .arg(&fence)
        .arg(&loads)
        .arg(&stride);
    let launch = if blocks {
        LaunchConfig::linear(pollers, 32)
    } else {
        LaunchConfig::linear(1, 32 * pollers)
    };
    // SAFETY: parameters match the signature of gdr_pingpong, gdr_pingpong_pollers and
    // gdr_pingpong_blocks (the same); the blocks' words are `pollers` copies STRIDE_WORDS
    // apart, as the kernel reads them. Flag and answer outlive the kernel: we wait for the
    // stream below, and leak them if it never finishes.
    unsafe { kernel.launch(&stream, launch, &args)? };

    let mut samples = Vec::with_capacity(rounds as usize);
    let mut failure = None;
    'rounds: for i in 1..=total {
        let t0 = Instant::now();
        flag.store(i);
        let mut spins = 0u32;
        'wait: loop {
            for k in 0..copies {
                let a = answer.load(k);
                if a == i {
                    break 'wait;
                }
                if a != STOP {
                    continue;
                }
                failure = Some(PingPongError::Watchdog {
                    round: i,
                    placement,
                });
                break 'rounds;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && t0.elapsed() > timeout {
                failure = Some(PingPongError::Timeout {
                    round: i,
                    timeout,
                    placement,
                });
                break 'rounds;
            }
        }
        if i > warmup {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    if failure.is_some() {
        flag.store(STOP);
    }
    // The kernel has finished its last round or been told to stop; its watchdog bounds the rest.
    // (A CUDA error here means the kernel is no longer running, so freeing is safe.)
    let done = wait_stream(&stream, timeout + Duration::from_secs(1))?;
    if !done {
        // The kernel may still run and touch the words: leak them, the module and the stream
        // rather than free memory under it (a block's range could be handed out again).
        std::mem::forget((module, flag, answer, stream));
        return Err(failure.unwrap_or(PingPongError::Timeout {
            round: total,
            timeout,
            placement,
        }));
    }
    if let Some(f) = failure {
        return Err(f);
    }
    Ok(Summary::of(&mut samples))
}

/// The bus's floor under a round trip: `rounds` 4-byte CPU reads of GPU memory through the
/// BAR mapping (after `warmup` untimed ones), each timed alone, in microseconds. A read is one
/// non-posted PCIe request and its completion, the shortest exchange with the GPU there is; a
/// ping-pong round adds the GPU thread noticing the flag and the CPU noticing the answer.
pub fn bar_read_round_trip(
    be: &VulkanBackend,
    warmup: u32,
    rounds: u32,
) -> Result<Summary, PingPongError> {
    let word = Word::new(be, true, 1)?;
    let mut samples = Vec::with_capacity(rounds as usize);
    let mut sink = 0u32;
    for i in 0..warmup.saturating_add(rounds) {
        let t0 = Instant::now();
        sink = sink.wrapping_add(word.load(0));
        if i >= warmup {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    std::hint::black_box(sink);
    Ok(Summary::of(&mut samples))
}

/// The host-centric round trip: copy a request in, launch a kernel that answers it, copy the
/// answer out, synchronize. With `graph`, the three steps are one CUDA graph launch.
pub fn host_centric(
    ctx: &Context,
    warmup: u32,
    rounds: u32,
    graph: bool,
) -> Result<Summary, PingPongError> {
    ctx.bind()?;
    let module = Module::from_source(ctx, "pingpong.cu", SOURCE)?;
    let kernel = module.function("gdr_answer_once")?;
    let stream = Stream::new(ctx)?;
    let mut req = HostBuffer::new(ctx, 4)?;
    let resp = HostBuffer::new(ctx, 4)?;
    let dreq = DeviceBuffer::new(ctx, 4)?;
    let dresp = DeviceBuffer::new(ctx, 4)?;
    let (rp, sp): (u64, u64) = (dreq.device_ptr(), dresp.device_ptr());
    let args = KernelArgs::new().arg(&rp).arg(&sp);
    let req_ptr = req.host_ptr();
    let resp_ptr = resp.host_ptr();
    let enqueue = |st: &Stream| -> Result<(), CudaError> {
        // SAFETY: req/resp are page-locked and outlive every use of this closure (the stream
        // is synchronised each round); kernel parameters match gdr_answer_once.
        unsafe {
            st.memcpy_htod_async(&dreq, 0, std::slice::from_raw_parts(req_ptr, 4))?;
            kernel.launch(st, LaunchConfig::linear(1, 32), &args)?;
            st.memcpy_dtoh_async(std::slice::from_raw_parts_mut(resp_ptr, 4), &dresp, 0)
        }
    };
    let g = if graph {
        Some(Graph::capture(&stream, enqueue)?)
    } else {
        None
    };
    let mut samples = Vec::with_capacity(rounds as usize);
    let total = warmup
        .checked_add(rounds)
        .filter(|&t| t < STOP)
        .ok_or(PingPongError::TooManyRounds { warmup, rounds })?;
    for i in 1..=total {
        let t0 = Instant::now();
        req.as_mut_slice().copy_from_slice(&i.to_le_bytes());
        match &g {
            Some(g) => g.launch(&stream)?,
            None => enqueue(&stream)?,
        }
        stream.synchronize()?;
        let got = u32::from_le_bytes(resp.as_slice().try_into().expect("4 bytes"));
        if i > warmup {
            samples.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        if got != i + 1 {
            return Err(PingPongError::WrongAnswer { round: i, got });
        }
    }
    Ok(Summary::of(&mut samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_loops_name_says_each_knob_as_clamped() {
        assert_eq!(
            GpuLoop::TIMER_EACH_POLL_FENCED.to_string(),
            "timer every poll, fence"
        );
        assert_eq!(
            GpuLoop::LEAN.to_string(),
            "timer every 1024 polls, no fence"
        );
        let l = GpuLoop {
            pollers: 100,
            loads: 100,
            ..GpuLoop::LEAN
        };
        assert_eq!(
            l.to_string(),
            "timer every 1024 polls, no fence, 32 pollers, 8 loads a poll"
        );
        let l = GpuLoop {
            pollers: 0,
            loads: 4,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        };
        assert_eq!(l.to_string(), "timer every poll, fence, 4 loads a poll");
        let l = GpuLoop {
            pollers: 4,
            blocks: true,
            ..GpuLoop::TIMER_EACH_POLL_FENCED
        };
        assert_eq!(
            l.to_string(),
            "timer every poll, fence, 4 pollers in separate blocks"
        );
        // One poller has one flag: the knob says nothing there.
        let l = GpuLoop {
            blocks: true,
            ..GpuLoop::LEAN
        };
        assert_eq!(l.to_string(), "timer every 1024 polls, no fence");
    }
}
