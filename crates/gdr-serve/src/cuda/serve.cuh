// gdr-serve, device side: the group an app runs on, and the built-in apps' helpers.
// Spliced by the host after gdr_mq's device.cuh (so gdr_ld_volatile_v4 & co. are here).
//
// An app runs on a *group*: a set of whole warps of one block that work on one request
// together. It is called by every thread of the group with the same arguments and must
// return the same response length in every thread (the group's thread 0 is the one used).
// A request arrives 16-byte aligned, in GPU memory written by the host or, a lone request
// in the persistent worker, in the block's shared memory: read it through the generic
// pointer (gdr_serve_load16 or plain loads; not with `.global` instructions). The response
// buffer is 16-byte aligned, `cap` bytes.
//
// An app that reads the same data on every request (weights) may keep up to
// GDR_SERVE_CONST_FLOATS floats of it in shared memory: it defines that count and
// GDR_SERVE_APP_LOAD(consts, t, n), which fills them (thread t of n) once per block in the
// persistent worker -- and once per launch in the host-centric kernel, which has no state
// between requests -- and reads them through g.consts.
//
// Larger read-only data (LeNet's FC weights, 167 KB) may be *resident*: the app defines
// GDR_SERVE_RESIDENT_FLOATS (a multiple of 4) and GDR_SERVE_RESIDENT_SRC, a 16-byte aligned
// global-memory array of that many floats, ready after GDR_SERVE_APP_INIT. A persistent
// worker block whose launch has the dynamic shared memory for it copies it there once and
// the app reads it through g.resident; otherwise, and in the host-centric kernel (where a
// copy per launch would cost more than it saves), g.resident is the global array itself.

#ifndef GDR_SERVE_WORK
#define GDR_SERVE_WORK 1
#endif
// Phase marks inside an app (GDR_SERVE_MARK(k), k < 16): nothing, unless a timing harness
// (tests/lenet_phases.rs) defines it before this file.
#ifndef GDR_SERVE_MARK
#define GDR_SERVE_MARK(k)
#endif
// The same in a cluster app (GDR_SERVE_CL_MARK(k), k < 16; `c` the app's gdr_serve_cluster).
#ifndef GDR_SERVE_CL_MARK
#define GDR_SERVE_CL_MARK(k)
#endif
#define GDR_SERVE_MAX_GROUPS 4
#define GDR_SERVE_GROUP_FLOATS 2112
#define GDR_SERVE_FAILED 0xffffffffu

struct gdr_serve_group {
    unsigned int rank;  // this thread's index in the group
    unsigned int size;  // threads in the group, a multiple of 32
    unsigned int bar;   // the group's named barrier (1..15)
    float *smem;        // GDR_SERVE_GROUP_FLOATS floats of shared memory, the group's own
    const float *consts; // the block's read-only shared constants (GDR_SERVE_APP_LOAD), or unused
    const float *resident; // GDR_SERVE_RESIDENT_SRC's data, in shared memory if the block has it
};

// Named barrier `bar` over `threads` threads.
__device__ __forceinline__ void gdr_serve_sync_bar(unsigned int bar, unsigned int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(bar), "r"(threads) : "memory");
}

// Barrier over the group's threads only.
__device__ __forceinline__ void gdr_serve_sync(const gdr_serve_group &g) {
    gdr_serve_sync_bar(g.bar, g.size);
}

// 16 request bytes, past any cache (the host wrote them through BAR1). A generic load: a
// lone request is in the worker's shared memory (gdr_mq_worker::lone_req), others in the
// RX slot.
__device__ __forceinline__ uint4 gdr_serve_load16(const unsigned char *p) {
    return gdr_ld_volatile_generic_v4(p);
}

// ---- thread-block clusters (Hopper and later): one request over several SMs ----------------
// With GDR_SERVE_CLUSTER = C > 1 (the host sets it for an app that has a cluster form,
// GDR_SERVE_APP_CLUSTER), a queue's worker is a cluster of C blocks, each on its own SM. Data
// moves between the blocks with st.async: a store into another block's shared memory that
// also counts its bytes on an mbarrier in that block (complete_tx); the receiving block waits
// for the mbarrier's phase, which completes once it has armed it (arrive.expect_tx, the byte
// count it expects) and that many bytes have landed. A one-way hand-off this way costs a
// fraction of a cluster barrier with release semantics, which any plain remote store would
// need before the reader may look, and whose fence alone is most of its cost (docs/serve.md,
// "Clusters").

