// gdr-serve, device side: the group an app runs on, and the built-in apps' helpers.
// Spliced by the host after gdr::mq's device.cuh (so gdr_ld_volatile_v4 & co. are here).
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
