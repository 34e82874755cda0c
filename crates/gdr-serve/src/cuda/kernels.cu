// gdr-serve kernels. The host has defined GDR_SERVE_APP (the app function) and, if the app
// needs one-time setup, GDR_SERVE_APP_INIT(t, n) before this file.
//
// The persistent worker replaces gdr::mq's per-lane worker: the handler interface of mq runs
// one request per lane, but a LeNet request wants a whole block. So warp 0 of each block is
// the mq worker (gdr_mq_recv / gdr_mq_send, the public warp-level calls) and the block's warps
// are split into groups that run the app on the claimed requests: one request -> the whole
// block on it (lowest latency); a batch -> up to GDR_SERVE_MAX_GROUPS requests at a time.

__device__ unsigned int gdr_serve_init_done;

// Per-lane handler that mq's own (unused, renamed) kernels call: never launched.
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

// Host-centric setup: the same one-time init, one block.
extern "C" __global__ void gdr_serve_init() { gdr_serve_block_init(); }

// Host-centric: one request per launch, the whole block on it.
extern "C" __global__ void gdr_serve_oneshot(const unsigned char *req, gdr_u32 req_len,
                                             unsigned char *resp, gdr_u32 resp_cap,
                                             gdr_u32 *resp_len) {
    __shared__ float smem[GDR_SERVE_GROUP_FLOATS];
    gdr_serve_group g = {threadIdx.x, blockDim.x, 1u, smem};
    const unsigned int r = GDR_SERVE_APP(g, req, req_len, resp, resp_cap);
    if (threadIdx.x == 0) *resp_len = r;
}

// The persistent worker, launched by gdr::mq::GpuWorkers under mq's kernel name and signature.
// At most GDR_SERVE_MAX_THREADS threads a block (gpu.rs refuses more): without the bound the
// compiler used 168 registers a thread, more than a 512-thread block can have.
#define GDR_SERVE_MAX_THREADS 512
extern "C" __global__ void __launch_bounds__(GDR_SERVE_MAX_THREADS) gdr_mq_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues,
                                         gdr_u32 blocks_per_queue, gdr_u64 idle_ns) {
    __shared__ float smem[GDR_SERVE_MAX_GROUPS * GDR_SERVE_GROUP_FLOATS];
    __shared__ const unsigned char *reqs[GDR_MQ_WARP_BATCH];
    __shared__ unsigned char *resps[GDR_MQ_WARP_BATCH];
    __shared__ unsigned int lens[GDR_MQ_WARP_BATCH];
    __shared__ unsigned int outs[GDR_MQ_WARP_BATCH];
    __shared__ unsigned int n_sh, reason_sh;
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 wpb = blockDim.x / 32u, wib = threadIdx.x / 32u;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * wpb + wib;
    struct gdr_mq_worker w;
    gdr_mq_worker_init(w, descs[q], warp);
    gdr_serve_block_init();
    gdr_u32 err = 0, arg = 0;
    gdr_mq_batch b;
    for (;;) {
        if (wib == 0) {
            const gdr_u32 reason = gdr_mq_recv(w, b, idle_ns, &err, &arg);
            if (w.lane == 0) {
                reason_sh = reason;
                n_sh = reason ? 0u : b.n;
            }
            if (!reason && w.lane < b.n) {
                reqs[w.lane] = b.req;
                lens[w.lane] = b.req_len;
                resps[w.lane] = w.resp_scratch;
            }
        }
        __syncthreads();
        if (reason_sh) break;
        const unsigned int n = n_sh;
        unsigned int groups = 1;
        while (groups * 2u <= n && groups * 2u <= GDR_SERVE_MAX_GROUPS && groups * 2u <= wpb)
            groups *= 2u;
        const unsigned int wpg = wpb / groups, gid = wib / wpg;
        if (gid < groups) {
            gdr_serve_group g = {threadIdx.x - gid * wpg * 32u, wpg * 32u, 1u + gid,
                                 smem + gid * GDR_SERVE_GROUP_FLOATS};
            for (unsigned int k = gid; k < n; k += groups) {
                const unsigned int r = GDR_SERVE_APP(g, reqs[k], lens[k], resps[k], w.q.max_msg);
                if (g.rank == 0) outs[k] = r;
                gdr_serve_sync(g);
            }
        }
        __syncthreads();
        if (wib == 0) gdr_mq_send(w, b, w.resp_scratch, w.lane < b.n ? outs[w.lane] : 0u);
    }
    gdr_mq_worker_exit(w, reason_sh, wib == 0 ? err : 0u, arg);
}

// mq's worker.cu follows this file in the program; its kernel of the same name becomes an
// unused one under another name (its body names the struct, which must stay complete).
struct gdr_serve_spare_worker : gdr_mq_worker {};
#define gdr_mq_worker gdr_serve_spare_worker