#ifndef GDR_SERVE_CLUSTER
#define GDR_SERVE_CLUSTER 1
#endif

// This block's rank in its cluster.
__device__ __forceinline__ unsigned int gdr_cl_rank() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// The shared-window address of a pointer into this block's shared memory.
__device__ __forceinline__ unsigned int gdr_cl_local(const void *p) {
    return (unsigned int)__cvta_generic_to_shared(p);
}

// The same shared-memory location in block `rank` of the cluster (a shared::cluster address).
__device__ __forceinline__ unsigned int gdr_cl_map(unsigned int local, unsigned int rank) {
    unsigned int out;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(local), "r"(rank));
    return out;
}

// An mbarrier of this block, for one arrival a phase (the arming thread's).
__device__ __forceinline__ void gdr_cl_mbar_init(unsigned long long *mb) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(gdr_cl_local(mb)) : "memory");
}

// Arms this block's mbarrier for its current phase: `bytes` are expected (st.async from any
// block, before or after this call). One thread, once a phase.
__device__ __forceinline__ void gdr_cl_mbar_expect(unsigned long long *mb, unsigned int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(gdr_cl_local(mb)),
                 "r"(bytes)
                 : "memory");
}

// Waits until the phase of this block's mbarrier with `parity` has completed: its bytes are
// here and visible (the acquire pairs with the complete_tx's release at cluster scope).
__device__ __forceinline__ void gdr_cl_mbar_wait(unsigned long long *mb, unsigned int parity) {
    const unsigned int a = gdr_cl_local(mb);
    unsigned int done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], "
            "%2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(a), "r"(parity)
            : "memory");
    } while (!done);
}

// 4 bytes into block memory at `dst` (shared::cluster), counted on the mbarrier at `mb`
// (shared::cluster, in the same block as dst).
__device__ __forceinline__ void gdr_cl_put_f32(unsigned int dst, float v, unsigned int mb) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(dst),
                 "r"(__float_as_uint(v)), "r"(mb)
                 : "memory");
}

// 16 bytes, likewise (dst 16-byte aligned).
__device__ __forceinline__ void gdr_cl_put_v4(unsigned int dst, uint4 v, unsigned int mb) {
    asm volatile(
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(dst),
        "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(mb)
        : "memory");
}

// `v` into the same location of every block of the cluster, each counted on that block's
// mbarrier `mb` (a local pointer, mapped per block).
template <unsigned int C>
__device__ __forceinline__ void gdr_cl_put_all(const float *dst, float v,
                                               const unsigned long long *mb) {
    const unsigned int d = gdr_cl_local(dst), m = gdr_cl_local(mb);
#pragma unroll
    for (unsigned int k = 0; k < C; k++) gdr_cl_put_f32(gdr_cl_map(d, k), v, gdr_cl_map(m, k));
}

// A barrier of every thread of the cluster, with release/acquire: every block's mbarriers are
// initialised before anyone stores to them, and no block exits while another may still write
// to its shared memory. Slow: a release fence and a cluster-wide wait; only at start and
// exit.
__device__ __forceinline__ void gdr_cl_sync_all() {
    asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;" ::: "memory");
}

// A lone request's answer, for a cluster app that writes it itself (GDR_SERVE_APP_CLUSTER_ANSWERS):
// the request's TX slot (host memory, mq's word format) and what every word of it carries.
// The mq warp sets the fields once it has read the request's tag, then `ready` to the job's
// number (gdr_serve_cluster::answer_no); the app's threads read them with
// gdr_serve_answer_get, long after in practice.
struct gdr_serve_answer {
    unsigned char *slot;
    unsigned long long tag;
    unsigned int seq;
    unsigned int ready;
};

