/* rank_check: one process of gdr's many-process checks (scripts/ranks-gpu.sh, scripts/soak.sh,
 * scripts/faults-gpu.sh), run under `gdr run` so that its cudaMalloc memory comes from gdr's
 * allocator and libgdrapi can pin it.
 *
 * Default mode: each of --threads threads loops, until --seconds have passed or it has made
 * --iterations rounds (whichever comes first):
 *   cudaMalloc (or cuMemAlloc, at random) a random size (1 B .. --max-size, log-uniform, so small sizes dominate), take a
 *   random offset and length inside it, fill the allocation with a known byte, mark it
 *   SYNC_MEMOPS, pin the 64 KiB-aligned range around [offset, offset + length), gdr_get_info_v2,
 *   gdr_map, then
 *   - fresh random bytes through gdr_copy_to_mapping; cudaMemcpy of the whole allocation to the
 *     host must show them, and the known byte everywhere else;
 *   - other random bytes written with cudaMemcpy from the host; gdr_copy_from_mapping into a
 *     poisoned host buffer must give them, and the poison after the length must stay;
 *   gdr_unmap, gdr_unpin_buffer, cudaFree.
 * --hold N: each thread also pins and maps N buffers at its start and keeps them until its end,
 * when their bytes are checked again (so that a process killed mid-run holds pins and
 * mappings). Once every thread holds them, `rank_check: pid P: ready` is printed.
 *
 * --oom: allocates until cudaMalloc fails, which must be cudaErrorMemoryAllocation and leave
 * the process working; frees everything, allocates again, and runs one round of the checks.
 * --fork: the main thread forks while it holds a pin and a mapping (the --threads threads run
 * the default loop beside it). The child must get EINVAL from every gdr call on the parent's
 * gdr_t and handle (gdrapi.h: handles do not carry across fork), its own gdr_open must give a
 * gdr_t that only closes, and a store through the parent's mapping must fault there (the mapping
 * is MADV_DONTFORK). The parent's bytes must be unchanged afterwards and its copies must work.
 *
 * Every CUDA and gdr return code is checked; a failure prints a line saying which call, with what
 * error, and counts. Ends with one line
 *   rank_check: pid P: N checks, F failures, first cudaMalloc X us, ...
 * and, with --report FILE, the same figures as one JSON object. Exit status: 0 when every check
 * passed, 1 on any failure, 2 on a usage error.
 *
 * Build: cc -O2 rank_check.c -I$CUDA_HOME/include -I/usr/local/include -L/usr/local/lib -lgdrapi
 *        -L$CUDA_HOME/lib64 -lcudart -L$CUDA_HOME/lib64/stubs -lcuda -lpthread -ldl
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <gdrapi.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)
/* Host bytes after a copy's length that must keep their poison (a copy that writes past its
 * length shows there). */
#define GUARD 64
#define POISON 0xEE
/* Failure lines printed per process; the count goes on past it. */
#define MAX_MESSAGES 20

enum mode { MODE_LOOP, MODE_OOM, MODE_FORK };

static struct {
    double seconds; /* 0: no time limit */
    long iterations; /* 0: no round limit */
    int threads;
    size_t max_size;
    uint64_t seed;
    const char *report;
    int hold;
    enum mode mode;
} opt = {0, 0, 1, 4 * MiB, 0, NULL, 0, MODE_LOOP};

static gdr_t g;
static double deadline; /* CLOCK_MONOTONIC seconds; 0 when --seconds was not given */
static pthread_barrier_t ready_barrier;
static atomic_long n_checks, n_failures, n_rounds;
static atomic_int n_messages;
static pid_t self;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Counts a failure and prints it (the first MAX_MESSAGES of the process). */
static void vfailf(const char *fmt, va_list ap) {
    atomic_fetch_add(&n_failures, 1);
    int k = atomic_fetch_add(&n_messages, 1);
    if (k > MAX_MESSAGES)
        return;
    if (k == MAX_MESSAGES) {
        fprintf(stderr, "rank_check: pid %d: further failures are counted, not shown\n", self);
        return;
    }
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    fprintf(stderr, "rank_check: pid %d: FAIL %s\n", self, line);
}

static void failf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfailf(fmt, ap);
    va_end(ap);
}

/* A check: counted, and a failure when cond is false. Returns cond. */
static int check(int cond, const char *fmt, ...) {
    atomic_fetch_add(&n_checks, 1);
    if (!cond) {
        va_list ap;
        va_start(ap, fmt);
        vfailf(fmt, ap);
        va_end(ap);
    }
    return cond;
}

