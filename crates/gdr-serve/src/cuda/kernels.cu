// gdr-serve kernels. The host has defined GDR_SERVE_APP (the app function) and, if the app
// needs one-time setup, GDR_SERVE_APP_INIT(t, n) before this file; an app with shared
// constants also GDR_SERVE_CONST_FLOATS and GDR_SERVE_APP_LOAD (serve.cuh).
//
// The persistent worker (gdr_serve_worker) is an application kernel, gdr_mq's hook for device
// code that receives and answers messages itself (Handler::with_kernel; the program is mq's
// device.cuh and this, without mq's per-lane worker or a `handle`): mq's per-lane handler
// runs one request per lane, but a LeNet request wants a whole block. So warp 0 of each block
// is the mq worker (gdr_mq_recv / gdr_mq_send, the public warp-level calls) and the other warps
// are split into groups that run the app on the claimed requests: one request -> all of them
// on it (lowest latency); a batch -> up to GDR_SERVE_MAX_GROUPS requests at a time.

// Threads of a worker block, which the kernels' launch bound is: the host defines it from the
// block size it launches (apps.rs, device_source_for), up to 512.
#ifndef GDR_SERVE_MAX_THREADS
#define GDR_SERVE_MAX_THREADS 512
#endif

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

// How long a block waits for block 0's one-time app setup. Block 0 that never runs (a grid
// larger than the GPU holds at once) or a setup that never ends would otherwise hold every
// other block forever; past this the waiting blocks trap, and the launch fails with a CUDA
// error that the server reports instead of hanging. A program may define it first.
#ifndef GDR_SERVE_INIT_TIMEOUT_NS
#define GDR_SERVE_INIT_TIMEOUT_NS 10000000000ull
#endif

// One-time app setup by block 0; every other block waits for it (bounded, see above).
__device__ void gdr_serve_block_init() {
#ifdef GDR_SERVE_APP_INIT
    if (blockIdx.x == 0) {
        GDR_SERVE_APP_INIT(threadIdx.x, blockDim.x);
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) gdr_st_release_gpu_u32(&gdr_serve_init_done, 1u);
    } else if (threadIdx.x == 0) {
        const gdr_u64 since = gdr_globaltimer_ns();
        while (gdr_ld_acquire_gpu_u32(&gdr_serve_init_done) == 0u) {
            if (gdr_globaltimer_ns() - since > (gdr_u64)GDR_SERVE_INIT_TIMEOUT_NS) __trap();
            __nanosleep(100);
        }
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

// Where the block's app reads its resident data (serve.cuh): in dynamic shared memory when
// the launch has enough of it (the host asks for it where the GPU allows; gdr_serve_block_resident
// copies it there once), else the global array. Cheap enough to ask again on every request
// (a special register), which the worker's loops do rather than keep the pointer live.
__device__ __forceinline__ const float *gdr_serve_resident_at() {
#ifdef GDR_SERVE_RESIDENT_FLOATS
    unsigned int dyn;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn >= GDR_SERVE_RESIDENT_FLOATS * 4u) return gdr_serve_dyn;
#endif
    return GDR_SERVE_RESIDENT_GLOBAL;
}

// Copies the resident data into dynamic shared memory once, if it goes there.
__device__ void gdr_serve_block_resident() {
#ifdef GDR_SERVE_RESIDENT_FLOATS
#if GDR_SERVE_CLUSTER > 1
    // A cluster block keeps its own share (the app's GDR_SERVE_CL_RESIDENT).
    if (gdr_serve_resident_at() == gdr_serve_dyn) {
        GDR_SERVE_CL_RESIDENT(gdr_serve_dyn, gdr_cl_rank(), threadIdx.x, blockDim.x);
        __syncthreads();
        return;
    }
#endif
    if (gdr_serve_resident_at() == gdr_serve_dyn) {
        const float4 *src = (const float4 *)GDR_SERVE_RESIDENT_GLOBAL;
        for (unsigned int i = threadIdx.x; i < GDR_SERVE_RESIDENT_FLOATS / 4u; i += blockDim.x)
            ((float4 *)gdr_serve_dyn)[i] = __ldcg(src + i);
    }
#endif
    __syncthreads();
}

// The app on one group. Inlined into the app warps' loop, which keeps almost nothing else
// live: there the app has the registers to itself. As a call of its own (gdr_serve_run) in
// the host-centric kernel and in a one-warp block's mq loop, where inlining it next to the
// mq state spilled inside the convolutions. (The app warps used to call gdr_serve_run too:
// under the 128 registers of a 512-thread block the call's ABI made the app spill in its
// inner loops, 117 local loads, where the inlined app has none.)
__device__ __forceinline__ unsigned int gdr_serve_app_on(unsigned int rank, unsigned int size,
                                                        unsigned int bar, float *smem,
                                                        const float *consts,
                                                        const float *resident,
                                                        const unsigned char *req,
                                                        unsigned int len, unsigned char *resp,
                                                        unsigned int cap) {
    const gdr_serve_group g = {rank, size, bar, smem, consts, resident};
    return GDR_SERVE_APP(g, req, len, resp, cap);
}