// What a cluster app is handed besides the request: where its block stands.
struct gdr_serve_cluster {
    unsigned int rank;    // this block's rank in the cluster (0: the block that answers)
    unsigned int t;       // this thread's index among the block's app threads
    unsigned int n;       // the block's app threads, a multiple of 32
    unsigned int bar;     // named barrier of the block's app threads
    unsigned int parity;  // this request's phase parity of the app's mbarriers
    unsigned long long *mbar; // the app's GDR_SERVE_CL_APP_MBARS mbarriers in this block
    float *smem;          // GDR_SERVE_CL_SMEM_FLOATS floats, the block's
    const float *consts;  // the block's shared constants (GDR_SERVE_APP_LOAD)
    const float *resident; // this block's share of the resident data (GDR_SERVE_CL_RESIDENT)
    // Block 0 of a lone request, with an app that defines GDR_SERVE_APP_CLUSTER_ANSWERS: where
    // it writes its answer itself (null otherwise: the answer goes to `resp` as always).
    // Such an app either returns GDR_SERVE_FAILED having written nothing there, or returns
    // the length it wrote: the header (gdr_serve_answer_header) and every 4 bytes of the
    // payload (gdr_serve_answer_word), each by any one thread of block 0, in any order. The
    // answer then leaves the thread that computed each part at once, instead of through
    // `resp`, a barrier of the block and the mq warp's stores (the send stage).
    gdr_serve_answer *answer;
    unsigned int answer_no;
};

// The answer's slot, seq and tag (see gdr_serve_cluster::answer), once the mq warp has set
// them. The wait ends: the mq warp sets `ready` for every job it pushes with the answer bit,
// right after its receive returns, and on the receive's failure path before it waits for the
// app (with no slot), in both cases before it reaches block barrier 0, where it meets the
// app's end.
__device__ __forceinline__ gdr_serve_answer gdr_serve_answer_get(const gdr_serve_cluster &c) {
    while (*(volatile unsigned int *)&c.answer->ready != c.answer_no) {
    }
    __threadfence_block();  // the fields below were set before `ready`
    return *c.answer;
}

// The answer's header: its length and the request's tag. (No slot: the receive failed after
// the request was handed over, and nothing is written.)
__device__ __forceinline__ void gdr_serve_answer_header(const gdr_serve_answer &a, unsigned int len) {
    if (!a.slot) return;
    gdr_st_volatile_v4(a.slot, gdr_mq_tx_pair(0u, a.seq, len, a.tag, 0));
    gdr_st_volatile_v4(a.slot + 16, gdr_mq_tx_pair(1u, a.seq, len, a.tag, 0));
}

// Bytes 4k .. 4k+3 of the answer's payload.
__device__ __forceinline__ void gdr_serve_answer_word(const gdr_serve_answer &a, unsigned int k,
                                                      unsigned int v) {
    if (a.slot) gdr_mq_tx_word(a.slot, a.seq, k, v);
}
#define GDR_SERVE_CL_APP_MBARS 4
// A cluster block's shared memory for its app (kernels.cu keeps the rest of the 48 KB of
// static shared memory for the hand-over buffers).
#define GDR_SERVE_CL_SMEM_FLOATS (3 * GDR_SERVE_GROUP_FLOATS)

// ---- echo: the request back -------------------------------------------------------------
__device__ unsigned int gdr_app_echo(const gdr_serve_group &g, const unsigned char *req,
                                     unsigned int len, unsigned char *resp, unsigned int cap) {
    if (len > cap) return GDR_SERVE_FAILED;
    const unsigned int words = (len + 15u) / 16u;
    for (unsigned int rep = 0; rep < GDR_SERVE_WORK; rep++)
        for (unsigned int i = g.rank; i < words; i += g.size)
            ((uint4 *)resp)[i] = gdr_serve_load16(req + 16u * i);
    return len;
}

// ---- vecadd: n f32 a, then n f32 b -> n f32 a + b -----------------------------------------
__device__ unsigned int gdr_app_vecadd(const gdr_serve_group &g, const unsigned char *req,
                                       unsigned int len, unsigned char *resp, unsigned int cap) {
    const unsigned int n = len / 8u;
    if (len % 8u != 0u || n * 4u > cap) return GDR_SERVE_FAILED;
    const unsigned int *a = (const unsigned int *)req;
    const unsigned int *b = a + n;
    float *c = (float *)resp;
    for (unsigned int rep = 0; rep < GDR_SERVE_WORK; rep++)
        for (unsigned int i = g.rank; i < n; i += g.size)
            c[i] = __fadd_rn(__uint_as_float(gdr_ld_volatile_u32(a + i)),
                             __uint_as_float(gdr_ld_volatile_u32(b + i)));
    return n * 4u;
}