/* API calls: an error is a failure (not a check) with the call's text and the error's name. */
static int rt_ok(cudaError_t e, const char *call, int line) {
    if (e == cudaSuccess)
        return 1;
    failf("%s = %s (%s), line %d", call, cudaGetErrorName(e), cudaGetErrorString(e), line);
    return 0;
}
static int drv_ok(CUresult r, const char *call, int line) {
    if (r == CUDA_SUCCESS)
        return 1;
    const char *name = "?";
    if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = "unknown CUresult";
    failf("%s = %s (%d), line %d", call, name, (int)r, line);
    return 0;
}
static int gdr_rc_ok(int rc, const char *call, int line) {
    if (rc == 0)
        return 1;
    /* ENOTSUP from a pin: this memory is not the allocator's (not run under `gdr run`?). */
    failf("%s = %d (%s)%s, line %d", call, rc, strerror(rc),
          rc == ENOTSUP ? " (cudaMalloc memory not from gdr's allocator: run under `gdr run`)"
                        : "",
          line);
    return 0;
}
#define RT(call) rt_ok((call), #call, __LINE__)
#define DRV(call) drv_ok((call), #call, __LINE__)
#define GDR(call) gdr_rc_ok((call), #call, __LINE__)

/* ---- random numbers: xorshift64*, one state per thread ---- */

static uint64_t next_u64(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static uint64_t seed_state(uint64_t seed, uint64_t stream) {
    /* splitmix64 of (seed, stream): distinct, never-zero states for the threads. */
    uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (stream + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z ? z : 1;
}

/* 0 .. n-1 (n > 0). */
static size_t below(uint64_t *s, size_t n) {
    return (size_t)(next_u64(s) % n);
}

/* 1 .. max, log-uniform: a power of two up to max is picked uniformly, then a size up to it. */
static size_t random_size(uint64_t *s, size_t max) {
    int bits = 0;
    while (bits < 62 && ((size_t)1 << (bits + 1)) <= max)
        bits++;
    size_t top = (size_t)1 << below(s, (size_t)bits + 1);
    if (top > max)
        top = max;
    return 1 + below(s, top);
}

/* Fresh bytes: each draw gives the next 8. */
static void fill_random(uint64_t *s, unsigned char *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % 8 == 0)
            v = next_u64(s);
        p[i] = (unsigned char)(v >> (8 * (i % 8)));
    }
}

/* Index of the first byte where a and b differ, or -1. */
static long first_difference(const unsigned char *a, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return (long)i;
    return -1;
}

/* Index of the first byte not equal to v, or -1. */
static long first_not(const unsigned char *a, unsigned char v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != v)
            return (long)i;
    return -1;
}

/* ---- one thread's state ---- */

struct worker {
    int id;
    uint64_t rng;
    cudaStream_t stream;       /* the thread's own, so its fills wait for nobody else's work */
    unsigned char *src, *got;  /* max_size bytes each */
    unsigned char *out;        /* max_size + GUARD */
    pthread_t thread;
};

/* A buffer inside a cudaMalloc allocation, pinned and mapped as gdrcopy's users do it. */
struct pinned {
    void *alloc;           /* the allocation */
    int driver;            /* made with cuMemAlloc (else cudaMalloc) */
    size_t alloc_size;
    size_t off, len;       /* the buffer: [alloc + off, alloc + off + len) */
    unsigned char fill;    /* the byte the rest of the allocation holds */
    gdr_mh_t mh;
    gdr_info_v2_t info;
    void *map;             /* gdr_map's address, info.mapped_size bytes */
    unsigned char *user;   /* the buffer's first byte in the mapping */
    int is_pinned, is_mapped;
};

static int workers_init(struct worker *w, int id) {
    memset(w, 0, sizeof *w);
    w->id = id;
    w->rng = seed_state(opt.seed, (uint64_t)id);
    w->src = malloc(opt.max_size);
    w->got = malloc(opt.max_size);
    w->out = malloc(opt.max_size + GUARD);
    if (!w->src || !w->got || !w->out) {
        failf("thread %d: malloc of host buffers (%zu bytes) failed", id, opt.max_size);
        return 0;
    }
    return RT(cudaStreamCreateWithFlags(&w->stream, cudaStreamNonBlocking));
}

static void workers_fini(struct worker *w) {
    if (w->stream)
        RT(cudaStreamDestroy(w->stream));
    free(w->src);
    free(w->got);
    free(w->out);
}

/* Releases whatever of p exists, in gdrcopy's order. */
static void release(struct pinned *p) {
    if (p->is_mapped)
        GDR(gdr_unmap(g, p->mh, p->map, p->info.mapped_size));
    if (p->is_pinned)
        GDR(gdr_unpin_buffer(g, p->mh));
    if (p->alloc && p->driver)
        DRV(cuMemFree((CUdeviceptr)(uintptr_t)p->alloc));
    else if (p->alloc)
        RT(cudaFree(p->alloc));
    memset(p, 0, sizeof *p);
}