__device__ __noinline__ unsigned int gdr_serve_run(unsigned int rank, unsigned int size,
                                                   unsigned int bar, float *smem,
                                                   const float *consts, const float *resident,
                                                   const unsigned char *req, unsigned int len,
                                                   unsigned char *resp, unsigned int cap) {
    return gdr_serve_app_on(rank, size, bar, smem, consts, resident, req, len, resp, cap);
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

// A lone request's response up to this size stays in the block's shared memory on its way
// to gdr_mq_send (the host raises it for light apps, whose blocks have the room).
#ifndef GDR_SERVE_LONE_RESP_BYTES
#define GDR_SERVE_LONE_RESP_BYTES 256
#endif
// A lone request up to this size is read by the whole mq warp into shared memory
// (gdr_mq_worker::lone_req), where the app reads it instead of from the RX slot in L2.
#define GDR_SERVE_LONE_REQ_BYTES 1024

// Set by the host for each launch (gpu.rs, App::worker_handler): the queues' RX format (the mq
// loop carries the code of that receive only) and whether the workers time their stages.
// Without GDR_SERVE_PROFILE the mq loop clears GDR_MQ_FLAG_PROFILE from its copy of the
// queue descriptor, so the compiler drops every stage clock of gdr_mq and the registers
// that held them: under the 128 registers of a 512-thread block that state alone made the
// mq loop spill on the request path.
#ifndef GDR_SERVE_RX_WORDS
#define GDR_SERVE_RX_WORDS 0
#endif
#ifndef GDR_SERVE_PROFILE
#define GDR_SERVE_PROFILE 0
#endif
// Set by the host for light apps (echo, vecadd; App::light): a one-warp block's mq loop runs
// the app inlined, not through the gdr_serve_run call, around which the warp saves and
// reloads its live mq state. Heavy apps keep the call: inlined next to the mq state, LeNet's
// convolutions spilled. (For echo, this and the direct lone path below shortened the profiled
// app stage, and the server's device stage with it.)
#ifndef GDR_SERVE_SOLO_INLINE
#define GDR_SERVE_SOLO_INLINE 0
#endif

// What warp 0 tells the block about each batch.
struct gdr_serve_shared {
    const unsigned char *reqs[GDR_MQ_WARP_BATCH];
    unsigned char *resps[GDR_MQ_WARP_BATCH];
    unsigned int lens[GDR_MQ_WARP_BATCH];
    unsigned int outs[GDR_MQ_WARP_BATCH];
    unsigned int n, reason, cap;
    // GDR_SERVE_PROFILE: the first app warp's clock64 when it had the batch and when its
    // share of the batch was done (the same SM clock as warp 0's).
    gdr_u64 app_clock[2];
    // A lone request's response (when cap fits): gdr_mq_send's warp reads it back from
    // shared memory instead of from scratch the app's warps wrote (the L1 does not keep
    // global stores, so that read was an L2 round trip on the reply path).
    uint4 lone_resp[GDR_SERVE_LONE_RESP_BYTES / 16];
    uint4 lone_req[GDR_SERVE_LONE_REQ_BYTES / 16];
};

// The persistent worker block's shared memory. At file scope, so the loops below address it
// by constant instead of keeping pointers to it in registers, which the app warps' loop
// spilled around the app (a small saving: no change showed in the profile).
#if GDR_SERVE_CLUSTER > 1
// A cluster block runs one request at a time, one group (serve.cuh).
__shared__ __align__(16) float gdr_serve_wsmem[GDR_SERVE_CL_SMEM_FLOATS];
#else
__shared__ __align__(16) float gdr_serve_wsmem[GDR_SERVE_MAX_GROUPS * GDR_SERVE_GROUP_FLOATS];
#endif
__shared__ __align__(16) float gdr_serve_wconsts[GDR_SERVE_CONST_FLOATS];
__shared__ gdr_serve_shared gdr_serve_wsh;

// clock64 once `v` (a shared-memory value read after a block barrier) has arrived. A clock
// read right after bar.sync appears to issue before the barrier releases (a profile that read
// it so showed a LeNet request's app far shorter than it is, and its time in the next stage);
// a load after the barrier cannot, and the branch on v makes the clock read wait for that
// load.
__device__ __forceinline__ gdr_u64 gdr_serve_clock_after(unsigned int v) {
    return v == 0xfffffffeu ? 0ull : (gdr_u64)clock64();
}

// mq's receive for the one RX format this program was built for (GDR_SERVE_RX_WORDS).
__device__ __forceinline__ gdr_u32 gdr_serve_recv(gdr_mq_worker &w, gdr_mq_batch &b, gdr_u64 idle_ns,
                                                  gdr_u32 *err, gdr_u32 *arg) {
#if GDR_SERVE_RX_WORDS
    return gdr_mq_recv_words(w, b, idle_ns, err, arg);
#else
    return gdr_mq_recv_header(w, b, idle_ns, err, arg);
#endif
}

// GDR_SERVE_PROFILE: the hand-over (stage 1) and app (stage 3) times of the batch just done,
// from the first app warp's clocks (gdr_serve_shared::app_clock).
__device__ __forceinline__ void gdr_serve_prof_app(gdr_mq_worker &w) {
    if (GDR_SERVE_PROFILE && (w.q.flags & GDR_MQ_FLAG_PROFILE)) {
        const gdr_u64 a0 = gdr_serve_wsh.app_clock[0], a1 = gdr_serve_wsh.app_clock[1];
        w.prof[1] += a0 - w.prof_mark;
        w.prof[3] += a1 - a0;
        w.prof_mark = a1;
    }
}

// Warps of the block that run the app: all but warp 0 (the mq loop), unless the block is one
// warp. Warp 0 stays out because calling the app from its loop made it save its mq state
// (over a kilobyte a thread) to local memory around every request, and with the resident
// data in shared memory little L1 is left to hold that.
__device__ __forceinline__ unsigned int gdr_serve_first_app_warp() {
    return blockDim.x > 32u ? 1u : 0u;
}

// The block's share of one batch of n: its app warps split into groups, each group runs the
// app on every groups-th claimed request. Called by every app warp of the block; INLINE_APP
// as gdr_serve_app_on says.
template <bool INLINE_APP>
__device__ __forceinline__ void gdr_serve_block_batch(unsigned int n) {
    gdr_serve_shared *sh = &gdr_serve_wsh;
    const float *consts = gdr_serve_wconsts, *resident = gdr_serve_resident_at();
    const unsigned int first = gdr_serve_first_app_warp();
    const unsigned int wpb = blockDim.x / 32u - first, wib = threadIdx.x / 32u - first;
    // One request (the latency case): one group of every app warp, without the divisions.
    unsigned int groups = 1, wpg = wpb, gid = 0;
    if (n > 1u) {
        while (groups * 2u <= n && groups * 2u <= GDR_SERVE_MAX_GROUPS && groups * 2u <= wpb)
            groups *= 2u;
        wpg = wpb / groups;
        gid = wib / wpg;
    }
    if (gid < groups) {
        const unsigned int rank = threadIdx.x - (first + gid * wpg) * 32u;
        float *gsmem = gdr_serve_wsmem + gid * GDR_SERVE_GROUP_FLOATS;
        for (unsigned int k = gid; k < n; k += groups) {
            const unsigned int r =
                INLINE_APP ? gdr_serve_app_on(rank, wpg * 32u, 1u + gid, gsmem, consts, resident,
                                              sh->reqs[k], sh->lens[k], sh->resps[k], sh->cap)
                           : gdr_serve_run(rank, wpg * 32u, 1u + gid, gsmem, consts, resident,
                                           sh->reqs[k], sh->lens[k], sh->resps[k], sh->cap);
            if (rank == 0) sh->outs[k] = r;
            gdr_serve_sync_bar(1u + gid, wpg * 32u);
        }
    }
}

// Warp 0's loop: mq's receive, the app warps' share of the batch, mq's send. SOLO: a one-warp
// block, whose warp 0 runs the app itself (a light app inlined, GDR_SERVE_SOLO_INLINE; any
// other through the gdr_serve_run call, which only this instance carries: around a call
// every live register is saved, so the multi-warp loop has none). A call of its own, as is
// the other warps' loop below, so each keeps only its own state in registers.
//
// GDR_SERVE_PROFILE stages (gpu.rs, worker_stages): 0 recv (gdr_mq_recv: requests found ->
// in hand; where the cluster worker pushes a lone request from the receive's hook, -> that
// push), 1 hand-over (-> the first app warp has the batch), 3 app (-> that warp's share
// is done), 2 send (-> the TX stores issued: the block barrier after the app, then
// gdr_mq_send). Stages 1 and 3 end on the app warp's clock, read by warp 0 after the barrier.
// The receiving warp's mq state: stage clocks only in a profiling build, a lone request
// delivered into the block's lone_req buffer. Inlined into each loop (the worker stays in
// registers).
__device__ __forceinline__ void gdr_serve_worker_init(gdr_mq_worker &w, const gdr_mq_queue_desc *desc,
                                                      gdr_u32 warp) {
    gdr_mq_worker_init(w, *desc, warp);
    if (!GDR_SERVE_PROFILE) w.q.flags &= ~(gdr_u32)GDR_MQ_FLAG_PROFILE;
    w.lone_req = (unsigned char *)gdr_serve_wsh.lone_req;
    w.lone_cap = GDR_SERVE_LONE_REQ_BYTES;
}

template <bool SOLO>
__device__ __noinline__ void gdr_serve_mq_loop(const gdr_mq_queue_desc *desc, gdr_u32 warp,
                                               gdr_u64 idle_ns) {
    gdr_serve_shared *sh = &gdr_serve_wsh;
    struct gdr_mq_worker w;
    gdr_serve_worker_init(w, desc, warp);
    gdr_u32 err = 0, arg = 0;
    gdr_mq_batch b;
#if GDR_SERVE_RX_WORDS
    // A light app's lone requests in a one-warp block (the latency case) take mq's
    // lone-message loop (gdr_mq_lone_words): the request from the poll's registers into
    // lone_req, the app inlined on the warp, the response out of lone_resp, no batch state.
    // Batches and longer requests come back here, to the receive below.
    const bool lone_loop = SOLO && GDR_SERVE_SOLO_INLINE && sh->cap <= GDR_SERVE_LONE_RESP_BYTES &&
                           gdr_mq_lone_words_ok(w);
#endif
    for (;;) {
#if GDR_SERVE_RX_WORDS
        if (lone_loop) {
            const gdr_u32 r = gdr_mq_lone_words(
                w, (uint2 *)sh->lone_req, (uint2 *)sh->lone_resp, sh->cap, 3, idle_ns,
                [&](const unsigned char *req, gdr_u32 len, unsigned char *resp) {
                    return gdr_serve_app_on(w.lane, 32u, 1u, gdr_serve_wsmem, gdr_serve_wconsts,
                                            gdr_serve_resident_at(), req, len, resp, sh->cap);
                });
            if (r != GDR_MQ_LONE_GENERAL) {
                if (w.lane == 0) sh->reason = r;
                __syncwarp();
                break;
            }
        }
#endif
        const gdr_u32 reason = gdr_serve_recv(w, b, idle_ns, &err, &arg);
        if (w.lane == 0) {
            sh->reason = reason;
            sh->n = reason ? 0u : b.n;
        }
        const bool lone = b.n == 1u && sh->cap <= GDR_SERVE_LONE_RESP_BYTES;
        unsigned char *resp = lone ? (unsigned char *)sh->lone_resp : w.resp_scratch;
        // A light app's lone request in a one-warp block (the latency case) goes from the
        // receive straight into the inlined app, the warp as its group: nothing passes
        // through gdr_serve_shared and no barrier is crossed (uniform: b.n, reason).
        const bool direct = SOLO && GDR_SERVE_SOLO_INLINE && b.n == 1u && !reason;
        if (!reason && !direct && w.lane < b.n) {
            sh->reqs[w.lane] = b.req;
            sh->lens[w.lane] = b.req_len;
            sh->resps[w.lane] = resp;
        }
        gdr_u32 out = 0;
        if (direct) {
            // The request's pointer and length are lane 0's (gdr_mq_recv hands a lone
            // message to lane 0); the app wants them in every thread of its group.
            const unsigned char *req =
                (const unsigned char *)__shfl_sync(0xffffffffu, (gdr_u64)b.req, 0);
            const gdr_u32 len = __shfl_sync(0xffffffffu, b.req_len, 0);
            if (GDR_SERVE_PROFILE && w.lane == 0) sh->app_clock[0] = clock64();
            const gdr_u32 r = gdr_serve_app_on(w.lane, 32u, 1u, gdr_serve_wsmem, gdr_serve_wconsts,
                                               gdr_serve_resident_at(), req, len, resp, sh->cap);
            if (GDR_SERVE_PROFILE && w.lane == 0) sh->app_clock[1] = clock64();
            out = w.lane == 0 ? r : 0u;
            __syncwarp();  // the response is in place before gdr_mq_send's lanes read it
        } else {
            if (SOLO) {
                __syncwarp();
                if (reason) break;
                if (GDR_SERVE_PROFILE && w.lane == 0) sh->app_clock[0] = clock64();
                gdr_serve_block_batch<GDR_SERVE_SOLO_INLINE != 0>(b.n);
                if (GDR_SERVE_PROFILE && w.lane == 0)
                    sh->app_clock[1] = gdr_serve_clock_after(sh->outs[0]);
                __syncwarp();
            } else {
                gdr_serve_sync_bar(0u, blockDim.x);
                if (reason) break;
                gdr_serve_sync_bar(0u, blockDim.x);
            }
            out = w.lane < b.n ? sh->outs[w.lane] : 0u;
        }
        gdr_serve_prof_app(w);
        gdr_mq_send(w, b, resp, out);
    }
    gdr_mq_worker_exit(w, sh->reason, err, arg);
}

// The other warps' loop: no mq state at all; they learn each batch (or the exit reason) from
// warp 0 through shared memory. Their mq worker state is made only where they leave
// (gdr_mq_worker_init has no effect outside warp 0 of the queue, which is in warp 0 of a block).
__device__ __noinline__ void gdr_serve_app_loop(const gdr_mq_queue_desc *desc, gdr_u32 warp) {
    gdr_serve_shared *sh = &gdr_serve_wsh;
    const bool stamps = GDR_SERVE_PROFILE && threadIdx.x == 32u;
    for (;;) {
        gdr_serve_sync_bar(0u, blockDim.x);
        const unsigned int reason = sh->reason, n = sh->n;
        if (reason) break;
        if (stamps) sh->app_clock[0] = gdr_serve_clock_after(n);
        gdr_serve_block_batch<true>(n);
        if (stamps) sh->app_clock[1] = gdr_serve_clock_after(sh->outs[0]);
        gdr_serve_sync_bar(0u, blockDim.x);
    }
    struct gdr_mq_worker w;
    gdr_mq_worker_init(w, *desc, warp);
    gdr_mq_worker_exit(w, sh->reason, 0u, 0u);
}

#if GDR_SERVE_CLUSTER > 1
// ---- A cluster of GDR_SERVE_CLUSTER blocks a queue (serve.cuh, "thread-block clusters") --------
// Block 0's warp 0 receives and sends as in gdr_serve_mq_loop; the app warps (1..) of every
// block run the cluster form of the app (GDR_SERVE_APP_CLUSTER) on each request, one request
// at a time. The hand-over is a push: block 0's warp 0 stores a 16-byte job header (length,
// exit reason, response pointer) and the request itself into every block's gdr_serve_cl_req
// with st.async, counted on that block's "go" mbarrier, whose byte count is fixed (the header
// and the queue's max_msg, rounded up to 16): each block arms it for the next request as soon
// as all its app threads have read the current header. A lone request in the header format
// comes instead as one bulk copy from its RX slot, multicast to every block and counted on the
// same mbarriers (gdr_serve_cl_multicast), followed by the pushed job header alone. Block
// 0's app warps then meet warp 0 at block barrier 0 with the answer, as in the one-block
// worker. An app that writes a lone request's answer itself (GDR_SERVE_APP_CLUSTER_ANSWERS,
// serve.cuh's gdr_serve_cluster::answer) is told so by a bit of the job's length word
// (GDR_SERVE_CL_JOB_ANSWER); warp 0 then only retires the request after the barrier.
#ifndef GDR_SERVE_APP_CLUSTER
#error "GDR_SERVE_CLUSTER > 1 needs the app's cluster form, GDR_SERVE_APP_CLUSTER"
#endif
#ifdef GDR_SERVE_APP_CLUSTER_ANSWERS
#define GDR_SERVE_CL_ANSWERS true
#else
#define GDR_SERVE_CL_ANSWERS false
#endif
#define GDR_SERVE_CL_JOB_ANSWER 0x80000000u  // above any length (mq caps max_msg at 16 MiB)
#define GDR_SERVE_CL_GO 0
#define GDR_SERVE_CL_ACK 1
__shared__ __align__(16) unsigned char gdr_serve_cl_req[16 + GDR_SERVE_LONE_REQ_BYTES];
__shared__ __align__(16) uint4 gdr_serve_cl_acks[GDR_SERVE_CLUSTER];
__shared__ __align__(8) unsigned long long gdr_serve_cl_mbar[2 + GDR_SERVE_CL_APP_MBARS];
// Block 0: the answer the app writes itself (set by warp 0), and whether it did (set by the
// app's thread 0 before barrier 0).
__shared__ gdr_serve_answer gdr_serve_cl_answer;
__shared__ unsigned int gdr_serve_cl_answered;

// Bytes of one hand-over: the header, then the request padded to the queue's max_msg.
__device__ __forceinline__ unsigned int gdr_serve_cl_go_bytes() {
    return 16u + (gdr_serve_wsh.cap + 15u) / 16u * 16u;
}

// Warp-collective (block 0's warp 0): the job into every block of the cluster; only its
// header where the request is already on its way (`sent`, gdr_serve_cl_multicast).
__device__ __forceinline__ void gdr_serve_cl_push(const unsigned char *req, unsigned int len,
                                                  unsigned int reason, gdr_u64 resp, bool sent) {
    const unsigned int lane = threadIdx.x & 31u, chunks = gdr_serve_cl_go_bytes() / 16u;
    const unsigned int base = gdr_cl_local(gdr_serve_cl_req),
                       go = gdr_cl_local(&gdr_serve_cl_mbar[GDR_SERVE_CL_GO]);
    const uint4 job = make_uint4(len, reason, (unsigned int)resp, (unsigned int)(resp >> 32));
    if (sent) {
        if (lane < GDR_SERVE_CLUSTER)
            gdr_cl_put_v4(gdr_cl_map(base, lane), job, gdr_cl_map(go, lane));
        return;
    }
    for (unsigned int i = lane; i < chunks; i += 32u) {
        uint4 v = job;
        if (i != 0u)
            v = reason == 0u && 16u * (i - 1u) < len ? gdr_ld_volatile_generic_v4(req + 16u * (i - 1u))
                                                      : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (unsigned int k = 0; k < GDR_SERVE_CLUSTER; k++)
            gdr_cl_put_v4(gdr_cl_map(base + 16u * i, k), v, gdr_cl_map(go, k));
    }
}

// Warp-collective (block 0's warp 0), from the header receive's hook: a lone request's slot,
// which the doorbell's acquire has just made current, into every block at once (one bulk copy
// from L2, multicast to the cluster, counted on each block's "go" mbarrier) while the receive
// reads its header; gdr_serve_cl_push then sends only the job header. Returns whether it was
// sent: not from an RX ring in host memory, nor from a slot too short for the whole copy. A
// slot that was not current after all fails the queue (the receive's GDR_MQ_ERR_BAD_SEQ): the
// blocks are told to leave, and never run the app on what was copied.
// The payload copy's bytes and the header's make up gdr_serve_cl_go_bytes, as a push's do.
// Why: a microbenchmark found this hand-over quicker than st.async stores of the same bytes,
// and it starts one memory round trip sooner; in the worker it shortens the profiled
// hand-over stage and the server-side p50 (docs/serve.md, "Clusters").
__device__ __forceinline__ bool gdr_serve_cl_can_multicast(const gdr_mq_worker &w) {
    return !(w.q.flags & GDR_MQ_FLAG_RX_IN_HOST) &&
           GDR_MQ_SLOT_HEADER_SIZE + gdr_serve_cl_go_bytes() - 16u <= w.q.stride;
}

__device__ __forceinline__ bool gdr_serve_cl_multicast(const gdr_mq_worker &w,
                                                       const unsigned char *slot) {
    const unsigned int pay = gdr_serve_cl_go_bytes() - 16u;
    if (!gdr_serve_cl_can_multicast(w)) return false;
    if (w.lane == 0) {
        // The slot was read through the generic proxy's acquire; the copy reads it through the
        // async proxy.
        asm volatile("fence.proxy.async.global;" ::: "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
            "[%0], [%1], %2, [%3], %4;" ::"r"(gdr_cl_local(gdr_serve_cl_req + 16)),
            "l"(slot + GDR_MQ_SLOT_HEADER_SIZE), "r"(pay),
            "r"(gdr_cl_local(&gdr_serve_cl_mbar[GDR_SERVE_CL_GO])),
            "h"((unsigned short)((1u << GDR_SERVE_CLUSTER) - 1u))
            : "memory");
    }
    return true;
}

// Warp 0's lane 0: the answer's slot, seq and tag for block 0's app (gdr_serve_answer), then
// `ready`, ordered after them for the app threads that see it (gdr_serve_answer_get).
__device__ __forceinline__ void gdr_serve_cl_set_answer(unsigned char *slot, gdr_u64 tag,
                                                        gdr_u32 seq, gdr_u32 no) {
    if ((threadIdx.x & 31u) == 0u) {
        gdr_serve_cl_answer.slot = slot;
        gdr_serve_cl_answer.tag = tag;
        gdr_serve_cl_answer.seq = seq;
        __threadfence_block();
        *(volatile unsigned int *)&gdr_serve_cl_answer.ready = no;
    }
}

// Block 0's warp 0: receive, hand each request of the batch to the cluster and wait for
// block 0's app warps to answer it, send (or only retire a lone request whose answer the app
// wrote itself).
__device__ __noinline__ gdr_u32 gdr_serve_cl_mq_loop(const gdr_mq_queue_desc *desc, gdr_u32 warp,
                                                     gdr_u64 idle_ns) {
    gdr_serve_shared *sh = &gdr_serve_wsh;
    struct gdr_mq_worker w;
    gdr_serve_worker_init(w, desc, warp);
    gdr_u32 err = 0, arg = 0, reason;
    gdr_mq_batch b;
#if !GDR_SERVE_RX_WORDS
    // A lone request is found by its slot header and handed over whole from the hook: its
    // payload by the multicast, its job header pushed at once (mq's poll_slot).
    const bool poll_slot = gdr_serve_cl_can_multicast(w);
#endif
    // A lone request's response stays in shared memory where it fits; an app that answers
    // itself writes a lone request's answer straight into its TX slot.
    const bool lone_fits = sh->cap <= GDR_SERVE_LONE_RESP_BYTES;
    const gdr_u32 answer_bit = GDR_SERVE_CL_ANSWERS ? GDR_SERVE_CL_JOB_ANSWER : 0u;
    gdr_u32 answers = 0;  // jobs pushed with answer_bit (gdr_serve_answer::ready)
    for (;;) {
        bool sent = false;    // the lone request's payload is on its way (uniform)
        bool pushed = false;  // and its job header too: the cluster has it (uniform)
#if GDR_SERVE_RX_WORDS
        reason = gdr_serve_recv(w, b, idle_ns, &err, &arg);
#else
        gdr_u64 pushed_at = 0;
        reason = gdr_mq_recv_header_hook(
            w, b, idle_ns, &err, &arg, poll_slot, [&](const unsigned char *slot, gdr_u32 len) {
                sent = gdr_serve_cl_multicast(w, slot);
                if (sent && len != GDR_MQ_LEN_UNKNOWN) {
                    // The lone request's response buffer, as the loop below chooses it.
                    const gdr_u64 rp = lone_fits
                                           ? (gdr_u64)sh->lone_resp
                                           : __shfl_sync(0xffffffffu, (gdr_u64)w.resp_scratch, 0);
                    gdr_serve_cl_push(0, len | answer_bit, 0u, rp, true);
                    pushed = true;
                    if (GDR_SERVE_PROFILE) pushed_at = clock64();
                }
                return sent;
            });
        // Profile: the receive stage ends at the push (the slot reads after it overlap the
        // app), the hand-over runs from there.
        if (GDR_SERVE_PROFILE && pushed && (w.q.flags & GDR_MQ_FLAG_PROFILE)) {
            w.prof[0] -= w.prof_mark - pushed_at;
            w.prof_mark = pushed_at;
        }
#endif
        if (reason) {
            // A receive that fails after its push (not expected: the hook had the slot's
            // seq) lets block 0's app warps finish that request first (an app told to answer
            // it is handed no slot and writes nothing); the exit job then carries every byte
            // the go mbarriers count.
            if (pushed && answer_bit) gdr_serve_cl_set_answer(0, 0ull, 0u, ++answers);
            if (pushed) gdr_serve_sync_bar(0u, blockDim.x);
            gdr_serve_cl_push(0, 0u, reason, 0ull, sent && !pushed);
            break;
        }
        const bool lone = b.n == 1u && lone_fits;
        const gdr_u32 answer = b.n == 1u ? answer_bit : 0u;
        // The app's answer slot, as soon as the tag is known (after the push where the hook
        // pushed; the app needs it only at its end).
        if (answer)
            gdr_serve_cl_set_answer(gdr_mq_tx_slot(w, b.first), b.tag, b.first + 1u, ++answers);
        unsigned char *resp = lone ? (unsigned char *)sh->lone_resp : w.resp_scratch;
        gdr_u32 out = 0;
        for (gdr_u32 k = 0; k < b.n; k++) {
            const unsigned char *req =
                (const unsigned char *)__shfl_sync(0xffffffffu, (gdr_u64)b.req, k);
            const gdr_u32 len = __shfl_sync(0xffffffffu, b.req_len, k);
            const gdr_u64 rp = __shfl_sync(0xffffffffu, (gdr_u64)resp, k);
            if (!pushed) gdr_serve_cl_push(req, len | answer, 0u, rp, sent);
            gdr_serve_sync_bar(0u, blockDim.x);  // block 0's app warps have answered it
            const gdr_u32 r = sh->outs[0];
            if (w.lane == k) out = r;
        }
        gdr_serve_prof_app(w);
        if (answer && gdr_serve_cl_answered) {
            // The app wrote the answer (its stores are in the app stage): retire it only.
            if (GDR_SERVE_PROFILE) w.prof_mark = clock64();
            gdr_mq_retire(w, b);
        } else {
            gdr_mq_send(w, b, resp, out);
        }
    }
    gdr_mq_worker_exit(w, reason, err, arg);
    return reason;
}

// The app warps of every block: wait for a job, run the app's share of it, answer (block 0)
// or go back to waiting. Returns the exit reason.
__device__ __noinline__ gdr_u32 gdr_serve_cl_app_loop(unsigned int rank) {
    gdr_serve_shared *sh = &gdr_serve_wsh;
    unsigned long long *mb = gdr_serve_cl_mbar;
    const unsigned int t = threadIdx.x - 32u, n = blockDim.x - 32u;
    const bool stamps = GDR_SERVE_PROFILE && rank == 0u && t == 0u;
    unsigned int parity = 0, ack_parity = 0, answers = 0;
    for (;;) {
        gdr_cl_mbar_wait(mb + GDR_SERVE_CL_GO, parity);
        const uint4 h = *(const uint4 *)gdr_serve_cl_req;
        if (h.y != 0u) return h.y;
        const bool answer = (h.x & GDR_SERVE_CL_JOB_ANSWER) != 0u;  // uniform
        if (answer) answers++;
        if (stamps) sh->app_clock[0] = gdr_serve_clock_after(h.x);
        // Every app thread has the header: the next job may land.
        gdr_serve_sync_bar(1u, n);
        if (t == 0u) gdr_cl_mbar_expect(mb + GDR_SERVE_CL_GO, gdr_serve_cl_go_bytes());
        const gdr_serve_cluster c = {rank, t, n, 1u, parity, mb + 2, gdr_serve_wsmem,
                                     gdr_serve_wconsts, gdr_serve_resident_at(),
                                     answer && rank == 0u ? &gdr_serve_cl_answer : nullptr,
                                     answers};
        unsigned char *resp = (unsigned char *)(((gdr_u64)h.w << 32) | h.z);
        const unsigned int r = GDR_SERVE_APP_CLUSTER(c, gdr_serve_cl_req + 16,
                                                     h.x & ~GDR_SERVE_CL_JOB_ANSWER, resp, sh->cap);
        // A failed request exchanged nothing, so nothing held block 0 back until every block
        // was past its header: the others say so (16 bytes each on block 0's ack mbarrier).
        if (r == GDR_SERVE_FAILED) {
            if (rank != 0u) {
                if (t == 0u)
                    gdr_cl_put_v4(gdr_cl_map(gdr_cl_local(gdr_serve_cl_acks + rank), 0u),
                                  make_uint4(rank, 0u, 0u, 0u),
                                  gdr_cl_map(gdr_cl_local(mb + GDR_SERVE_CL_ACK), 0u));
            } else {
                if (t == 0u) gdr_cl_mbar_expect(mb + GDR_SERVE_CL_ACK, 16u * (GDR_SERVE_CLUSTER - 1u));
                gdr_cl_mbar_wait(mb + GDR_SERVE_CL_ACK, ack_parity);
            }
            ack_parity ^= 1u;
        }
        if (rank == 0u) {
            if (t == 0u) {
                sh->outs[0] = r;
                gdr_serve_cl_answered = answer && r != GDR_SERVE_FAILED;
            }
            if (stamps) sh->app_clock[1] = clock64();
            gdr_serve_sync_bar(0u, blockDim.x);
        }
        parity ^= 1u;
    }
}

// The cluster worker's start: mbarriers initialised and the first job armed in every block
// before any block may push (the cluster barrier's release/acquire).
__device__ void gdr_serve_cl_start() {
    if (threadIdx.x == 0) {
        gdr_serve_cl_answer.ready = 0u;
        for (unsigned int i = 0; i < 2u + GDR_SERVE_CL_APP_MBARS; i++)
            gdr_cl_mbar_init(&gdr_serve_cl_mbar[i]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    if (threadIdx.x == 32) gdr_cl_mbar_expect(&gdr_serve_cl_mbar[GDR_SERVE_CL_GO], gdr_serve_cl_go_bytes());
    gdr_cl_sync_all();
}
#define GDR_SERVE_CLUSTER_DIMS __cluster_dims__(GDR_SERVE_CLUSTER, 1, 1)
#else
#define GDR_SERVE_CLUSTER_DIMS
#endif

// The persistent worker, launched by gdr_mq::GpuWorkers (Handler::with_kernel) with mq's
// worker parameters. GDR_SERVE_MAX_THREADS threads a block, the bound the compiler allots
// registers by: without it the compiler used 168 registers a thread, more than a 512-thread
// block can have; at 512 warp 0's mq loop spills, at 256 (a cluster's 8 warps) nothing does.
// Warp 0 runs the mq loop and the others the app loop; the two meet at block-wide
// barrier 0 (bar.sync with the block's thread count: PTX's named-barrier rule, under which
// different instructions in different warps complete one barrier).
extern "C" __global__ void __launch_bounds__(GDR_SERVE_MAX_THREADS) GDR_SERVE_CLUSTER_DIMS
    gdr_serve_worker(const gdr_mq_queue_desc *descs, gdr_u32 nqueues, gdr_u32 blocks_per_queue,
                     gdr_u64 idle_ns) {
    const gdr_u32 q = blockIdx.x / blocks_per_queue;
    if (q >= nqueues) return;
    const gdr_u32 wpb = blockDim.x / 32u, wib = threadIdx.x / 32u;
    const gdr_u32 warp = (blockIdx.x % blocks_per_queue) * wpb + wib;
    if (threadIdx.x == 0) gdr_serve_wsh.cap = descs[q].max_msg;
    gdr_serve_block_init();
    gdr_serve_block_consts(gdr_serve_wconsts);
    gdr_serve_block_resident();
#if GDR_SERVE_CLUSTER > 1
    // Every block of the cluster serves queue q (blocks_per_queue is the cluster size).
    const unsigned int rank = gdr_cl_rank();
    gdr_serve_cl_start();
    gdr_u32 reason = 0;
    if (wib != 0u) reason = gdr_serve_cl_app_loop(rank);
    else if (rank == 0u) reason = gdr_serve_cl_mq_loop(descs + q, warp, idle_ns);
    // No block leaves while another may still store into its shared memory.
    gdr_cl_sync_all();
    if (wib == 0u && rank != 0u) reason = ((const uint4 *)gdr_serve_cl_req)->y;
    if (wib != 0u || rank != 0u) {
        struct gdr_mq_worker w;
        gdr_mq_worker_init(w, descs[q], warp);
        gdr_mq_worker_exit(w, reason, 0u, 0u);
    }
#else
    if (wpb == 1u)
        gdr_serve_mq_loop<true>(descs + q, warp, idle_ns);
    else if (wib == 0)
        gdr_serve_mq_loop<false>(descs + q, warp, idle_ns);
    else
        gdr_serve_app_loop(descs + q, warp);
#endif
}
