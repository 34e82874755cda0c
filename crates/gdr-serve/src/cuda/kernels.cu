// gdr-serve kernels. The host has defined GDR_SERVE_APP (the app function) and, if the app
// needs one-time setup, GDR_SERVE_APP_INIT(t, n) before this file; an app with shared
// constants also GDR_SERVE_CONST_FLOATS and GDR_SERVE_APP_LOAD (serve.cuh).
//
// The persistent worker (gdr_serve_worker, launched by gdr::mq through Handler::with_kernel)
// replaces mq's per-lane worker: the handler interface of mq runs one request per lane, but
// a LeNet request wants a whole block. So warp 0 of each block is
// the mq worker (gdr_mq_recv / gdr_mq_send, the public warp-level calls) and the other warps
// are split into groups that run the app on the claimed requests: one request -> all of them
// on it (lowest latency); a batch -> up to GDR_SERVE_MAX_GROUPS requests at a time.

#define GDR_SERVE_MAX_THREADS 512

__device__ unsigned int gdr_serve_init_done;

#ifndef GDR_SERVE_CONST_FLOATS
#define GDR_SERVE_CONST_FLOATS 4
#endif

#ifdef GDR_SERVE_RESIDENT_FLOATS
#define GDR_SERVE_RESIDENT_GLOBAL ((const float *)(GDR_SERVE_RESIDENT_SRC))
#else
#define GDR_SERVE_RESIDENT_GLOBAL ((const float *)0)
#endif

// The worker's dynamic shared memory: the resident data when the launch gave room for it.
extern __shared__ __align__(16) float gdr_serve_dyn[];

// Per-lane handler that mq's own worker kernel calls; that kernel is compiled, never launched.
__device__ unsigned int handle(const unsigned char *, unsigned int, unsigned char *,
                               unsigned int) {
    return 0;
}

// One-time app setup by block 0; every other block waits for it.
__device__ void gdr_serve_block_init() {
#ifdef GDR_SERVE_APP_INIT
    if (blockIdx.x == 0) {
        GDR_SERVE_APP_INIT(threadIdx.x, blockDim.x);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) gdr_st_release_gpu_u32(&gdr_serve_init_done, 1u);
    } else if (threadIdx.x == 0) {
        while (gdr_ld_acquire_gpu_u32(&gdr_serve_init_done) == 0u) __nanosleep(100);
    }
#endif
    __syncthreads();
}

// Fills the block's shared constants (after the one-time setup they are made from).
__device__ void gdr_serve_block_consts(float *consts) {
#ifdef GDR_SERVE_APP_LOAD
    GDR_SERVE_APP_LOAD(consts, threadIdx.x, blockDim.x);
    __syncthreads();
#endif
}

// Where the block's app reads its resident data (serve.cuh): copied once into dynamic shared
// memory when the launch has enough of it (the host asks for it where the GPU allows), else
// the global array.
__device__ const float *gdr_serve_block_resident() {
#ifdef GDR_SERVE_RESIDENT_FLOATS
    unsigned int dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn >= GDR_SERVE_RESIDENT_FLOATS * 4u) {
        const float4 *src = (const float4 *)GDR_SERVE_RESIDENT_GLOBAL;
        for (unsigned int i = threadIdx.x; i < GDR_SERVE_RESIDENT_FLOATS / 4u; i += blockDim.x)
            ((float4 *)gdr_serve_dyn)[i] = __ldcg(src + i);
        __syncthreads();
        return gdr_serve_dyn;
    }
#endif
    return GDR_SERVE_RESIDENT_GLOBAL;
}

// The app as a call of its own, in both kernels: its loops get the registers to themselves
// instead of sharing them with the worker's mq state (saved once per request around the call;
// inlined, the two spilled inside the convolutions).
__device__ __noinline__ unsigned int gdr_serve_run(unsigned int rank, unsigned int size,
                                                   unsigned int bar, float *smem,
                                                   const float *consts, const float *resident,
                                                   const unsigned char *req, unsigned int len,
                                                   unsigned char *resp, unsigned int cap) {
    const gdr_serve_group g = {rank, size, bar, smem, consts, resident};
    return GDR_SERVE_APP(g, req, len, resp, cap);
}

// Host-centric setup: the same one-time init, one block.
extern "C" __global__ void gdr_serve_init() { gdr_serve_block_init(); }