/* Allocates alloc_size bytes (cudaMalloc, or cuMemAlloc every other time at random: programs
 * reach the allocator through both), fills them, pins and maps [off, off + len) as gdrcopy
 * requires. 1 on success; on failure everything made is released again. */
static int acquire(struct worker *w, size_t alloc_size, size_t off, size_t len, struct pinned *p) {
    memset(p, 0, sizeof *p);
    p->alloc_size = alloc_size;
    p->off = off;
    p->len = len;
    uint64_t r = next_u64(&w->rng);
    p->fill = (unsigned char)r;
    p->driver = (int)((r >> 8) & 1);
    if (p->driver) {
        CUdeviceptr d = 0;
        if (!DRV(cuMemAlloc(&d, alloc_size)))
            return 0;
        p->alloc = (void *)(uintptr_t)d;
    } else if (!RT(cudaMalloc(&p->alloc, alloc_size))) {
        p->alloc = NULL;
        return 0;
    }
    /* The fill runs on the thread's stream; the CPU writes through the mapping only after it. */
    if (!RT(cudaMemsetAsync(p->alloc, p->fill, alloc_size, w->stream)) ||
        !RT(cudaStreamSynchronize(w->stream)))
        goto fail;
    unsigned long dptr = (unsigned long)(uintptr_t)p->alloc + off;
    /* gdrcopy requires SYNC_MEMOPS on memory it maps: a synchronous cudaMemcpy to the device
     * must have landed when it returns, before the CPU reads the mapping. On allocator memory
     * the library turns it into the context's CU_CTX_SYNC_MEMOPS (docs/alloc.md). */
    unsigned int one = 1;
    if (!DRV(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, (CUdeviceptr)dptr)))
        goto fail;
    /* gdr_map maps only a pin that starts on a GPU page: pin the 64 KiB pages around the
     * buffer, as UCX and NCCL do (under the allocator they lie inside its chunk). */
    unsigned long start = dptr & GPU_PAGE_MASK;
    unsigned long end = (dptr + len + GPU_PAGE_OFFSET) & GPU_PAGE_MASK;
    if (!GDR(gdr_pin_buffer(g, start, end - start, 0, 0, &p->mh)))
        goto fail;
    p->is_pinned = 1;
    if (!GDR(gdr_get_info_v2(g, p->mh, &p->info)))
        goto fail;
    /* gdrapi.h: va and mapped_size are the pinned range rounded out to page_size. */
    if (!check(p->info.va == start && p->info.va + p->info.mapped_size >= end &&
                   p->info.page_size == GPU_PAGE_SIZE,
               "gdr_get_info_v2 of the pin [%#lx, %#lx): va %#" PRIx64 " mapped_size %" PRIu64
               " page_size %u",
               start, end, p->info.va, p->info.mapped_size, p->info.page_size))
        goto fail;
    if (!GDR(gdr_map(g, p->mh, &p->map, p->info.mapped_size)))
        goto fail;
    p->is_mapped = 1;
    /* gdrapi.h: the byte at GPU address dptr is at map + (dptr - info.va). */
    p->user = (unsigned char *)p->map + (dptr - p->info.va);
    return 1;
fail:
    release(p);
    return 0;
}

/* CPU -> GPU: random bytes through the mapping; the whole allocation read back with cudaMemcpy
 * shows them in the buffer and the fill everywhere else. */
static void check_to_gpu(struct worker *w, struct pinned *p, const char *what) {
    fill_random(&w->rng, w->src, p->len);
    if (!GDR(gdr_copy_to_mapping(p->mh, p->user, w->src, p->len)))
        return;
    if (!RT(cudaMemcpy(w->got, p->alloc, p->alloc_size, cudaMemcpyDeviceToHost)))
        return;
    long d = first_difference(w->got + p->off, w->src, p->len);
    long before = first_not(w->got, p->fill, p->off);
    size_t tail = p->off + p->len;
    long after = first_not(w->got + tail, p->fill, p->alloc_size - tail);
    check(d < 0 && before < 0 && after < 0,
          "%s: gdr_copy_to_mapping of %zu bytes at offset %zu of %zu: first wrong byte inside "
          "%ld, before %ld, after %ld (-1: none)",
          what, p->len, p->off, p->alloc_size, d, before, after < 0 ? -1 : (long)tail + after);
}

/* GPU -> CPU: random bytes written with cudaMemcpy; the mapping read into a poisoned buffer
 * gives them, and the poison past the length stays. */
static void check_from_gpu(struct worker *w, struct pinned *p, const char *what) {
    fill_random(&w->rng, w->src, p->len);
    if (!RT(cudaMemcpy((char *)p->alloc + p->off, w->src, p->len, cudaMemcpyHostToDevice)))
        return;
    memset(w->out, POISON, p->len + GUARD);
    if (!GDR(gdr_copy_from_mapping(p->mh, w->out, p->user, p->len)))
        return;
    long d = first_difference(w->out, w->src, p->len);
    long guard = first_not(w->out + p->len, POISON, GUARD);
    check(d < 0 && guard < 0,
          "%s: gdr_copy_from_mapping of %zu bytes at offset %zu of %zu: first wrong byte %ld, "
          "first overwritten guard byte %ld (-1: none)",
          what, p->len, p->off, p->alloc_size, d, guard);
}

/* A random allocation, offset and length, as the loop uses them. */
static void random_shape(struct worker *w, size_t *alloc_size, size_t *off, size_t *len) {
    *alloc_size = random_size(&w->rng, opt.max_size);
    *off = below(&w->rng, *alloc_size);
    *len = 1 + below(&w->rng, *alloc_size - *off);
}

static void one_round(struct worker *w) {
    size_t alloc_size, off, len;
    random_shape(w, &alloc_size, &off, &len);
    struct pinned p;
    if (acquire(w, alloc_size, off, len, &p)) {
        check_to_gpu(w, &p, "round");
        check_from_gpu(w, &p, "round");
        release(&p);
    }
    atomic_fetch_add(&n_rounds, 1);
}

static int go_on(long rounds_done) {
    if (opt.iterations && rounds_done >= opt.iterations)
        return 0;
    return !deadline || now_s() < deadline;
}

/* ---- held buffers (--hold) ---- */

struct held {
    struct pinned p;
    unsigned char *bytes; /* what the buffer must hold */
};

static void hold_start(struct worker *w, struct held *h) {
    size_t alloc_size, off, len;
    h->bytes = NULL;
    random_shape(w, &alloc_size, &off, &len);
    if (!acquire(w, alloc_size, off, len, &h->p))
        return;
    h->bytes = malloc(len);
    if (!h->bytes) {
        failf("thread %d: malloc(%zu) for a held buffer failed", w->id, len);
        release(&h->p);
        return;
    }
    fill_random(&w->rng, h->bytes, len);
    if (!GDR(gdr_copy_to_mapping(h->p.mh, h->p.user, h->bytes, len))) {
        free(h->bytes);
        h->bytes = NULL;
        release(&h->p);
    }
}

/* Its bytes, through the mapping and through cudaMemcpy, then released. */
static void hold_end(struct worker *w, struct held *h) {
    if (!h->bytes)
        return;
    struct pinned *p = &h->p;
    memset(w->out, POISON, p->len + GUARD);
    if (GDR(gdr_copy_from_mapping(p->mh, w->out, p->user, p->len)))
        check(first_difference(w->out, h->bytes, p->len) < 0,
              "held buffer (%zu bytes at offset %zu): the mapping no longer shows its bytes",
              p->len, p->off);
    if (RT(cudaMemcpy(w->got, (char *)p->alloc + p->off, p->len, cudaMemcpyDeviceToHost)))
        check(first_difference(w->got, h->bytes, p->len) < 0,
              "held buffer (%zu bytes at offset %zu): cudaMemcpy no longer shows its bytes",
              p->len, p->off);
    free(h->bytes);
    release(p);
}

static void *loop_thread(void *arg) {
    struct worker *w = arg;
    /* The primary context current in this thread before its first driver call (cuMemAlloc). */
    if (!RT(cudaSetDevice(0))) {
        pthread_barrier_wait(&ready_barrier);
        return NULL;
    }
    struct held *holds = calloc((size_t)(opt.hold ? opt.hold : 1), sizeof *holds);
    if (!holds)
        failf("thread %d: calloc of %d held buffers failed", w->id, opt.hold);
    for (int i = 0; holds && i < opt.hold; i++)
        hold_start(w, &holds[i]);
    /* Every thread holds its buffers before `ready` is printed. */
    pthread_barrier_wait(&ready_barrier);
    for (long r = 0; go_on(r); r++)
        one_round(w);
    for (int i = 0; holds && i < opt.hold; i++)
        hold_end(w, &holds[i]);
    free(holds);
    return NULL;
}

/* ---- --oom ---- */