// Host-centric: one request per launch, the whole block on it. The same app code as the
// worker; the shared constants are loaded on every launch (a launch keeps no state), and the
// resident data is read from global memory (copying it in per launch would cost more).
extern "C" __global__ void __launch_bounds__(GDR_SERVE_MAX_THREADS)
    gdr_serve_oneshot(const unsigned char *req, gdr_u32 req_len, unsigned char *resp,
                      gdr_u32 resp_cap, gdr_u32 *resp_len) {
    __shared__ __align__(16) float smem[GDR_SERVE_GROUP_FLOATS];
    __shared__ __align__(16) float consts[GDR_SERVE_CONST_FLOATS];
    gdr_serve_block_consts(consts);
    const unsigned int r =
        gdr_serve_run(threadIdx.x, blockDim.x, 1u, smem, consts, GDR_SERVE_RESIDENT_GLOBAL, req,
                      req_len, resp, resp_cap);
    if (threadIdx.x == 0) *resp_len = r;
}

#define GDR_SERVE_LONE_RESP_BYTES 256
// A lone request up to this size is read by the whole mq warp into shared memory
// (gdr_mq_worker::lone_req), where the app reads it instead of from the RX slot in L2.
#define GDR_SERVE_LONE_REQ_BYTES 1024

// What warp 0 tells the block about each batch.
struct gdr_serve_shared {
    const unsigned char *reqs[GDR_MQ_WARP_BATCH];
    unsigned char *resps[GDR_MQ_WARP_BATCH];
    unsigned int lens[GDR_MQ_WARP_BATCH];
    unsigned int outs[GDR_MQ_WARP_BATCH];
    unsigned int n, reason, cap;
    // A lone request's response (when cap fits): gdr_mq_send's warp reads it back from
    // shared memory (~30 cycles) instead of from scratch the app's warps wrote (the L1 does
    // not keep global stores, so that read was an L2 round trip on the reply path).
    uint4 lone_resp[GDR_SERVE_LONE_RESP_BYTES / 16];
    uint4 lone_req[GDR_SERVE_LONE_REQ_BYTES / 16];
};

// Warps of the block that run the app: all but warp 0 (the mq loop), unless the block is one
// warp. Warp 0 stays out because calling the app from its loop made it save its mq state
// (over a kilobyte a thread) to local memory around every request, and with the resident
// data in shared memory little L1 is left to hold that.
__device__ __forceinline__ unsigned int gdr_serve_first_app_warp() {
    return blockDim.x > 32u ? 1u : 0u;
}

// The block's share of one batch of n: its app warps split into groups, each group runs the
// app on every groups-th claimed request. Called by every app warp of the block.
__device__ __forceinline__ void gdr_serve_block_batch(unsigned int n, float *smem,
                                                      const float *consts, const float *resident,
                                                      gdr_serve_shared *sh) {
    const unsigned int first = gdr_serve_first_app_warp();
    const unsigned int wpb = blockDim.x / 32u - first, wib = threadIdx.x / 32u - first;
    unsigned int groups = 1;
    while (groups * 2u <= n && groups * 2u <= GDR_SERVE_MAX_GROUPS && groups * 2u <= wpb)
        groups *= 2u;
    const unsigned int wpg = wpb / groups, gid = wib / wpg;
    if (gid < groups) {
        const unsigned int rank = threadIdx.x - (first + gid * wpg) * 32u;
        float *gsmem = smem + gid * GDR_SERVE_GROUP_FLOATS;
        for (unsigned int k = gid; k < n; k += groups) {
            const unsigned int r = gdr_serve_run(rank, wpg * 32u, 1u + gid, gsmem, consts,
                                                 resident, sh->reqs[k], sh->lens[k],
                                                 sh->resps[k], sh->cap);
            if (rank == 0) sh->outs[k] = r;
            gdr_serve_sync_bar(1u + gid, wpg * 32u);
        }
    }
}