static void oom_case(struct worker *w) {
    enum { MAX_BLOCKS = 8192 };
    static void *blocks[MAX_BLOCKS];
    int n = 0, big = 0;
    size_t free0 = 0, free_full = 0, free_after = 0, total = 0;
    if (!RT(cudaMemGetInfo(&free0, &total)))
        return;
    /* Large blocks first, then smaller ones, so that the device is really full when the
     * smallest size fails. */
    size_t size = GiB;
    cudaError_t last = cudaSuccess;
    while (n < MAX_BLOCKS) {
        last = cudaMalloc(&blocks[n], size);
        if (last == cudaSuccess) {
            if (size == GiB)
                big++;
            n++;
            continue;
        }
        if (last != cudaErrorMemoryAllocation || size <= 2 * MiB)
            break;
        size /= 4;
    }
    if (!check(last == cudaErrorMemoryAllocation,
               "oom: cudaMalloc(%zu) after %d blocks gave %s (%s), want "
               "cudaErrorMemoryAllocation",
               size, n, cudaGetErrorName(last), cudaGetErrorString(last)))
        goto free_all;
    /* Not sticky: the next error query clears it and the context still works. */
    cudaError_t again = cudaGetLastError();
    cudaError_t after = cudaGetLastError();
    check(again == cudaErrorMemoryAllocation && after == cudaSuccess,
          "oom: cudaGetLastError gave %s then %s, want cudaErrorMemoryAllocation then "
          "cudaSuccess",
          cudaGetErrorName(again), cudaGetErrorName(after));
    cudaError_t sync = cudaDeviceSynchronize();
    check(sync == cudaSuccess, "oom: cudaDeviceSynchronize after the failed cudaMalloc gave %s",
          cudaGetErrorName(sync));
    RT(cudaMemGetInfo(&free_full, &total));
    /* Reported, not checked: whether a pin of memory already allocated works with the device
     * full (a pin imports the allocator's chunk into Vulkan). */
    if (n > 0) {
        gdr_mh_t mh;
        unsigned long a = (unsigned long)(uintptr_t)blocks[n - 1] & GPU_PAGE_MASK;
        int rc = gdr_pin_buffer(g, a, GPU_PAGE_SIZE, 0, 0, &mh);
        printf("rank_check: pid %d: oom: a pin of 64 KiB with the device full: rc %d (%s)\n", self,
               rc, rc ? strerror(rc) : "pinned");
        if (rc == 0)
            GDR(gdr_unpin_buffer(g, mh));
    }
free_all:
    for (int i = 0; i < n; i++)
        RT(cudaFree(blocks[i]));
    RT(cudaMemGetInfo(&free_after, &total));
    printf("rank_check: pid %d: oom: %d blocks (%d of 1 GiB) until cudaMalloc(%zu) failed; "
           "free device memory %zu MiB at start, %zu MiB when full, %zu MiB after the frees "
           "(of %zu MiB)\n",
           self, n, big, size, free0 / MiB, free_full / MiB, free_after / MiB, total / MiB);
    /* Allocation works again: half the large blocks, then a round of the checks. */
    int m = 0;
    cudaError_t e = cudaSuccess;
    while (m < big / 2 && (e = cudaMalloc(&blocks[m], GiB)) == cudaSuccess)
        m++;
    check(e == cudaSuccess, "oom: after the frees, cudaMalloc(1 GiB) number %d of %d gave %s", m + 1,
          big / 2, cudaGetErrorName(e));
    for (int i = 0; i < m; i++)
        RT(cudaFree(blocks[i]));
    one_round(w);
}

/* ---- --fork ---- */

/* What the child found: bit i set when call i did not give what it should. */
enum {
    C_COPY_TO,
    C_COPY_FROM,
    C_COPY_FROM_WROTE,
    C_PIN,
    C_INFO,
    C_MAP,
    C_UNMAP,
    C_UNPIN,
    C_CLOSE,
    C_OPEN,
    C_OPEN_PIN,
    C_OPEN_CLOSE,
    C_COUNT
};
static const char *const child_call[C_COUNT] = {
    "gdr_copy_to_mapping on the parent's handle (want EINVAL)",
    "gdr_copy_from_mapping on the parent's handle (want EINVAL)",
    "gdr_copy_from_mapping wrote the child's buffer",
    "gdr_pin_buffer on the parent's gdr_t (want EINVAL)",
    "gdr_get_info_v2 (want EINVAL)",
    "gdr_map (want EINVAL)",
    "gdr_unmap (want EINVAL)",
    "gdr_unpin_buffer (want EINVAL)",
    "gdr_close of the parent's gdr_t (want EINVAL)",
    "gdr_open in the child (want a gdr_t)",
    "gdr_pin_buffer on the child's own gdr_t (want EINVAL)",
    "gdr_close of the child's own gdr_t (want 0)",
};

/* The child: no CUDA, no stdio (another thread of the parent may have held their locks at the
 * fork); the result goes to the parent through fd, then a store through the parent's mapping,
 * which must fault. */
static void fork_child(struct pinned *p, unsigned char *scratch, int fd) {
    uint32_t bad = 0;
    gdr_mh_t mh2 = {0};
    gdr_info_v2_t inf;
    void *va = NULL;
    size_t n = p->len < 4096 ? p->len : 4096;
    memset(scratch, 0x5A, n);
    if (gdr_copy_to_mapping(p->mh, p->user, scratch, n) != EINVAL)
        bad |= 1u << C_COPY_TO;
    memset(scratch, POISON, n);
    if (gdr_copy_from_mapping(p->mh, scratch, p->user, n) != EINVAL)
        bad |= 1u << C_COPY_FROM;
    if (first_not(scratch, POISON, n) >= 0)
        bad |= 1u << C_COPY_FROM_WROTE;
    if (gdr_pin_buffer(g, p->info.va, GPU_PAGE_SIZE, 0, 0, &mh2) != EINVAL)
        bad |= 1u << C_PIN;
    if (gdr_get_info_v2(g, p->mh, &inf) != EINVAL)
        bad |= 1u << C_INFO;
    if (gdr_map(g, p->mh, &va, p->info.mapped_size) != EINVAL)
        bad |= 1u << C_MAP;
    if (gdr_unmap(g, p->mh, p->map, p->info.mapped_size) != EINVAL)
        bad |= 1u << C_UNMAP;
    if (gdr_unpin_buffer(g, p->mh) != EINVAL)
        bad |= 1u << C_UNPIN;
    if (gdr_close(g) != EINVAL)
        bad |= 1u << C_CLOSE;
    gdr_t gc = gdr_open();
    if (!gc) {
        bad |= 1u << C_OPEN;
    } else {
        if (gdr_pin_buffer(gc, p->info.va, GPU_PAGE_SIZE, 0, 0, &mh2) != EINVAL)
            bad |= 1u << C_OPEN_PIN;
        if (gdr_close(gc) != 0)
            bad |= 1u << C_OPEN_CLOSE;
    }
    if (write(fd, &bad, sizeof bad) != (ssize_t)sizeof bad)
        _exit(3);
    close(fd);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    *(volatile unsigned char *)p->user = 0x5A;
    _exit(42);
}

/* Waits up to `seconds` for the child; kills it after that. 1 when it ended by itself. */
static int reap(pid_t pid, int seconds, int *status) {
    double end = now_s() + seconds;
    while (now_s() < end) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 1;
        if (r < 0 && errno != EINTR)
            return 0;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

static void fork_round(struct worker *w) {
    size_t alloc_size, off, len;
    random_shape(w, &alloc_size, &off, &len);
    struct pinned p;
    if (!acquire(w, alloc_size, off, len, &p))
        return;
    unsigned char *want = malloc(len);
    int fds[2] = {-1, -1};
    if (!want) {
        failf("fork: malloc(%zu) failed", len);
        goto out;
    }
    fill_random(&w->rng, want, len);
    if (!GDR(gdr_copy_to_mapping(p.mh, p.user, want, len)))
        goto out;
    if (pipe(fds) != 0) {
        failf("fork: pipe: %s", strerror(errno));
        goto out;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        failf("fork: fork: %s", strerror(errno));
        goto out;
    }
    if (pid == 0) {
        close(fds[0]);
        fork_child(&p, w->out, fds[1]);
    }
    close(fds[1]);
    fds[1] = -1;
    uint32_t bad = 0;
    struct pollfd pf = {fds[0], POLLIN, 0};
    int got = poll(&pf, 1, 60000) == 1 && read(fds[0], &bad, sizeof bad) == (ssize_t)sizeof bad;
    int status = 0;
    int ended = reap(pid, 60, &status);
    if (check(got, "fork: the child sent no result (it died or hung before reporting)")) {
        for (int i = 0; i < C_COUNT; i++)
            check(!(bad & (1u << i)), "fork: child: %s", child_call[i]);
    }
    check(ended && WIFSIGNALED(status) &&
              (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS),
          "fork: the child's store through the parent's mapping did not fault (%s, status %#x)",
          ended ? "ended" : "hung and was killed", status);
    /* The parent: the bytes it wrote before the fork, through the mapping and through CUDA,
     * then both directions again. */
    memset(w->out, POISON, len + GUARD);
    if (GDR(gdr_copy_from_mapping(p.mh, w->out, p.user, len)))
        check(first_difference(w->out, want, len) < 0,
              "fork: the parent's mapping changed across the child's life");
    if (RT(cudaMemcpy(w->got, (char *)p.alloc + off, len, cudaMemcpyDeviceToHost)))
        check(first_difference(w->got, want, len) < 0,
              "fork: the parent's GPU bytes changed across the child's life");
    check_to_gpu(w, &p, "fork: parent after the child");
    check_from_gpu(w, &p, "fork: parent after the child");
out:
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    free(want);
    release(&p);
    atomic_fetch_add(&n_rounds, 1);
}

/* ---- options, report, main ---- */

static void usage(FILE *f) {
    fprintf(f,
            "usage: rank_check [--seconds S | --iterations N] [--threads T] [--max-size BYTES]\n"
            "                  [--seed S] [--hold N] [--report FILE] [--oom | --fork]\n"
            "  BYTES takes K, M, G suffixes; without --seconds and --iterations: --seconds 10\n");
}

/* A whole number with an optional K/M/G suffix, within [lo, hi]; 0 when it is not. */
static int parse_size(const char *s, unsigned long long lo, unsigned long long hi,
                      unsigned long long *v) {
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-')
        return 0;
    int shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (shift)
        end++;
    if (*end || x > (hi >> shift))
        return 0;
    x <<= shift;
    if (x < lo)
        return 0;
    *v = x;
    return 1;
}

/* The range of each option that takes a whole number; 0 for the others. */
static int whole_number_bounds(int c, unsigned long long *lo, unsigned long long *hi) {
    static const struct {
        int c;
        unsigned long long lo, hi;
    } ranges[] = {{'n', 1, 1ULL << 40}, {'t', 1, 256}, {'m', 1, GiB}, {'S', 0, UINT64_MAX},
                  {'H', 0, 64}};
    for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++)
        if (ranges[i].c == c) {
            *lo = ranges[i].lo;
            *hi = ranges[i].hi;
            return 1;
        }
    return 0;
}