// Warp 0's loop: mq's receive, the app warps' share of the batch (warp 0 takes part only in a
// one-warp block), mq's send. A call of its own, as is the other warps' loop below, so each
// keeps only its own state in registers.
__device__ __noinline__ void gdr_serve_mq_loop(const gdr_mq_queue_desc *desc, gdr_u32 warp,
                                               gdr_u64 idle_ns, float *smem, const float *consts,
                                               const float *resident, gdr_serve_shared *sh) {
    struct gdr_mq_worker w;
    gdr_mq_worker_init(w, *desc, warp);
    w.lone_req = (unsigned char *)sh->lone_req;
    w.lone_cap = GDR_SERVE_LONE_REQ_BYTES;
    gdr_u32 err = 0, arg = 0;
    gdr_mq_batch b;
    for (;;) {
        const gdr_u32 reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
        if (w.lane == 0) {
            sh->reason = reason;
            sh->n = reason ? 0u : b.n;
        }
        const bool lone = b.n == 1u && sh->cap <= GDR_SERVE_LONE_RESP_BYTES;
        unsigned char *resp = lone ? (unsigned char *)sh->lone_resp : w.resp_scratch;
        if (!reason && w.lane < b.n) {
            sh->reqs[w.lane] = b.req;
            sh->lens[w.lane] = b.req_len;
            sh->resps[w.lane] = resp;
        }
        gdr_serve_sync_bar(0u, blockDim.x);
        if (reason) break;
        gdr_mq_prof(w, 1);  // profile stage 1: the hand-over (gpu.rs, worker_stages)
        if (gdr_serve_first_app_warp() == 0u) gdr_serve_block_batch(b.n, smem, consts, resident, sh);
        gdr_serve_sync_bar(0u, blockDim.x);
        gdr_mq_prof(w, 3);  // stage 3: the app; gdr_mq_send ends stage 2, the TX stores
        gdr_mq_send(w, b, resp, w.lane < b.n ? sh->outs[w.lane] : 0u);
    }
    gdr_mq_worker_exit(w, sh->reason, err, arg);
}

// The other warps' loop: no mq state at all; they learn each batch (or the exit reason) from
// warp 0 through shared memory. Their mq worker state is made only where they leave
// (gdr_mq_worker_init has no effect outside warp 0 of the queue, which is in warp 0 of a block).
__device__ __noinline__ void gdr_serve_app_loop(const gdr_mq_queue_desc *desc, gdr_u32 warp,
                                                float *smem, const float *consts,
                                                const float *resident, gdr_serve_shared *sh) {
    for (;;) {
        gdr_serve_sync_bar(0u, blockDim.x);
        const unsigned int reason = sh->reason, n = sh->n;
        if (reason) break;
        gdr_serve_block_batch(n, smem, consts, resident, sh);
        gdr_serve_sync_bar(0u, blockDim.x);
    }
    struct gdr_mq_worker w;
    gdr_mq_worker_init(w, *desc, warp);
    gdr_mq_worker_exit(w, sh->reason, 0u, 0u);
}

// The persistent worker, launched by gdr::mq::GpuWorkers (Handler::with_kernel) with mq's
// worker parameters. At most GDR_SERVE_MAX_THREADS threads a block (gpu.rs refuses more):
// without the bound the compiler used 168 registers a thread, more than a 512-thread block
// can have. Warp 0 runs the mq loop and the others the app loop; the two meet at block-wide
// barrier 0 (bar.sync with the block's thread count: PTX's named-barrier rule, under which
// different instructions in different warps complete one barrier).
extern "C" __global__ void __launch_bounds__(GDR_SERVE_MAX_THREADS)
    gdr_serve_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues, gdr_u32 blocks_per_queue,
                     gdr_u64 idle_ns) {
    __shared__ __align__(16) float smem[GDR_SERVE_MAX_GROUPS * GDR_SERVE_GROUP_FLOATS];
    __shared__ __align__(16) float consts[GDR_SERVE_CONST_FLOATS];
    __shared__ gdr_serve_shared sh;
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 wpb = blockDim.x / 32u, wib = threadIdx.x / 32u;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * wpb + wib;
    if (threadIdx.x == 0) sh.cap = descs[q].max_msg;
    gdr_serve_block_init();
    gdr_serve_block_consts(consts);
    const float *resident = gdr_serve_block_resident();
    if (wib == 0)
        gdr_serve_mq_loop(descs + q, warp, idle_ns, smem, consts, resident, &sh);
    else
        gdr_serve_app_loop(descs + q, warp, smem, consts, resident, &sh);
}