static void parse_args(int argc, char **argv) {
    static const struct option longs[] = {
        {"seconds", required_argument, 0, 's'}, {"iterations", required_argument, 0, 'n'},
        {"threads", required_argument, 0, 't'}, {"max-size", required_argument, 0, 'm'},
        {"seed", required_argument, 0, 'S'},    {"report", required_argument, 0, 'r'},
        {"hold", required_argument, 0, 'H'},    {"oom", no_argument, 0, 'O'},
        {"fork", no_argument, 0, 'F'},          {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c, idx = 0;
    unsigned long long v = 0, lo, hi;
    /* A fresh seed per run unless --seed repeats one; it is printed. */
    opt.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    while ((c = getopt_long(argc, argv, "", longs, &idx)) != -1) {
        if (whole_number_bounds(c, &lo, &hi) && !parse_size(optarg, lo, hi, &v))
            goto bad;
        switch (c) {
        case 's': {
            char *end = NULL;
            opt.seconds = strtod(optarg, &end);
            if (end == optarg || *end || !(opt.seconds > 0 && opt.seconds <= 86400))
                goto bad;
            break;
        }
        case 'n':
            opt.iterations = (long)v;
            break;
        case 't':
            opt.threads = (int)v;
            break;
        case 'm':
            opt.max_size = (size_t)v;
            break;
        case 'S':
            opt.seed = v;
            break;
        case 'H':
            opt.hold = (int)v;
            break;
        case 'r':
            opt.report = optarg;
            break;
        case 'O':
        case 'F':
            opt.mode = c == 'O' ? MODE_OOM : MODE_FORK;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind != argc) {
        fprintf(stderr, "rank_check: unexpected argument %s\n", argv[optind]);
        usage(stderr);
        exit(2);
    }
    if (!opt.seconds && !opt.iterations)
        opt.seconds = 10;
    return;
bad:
    fprintf(stderr, "rank_check: bad value for --%s: %s\n", longs[idx].name, optarg);
    usage(stderr);
    exit(2);
}

static const char *mode_name(void) {
    return opt.mode == MODE_OOM ? "oom" : opt.mode == MODE_FORK ? "fork" : "loop";
}

static int write_report(double context_us, double first_us, double open_us, double run_s,
                        int allocator) {
    FILE *f = fopen(opt.report, "w");
    if (!f) {
        fprintf(stderr, "rank_check: pid %d: cannot write --report %s: %s\n", self, opt.report,
                strerror(errno));
        return 0;
    }
    fprintf(f,
            "{\"pid\": %d, \"mode\": \"%s\", \"checks\": %ld, \"failures\": %ld, "
            "\"rounds\": %ld, \"threads\": %d, \"hold\": %d, \"max_size\": %zu, "
            "\"seed\": %" PRIu64 ", \"seconds\": %.3f, \"context_us\": %.1f, "
            "\"first_malloc_us\": %.1f, \"gdr_open_us\": %.1f, \"allocator\": %s}\n",
            self, mode_name(), atomic_load(&n_checks), atomic_load(&n_failures),
            atomic_load(&n_rounds), opt.threads, opt.hold, opt.max_size, opt.seed, run_s,
            context_us, first_us, open_us, allocator ? "true" : "false");
    if (fclose(f) != 0) {
        fprintf(stderr, "rank_check: pid %d: writing --report %s: %s\n", self, opt.report,
                strerror(errno));
        return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    self = getpid();
    parse_args(argc, argv);
    /* A hung call must not hang the scripts: SIGALRM ends the process well after its time. */
    if (opt.seconds)
        alarm((unsigned)opt.seconds + 300);
    /* Whether gdr's allocator is in the process (it exports its C ABI). */
    int allocator = dlsym(RTLD_DEFAULT, "gdr_alloc_get_stats") != NULL;
    double t0 = now_s();
    int setup = RT(cudaSetDevice(0)) && RT(cudaFree(0));
    double t1 = now_s();
    /* The allocator's first-allocation cost (issue 41): the first cudaMalloc after the
     * context exists, as alloc_bench measures it. */
    void *first = NULL;
    setup = setup && RT(cudaMalloc(&first, 4096));
    double t2 = now_s();
    if (setup)
        setup = RT(cudaFree(first));
    double t3 = now_s();
    if (setup) {
        g = gdr_open();
        if (!g) {
            failf("gdr_open returned NULL (set GDRCOPY_ENABLE_LOGGING=1 for why)");
            setup = 0;
        }
    }
    double t4 = now_s();
    double context_us = (t1 - t0) * 1e6, first_us = (t2 - t1) * 1e6, open_us = (t4 - t3) * 1e6;
    if (!allocator)
        fprintf(stderr, "rank_check: pid %d: gdr's allocator is not loaded: pins of cudaMalloc "
                        "memory need `gdr run` where gdrdrv is absent\n",
                self);

    int n_workers = opt.mode == MODE_LOOP ? opt.threads : opt.mode == MODE_FORK ? opt.threads + 1 : 1;
    struct worker *workers = calloc((size_t)n_workers, sizeof *workers);
    int started = 0;
    if (setup && !workers) {
        failf("calloc of %d workers failed", n_workers);
        setup = 0;
    }
    for (int i = 0; setup && i < n_workers; i++)
        setup = workers_init(&workers[i], i);
    double run_start = now_s();
    if (opt.seconds)
        deadline = run_start + opt.seconds;
    if (setup && opt.mode == MODE_OOM) {
        oom_case(&workers[0]);
    } else if (setup) {
        /* The loop threads (in --fork mode, workers[0] is the main thread's). */
        int first_loop = opt.mode == MODE_FORK ? 1 : 0;
        int n_loops = n_workers - first_loop;
        int rc = pthread_barrier_init(&ready_barrier, NULL, (unsigned)n_loops + 1);
        if (rc) {
            failf("pthread_barrier_init: %s", strerror(rc));
        } else {
            for (int i = first_loop; i < n_workers; i++) {
                rc = pthread_create(&workers[i].thread, NULL, loop_thread, &workers[i]);
                if (rc) {
                    /* The barrier counts every thread: without this one it cannot open. */
                    fprintf(stderr, "rank_check: pid %d: pthread_create: %s\n", self, strerror(rc));
                    exit(1);
                }
                started++;
            }
            pthread_barrier_wait(&ready_barrier);
            printf("rank_check: pid %d: ready\n", self);
            fflush(stdout);
            if (opt.mode == MODE_FORK) {
                for (long r = 0; go_on(r); r++)
                    fork_round(&workers[0]);
            }
            for (int i = first_loop; i < first_loop + started; i++) {
                rc = pthread_join(workers[i].thread, NULL);
                if (rc)
                    failf("pthread_join: %s", strerror(rc));
            }
            pthread_barrier_destroy(&ready_barrier);
        }
    }
    double run_s = now_s() - run_start;
    for (int i = 0; workers && i < n_workers; i++)
        workers_fini(&workers[i]);
    free(workers);
    if (g && !GDR(gdr_close(g)))
        g = NULL;
    /* A run that checked nothing has shown nothing. */
    if (atomic_load(&n_checks) == 0 && atomic_load(&n_failures) == 0)
        failf("no check ran");
    printf("rank_check: pid %d: %ld checks, %ld failures, first cudaMalloc %.0f us, context "
           "%.0f us, gdr_open %.0f us, %ld rounds, %d threads, %s mode, %.1f s, seed %" PRIu64
           ", allocator %s\n",
           self, atomic_load(&n_checks), atomic_load(&n_failures), first_us, context_us, open_us,
           atomic_load(&n_rounds), opt.threads, mode_name(), run_s, opt.seed,
           allocator ? "yes" : "no");
    fflush(stdout);
    int report_ok = !opt.report || write_report(context_us, first_us, open_us, run_s, allocator);
    return atomic_load(&n_failures) == 0 && report_ok ? 0 : 1;
}
