/*
 * gdrcopy's semantics, checked against gdr's libgdrapi the way gdrcopy's own `sanity` test
 * checks gdrcopy's: every order of pin/map/unmap/unpin, two pins of one buffer, threads on one
 * gdr_t, unaligned small pins, gdr_close releasing everything, memory freed while pinned,
 * fork, FORCE_PCIE, refusals, info and versions. What is expected is what gdrapi.h's top
 * comment documents; where the active backend matters (GDR_ATTR_GDR_BACKEND) the expectation
 * follows it.
 *
 * Data is fresh random bytes (seed printed; SEMANTICS_SEED=N repeats a run), output buffers are
 * poisoned (0xee) before every read, and every transfer is checked byte for byte both through
 * the mapping and through the GPU (cuMemcpyDtoH / cuMemcpyHtoD). libcuda.so.1 is opened with
 * dlopen (no CUDA headers needed).
 *
 * Output: "ok <case>" or "FAIL <case>" per case, then "semantics: N passed, M failed".
 * Arguments, if any, name the cases to run. Without a usable GPU: "semantics: skipped: no GPU"
 * and exit 0 (exit 1 with GDR_REQUIRE_GPU=1). Exit 1 when any check failed. A watchdog ends the
 * run after SEMANTICS_TIMEOUT_S seconds (default 540).
 *
 * Build: gcc -std=c99 -O2 -Wall -Wextra -Werror -pthread -I crates/gdr-capi/include \
 *            crates/gdr-capi/tests/c/semantics.c -o semantics -lgdrapi -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gdrapi.h"

/* ---- checks ---- */

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static int failures = 0;
static const char *cur_case = "setup";

static int failure_count(void) {
    pthread_mutex_lock(&fail_mu);
    int n = failures;
    pthread_mutex_unlock(&fail_mu);
    return n;
}

static void fail_vat(const char *file, int line, const char *fmt, va_list ap) {
    pthread_mutex_lock(&fail_mu);
    failures++;
    fprintf(stderr, "FAIL %s:%d [%s]: ", file, line, cur_case);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    pthread_mutex_unlock(&fail_mu);
}

/* Records a failure; returns 0. */
static int fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_vat(file, line, fmt, ap);
    va_end(ap);
    return 0;
}

/* CHECK(cond, fmt, ...): a failure, with its message, when cond is false; evaluates to cond. */
#define CHECK(cond, ...) ((cond) ? 1 : fail_at(__FILE__, __LINE__, __VA_ARGS__))

static const char *errname(int rc) {
    switch (rc) {
    case 0: return "0";
    case EINVAL: return "EINVAL";
    case EAGAIN: return "EAGAIN";
    case ENOTSUP: return "ENOTSUP";
    case ENOMEM: return "ENOMEM";
    case EIO: return "EIO";
    case EBUSY: return "EBUSY";
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case EFAULT: return "EFAULT";
    default: return "?";
    }
}

static int expect_rc_at(const char *file, int line, const char *call, int rc, int want) {
    if (rc == want)
        return 1;
    fail_at(file, line, "%s returned %d (%s), expected %d (%s)", call, rc, errname(rc), want,
            errname(want));
    return 0;
}

/* EXPECT_RC(call, want): 1 when call returned want, else a failure naming the call. */
#define EXPECT_RC(call, want) expect_rc_at(__FILE__, __LINE__, #call, (call), (want))

static int cu_ok_at(const char *file, int line, const char *call, int rc) {
    if (rc == 0)
        return 1;
    fail_at(file, line, "%s returned CUresult %d", call, rc);
    return 0;
}

/* CU_OK(call): 1 when the CUDA driver call returned CUDA_SUCCESS, else a failure. */
#define CU_OK(call) cu_ok_at(__FILE__, __LINE__, #call, (call))

static int same_bytes_at(const char *file, int line, const void *got, const void *want, size_t n,
                         const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int same_bytes_at(const char *file, int line, const void *got, const void *want, size_t n,
                         const char *fmt, ...) {
    const unsigned char *g = got, *w = want;
    size_t first = n, count = 0;
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i]) {
            if (first == n)
                first = i;
            count++;
        }
    if (count == 0)
        return 1;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fail_at(file, line, "%s: %zu of %zu bytes differ, first at offset %zu: got %#x, want %#x",
            what, count, n, first, g[first], w[first]);
    return 0;
}

/* SAME_BYTES(got, want, n, fmt, ...): 1 when the n bytes are equal, else a failure that says
 * how many differ and where the first is. */
#define SAME_BYTES(got, want, n, ...) same_bytes_at(__FILE__, __LINE__, got, want, n, __VA_ARGS__)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "semantics: out of host memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- random data ---- */

struct rng {
    uint64_t s;
};

static uint64_t seed0;

static void rng_seed(struct rng *r, uint64_t stream) {
    uint64_t z = seed0 + 0x9e3779b97f4a7c15ULL * (stream + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    r->s = z ? z : 1;
}

static uint64_t rng_next(struct rng *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return x * 0x2545f4914f6cdd1dULL;
}

static void fill_random(struct rng *r, void *p, size_t n) {
    unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = rng_next(r);
        memcpy(b + i, &v, 8);
    }
    if (i < n) {
        uint64_t v = rng_next(r);
        memcpy(b + i, &v, n - i);
    }
}

/* ---- the CUDA driver API, through dlopen ---- */

typedef unsigned long long CUdeviceptr;
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUmemGenericAllocationHandle;

typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes; /* NONE = 0, POSIX_FILE_DESCRIPTOR = 1 */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType, gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;

typedef char assert_prop_is_32_bytes[sizeof(CUmemAllocationProp) == 32 ? 1 : -1];
typedef char assert_access_desc_is_12_bytes[sizeof(CUmemAccessDesc) == 12 ? 1 : -1];
/* gdr_get_info (the exported v1 symbol) fills the first 40 bytes: everything before mapping_type */
typedef char assert_v1_info_is_40_bytes[offsetof(gdr_info_v2_t, mapping_type) == 40 ? 1 : -1];

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                  unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
    CUdevice dev;
    CUcontext ctx;
} cu;

/* dlsym into a function pointer without an object-to-function pointer cast (ISO C). */
static int load_sym(void *lib, const char *name, void *fnptr, size_t fnsize, char *why,
                    size_t whylen) {
    void *sym = dlsym(lib, name);
    if (!sym || fnsize != sizeof sym) {
        snprintf(why, whylen, "libcuda.so.1 has no %s", name);
        return 0;
    }
    memcpy(fnptr, &sym, sizeof sym);
    return 1;
}

#define LOAD(field, name)                                                                      \
    if (!load_sym(lib, name, &cu.field, sizeof cu.field, why, whylen))                         \
        return 0;

/* Loads libcuda, initialises it and makes device 0's primary context current. 0 and a reason
 * when no GPU is usable. */
static int cuda_setup(char *why, size_t whylen) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        snprintf(why, whylen, "dlopen(libcuda.so.1): %s", dlerror());
        return 0;
    }
    LOAD(Init, "cuInit");
    LOAD(DeviceGet, "cuDeviceGet");
    LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(CtxSetCurrent, "cuCtxSetCurrent");
    LOAD(CtxSynchronize, "cuCtxSynchronize");
    LOAD(MemAlloc, "cuMemAlloc_v2");
    LOAD(MemFree, "cuMemFree_v2");
    LOAD(MemcpyHtoD, "cuMemcpyHtoD_v2");
    LOAD(MemcpyDtoH, "cuMemcpyDtoH_v2");
    LOAD(MemGetInfo, "cuMemGetInfo_v2");
    LOAD(MemCreate, "cuMemCreate");
    LOAD(MemRelease, "cuMemRelease");
    LOAD(MemAddressReserve, "cuMemAddressReserve");
    LOAD(MemAddressFree, "cuMemAddressFree");
    LOAD(MemMap, "cuMemMap");
    LOAD(MemUnmap, "cuMemUnmap");
    LOAD(MemSetAccess, "cuMemSetAccess");
    LOAD(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    int rc = cu.Init(0);
    if (rc != 0) {
        snprintf(why, whylen, "cuInit returned %d", rc);
        return 0;
    }
    if ((rc = cu.DeviceGet(&cu.dev, 0)) != 0) {
        snprintf(why, whylen, "cuDeviceGet(0) returned %d", rc);
        return 0;
    }
    if ((rc = cu.DevicePrimaryCtxRetain(&cu.ctx, cu.dev)) != 0) {
        snprintf(why, whylen, "cuDevicePrimaryCtxRetain returned %d", rc);
        return 0;
    }
    if ((rc = cu.CtxSetCurrent(cu.ctx)) != 0) {
        snprintf(why, whylen, "cuCtxSetCurrent returned %d", rc);
        return 0;
    }
    return 1;
}

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static size_t gpu_free(void) {
    size_t f = 0, t = 0;
    if (!CU_OK(cu.MemGetInfo(&f, &t)))
        return 0;
    return f;
}

/* cuMemCreate memory: size rounded up to the allocation granularity, mapped read-write on
 * device 0 at a fresh VA. posix_fd: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, else none. */
struct vmm {
    CUdeviceptr dptr;
    CUmemGenericAllocationHandle h;
    size_t size;
};

static void vmm_prop(CUmemAllocationProp *prop, int posix_fd) {
    memset(prop, 0, sizeof *prop);
    prop->type = 1;
    prop->requestedHandleTypes = posix_fd ? 1 : 0;
    prop->location.type = 1;
    prop->location.id = cu.dev;
}

static int vmm_alloc(size_t size, int posix_fd, struct vmm *m) {
    CUmemAllocationProp prop;
    size_t gran = 0;
    memset(m, 0, sizeof *m);
    vmm_prop(&prop, posix_fd);
    if (!CU_OK(cu.MemGetAllocationGranularity(&gran, &prop, 0)))
        return 0;
    if (!CHECK(gran > 0, "vmm_alloc: allocation granularity is 0"))
        return 0;
    size_t sz = (size + gran - 1) / gran * gran;
    CUdeviceptr d = 0;
    CUmemGenericAllocationHandle h = 0;
    if (!CU_OK(cu.MemAddressReserve(&d, sz, gran, 0, 0)))
        return 0;
    if (!CU_OK(cu.MemCreate(&h, sz, &prop, 0))) {
        CU_OK(cu.MemAddressFree(d, sz));
        return 0;
    }
    if (!CU_OK(cu.MemMap(d, sz, 0, h, 0))) {
        CU_OK(cu.MemRelease(h));
        CU_OK(cu.MemAddressFree(d, sz));
        return 0;
    }
    CUmemAccessDesc access;
    memset(&access, 0, sizeof access);
    access.location.type = 1;
    access.location.id = cu.dev;
    access.flags = 3;
    if (!CU_OK(cu.MemSetAccess(d, sz, &access, 1))) {
        CU_OK(cu.MemUnmap(d, sz));
        CU_OK(cu.MemRelease(h));
        CU_OK(cu.MemAddressFree(d, sz));
        return 0;
    }
    m->dptr = d;
    m->h = h;
    m->size = sz;
    return 1;
}

static int vmm_free(struct vmm *m) {
    if (!m->size)
        return 1;
    int ok = CU_OK(cu.MemUnmap(m->dptr, m->size));
    ok &= CU_OK(cu.MemRelease(m->h));
    ok &= CU_OK(cu.MemAddressFree(m->dptr, m->size));
    m->size = 0;
    return ok;
}

/* ---- gdr helpers ---- */

static gdr_t g;       /* the shared gdr_t, opened in main */
static int backend;   /* GDR_ATTR_GDR_BACKEND of g */
static int persistent; /* dmabuf, vulkan: pins hold the memory (header) */

static const char *backend_name(int b) {
    switch (b) {
    case GDR_GDR_BACKEND_GDRDRV: return "gdrdrv";
    case GDR_GDR_BACKEND_DMABUF: return "dmabuf";
    case GDR_GDR_BACKEND_VULKAN: return "vulkan";
    default: return "unknown";
    }
}

/* Checks that info describes an unmapped/mapped handle covering [addr, addr + size). */
static int check_info(const gdr_info_v2_t *info, CUdeviceptr addr, size_t size, int mapped,
                      const char *what) {
    int ok = 1;
    ok &= CHECK(info->va <= addr && addr + size <= info->va + info->mapped_size,
                "%s: info va %#llx + %llu does not cover %#llx + %zu", what,
                (unsigned long long)info->va, (unsigned long long)info->mapped_size, addr, size);
    ok &= CHECK(info->page_size >= 4096 && (info->page_size & (info->page_size - 1)) == 0,
                "%s: page_size %u", what, info->page_size);
    if (info->page_size) {
        ok &= CHECK(info->va % info->page_size == 0, "%s: va %#llx not a multiple of page %u",
                    what, (unsigned long long)info->va, info->page_size);
        ok &= CHECK(info->mapped_size % info->page_size == 0,
                    "%s: mapped_size %llu not a multiple of page %u", what,
                    (unsigned long long)info->mapped_size, info->page_size);
    }
    if (backend == GDR_GDR_BACKEND_VULKAN) {
        ok &= CHECK(info->page_size == GPU_PAGE_SIZE, "%s: page_size %u on vulkan, want %lu",
                    what, info->page_size, GPU_PAGE_SIZE);
    }
    if (backend != GDR_GDR_BACKEND_DMABUF) {
        ok &= CHECK(info->va % GPU_PAGE_SIZE == 0, "%s: va %#llx not GPU-page aligned", what,
                    (unsigned long long)info->va);
    }
    ok &= CHECK(info->mapped == (unsigned)!!mapped && info->wc_mapping == (unsigned)!!mapped,
                "%s: mapped %u wc_mapping %u, want %d", what, info->mapped, info->wc_mapping,
                !!mapped);
    ok &= CHECK(info->mapping_type == (mapped ? GDR_MAPPING_TYPE_WC : GDR_MAPPING_TYPE_NONE),
                "%s: mapping_type %d, want %d", what, (int)info->mapping_type,
                mapped ? GDR_MAPPING_TYPE_WC : GDR_MAPPING_TYPE_NONE);
    return ok;
}

/* A pinned and mapped range: user is the CPU address of GPU address addr. */
struct pinmap {
    gdr_mh_t mh;
    gdr_info_v2_t info;
    void *base;
    char *user;
    CUdeviceptr addr;
    size_t size;
};

/* The page a pin's start must be aligned to for gdr_map: the GPU page, or the host page on the
 * dma-buf backend (gdrcopy: gdrdrv refuses an offset into the first page, and mmap of a dma-buf
 * at a byte offset fails). */
static size_t map_page(void) {
    return backend == GDR_GDR_BACKEND_DMABUF ? (size_t)sysconf(_SC_PAGESIZE) : GPU_PAGE_SIZE;
}

static int pin_only(gdr_t gg, CUdeviceptr addr, size_t size, uint32_t flags, gdr_mh_t *mh) {
    return flags ? EXPECT_RC(gdr_pin_buffer_v2(gg, addr, size, flags, mh), 0)
                 : EXPECT_RC(gdr_pin_buffer(gg, addr, size, 0, 0, mh), 0);
}

/* Pins [addr, addr + size) of gdr_t gg (flags != 0: gdr_pin_buffer_v2) and maps the whole
 * window. An address inside a page is pinned as asked first, and gdr_map of that pin must be
 * refused (as gdrcopy refuses it); then the page-aligned range around it is pinned and mapped,
 * as UCX and NCCL pin. p->user is the CPU address of addr. 1 when all went well. */
static int pin_and_map(gdr_t gg, CUdeviceptr addr, size_t size, uint32_t flags,
                       struct pinmap *p, const char *what) {
    memset(p, 0, sizeof *p);
    p->addr = addr;
    p->size = size;
    CUdeviceptr start = addr & ~(CUdeviceptr)(map_page() - 1);
    size_t len = size + (size_t)(addr - start);
    if (start != addr && pin_only(gg, addr, size, flags, &p->mh)) {
        gdr_info_v2_t info = {0};
        void *va = NULL;
        if (EXPECT_RC(gdr_get_info_v2(gg, p->mh, &info), 0))
            check_info(&info, addr, size, 0, what);
        EXPECT_RC(gdr_map(gg, p->mh, &va, info.mapped_size), EINVAL);
        EXPECT_RC(gdr_unpin_buffer(gg, p->mh), 0);
    }
    if (!pin_only(gg, start, len, flags, &p->mh)) {
        fail_at(__FILE__, __LINE__, "%s: pin of %#llx + %zu failed", what, start, len);
        return 0;
    }
    memset(&p->info, 0xcc, sizeof p->info);
    if (!EXPECT_RC(gdr_get_info_v2(gg, p->mh, &p->info), 0) ||
        !check_info(&p->info, start, len, 0, what) ||
        !EXPECT_RC(gdr_map(gg, p->mh, &p->base, p->info.mapped_size), 0) ||
        !CHECK(p->base != NULL, "%s: gdr_map gave NULL", what)) {
        EXPECT_RC(gdr_unpin_buffer(gg, p->mh), 0);
        return 0;
    }
    p->user = (char *)p->base + (addr - p->info.va);
    gdr_info_v2_t info;
    memset(&info, 0xcc, sizeof info);
    if (EXPECT_RC(gdr_get_info_v2(gg, p->mh, &info), 0))
        check_info(&info, start, len, 1, what);
    return 1;
}

static int unmap_and_unpin(gdr_t gg, struct pinmap *p) {
    int ok = EXPECT_RC(gdr_unmap(gg, p->mh, p->base, p->info.mapped_size), 0);
    ok &= EXPECT_RC(gdr_unpin_buffer(gg, p->mh), 0);
    return ok;
}

/* Fresh random bytes written through the mapping at user (GPU address dptr, n bytes) must read
 * back through the mapping and through cuMemcpyDtoH; then bytes written with cuMemcpyHtoD must
 * read back through the mapping. last (n bytes, or NULL) gets what the range holds after. */
static int roundtrip(struct rng *r, gdr_mh_t mh, void *user, CUdeviceptr dptr, size_t n,
                     unsigned char *last, const char *what) {
    unsigned char *src = xmalloc(n), *dst = xmalloc(n);
    int ok = 1;
    fill_random(r, src, n);
    if ((ok &= EXPECT_RC(gdr_copy_to_mapping(mh, user, src, n), 0))) {
        memset(dst, 0xee, n);
        if ((ok &= EXPECT_RC(gdr_copy_from_mapping(mh, dst, user, n), 0)))
            ok &= SAME_BYTES(dst, src, n, "%s: CPU write read back through the mapping", what);
        memset(dst, 0xee, n);
        if ((ok &= CU_OK(cu.MemcpyDtoH(dst, dptr, n))))
            ok &= SAME_BYTES(dst, src, n, "%s: the GPU (cuMemcpyDtoH) after a CPU write", what);
    }
    fill_random(r, src, n);
    if ((ok &= CU_OK(cu.MemcpyHtoD(dptr, src, n))) && (ok &= CU_OK(cu.CtxSynchronize()))) {
        memset(dst, 0xee, n);
        if ((ok &= EXPECT_RC(gdr_copy_from_mapping(mh, dst, user, n), 0)))
            ok &= SAME_BYTES(dst, src, n, "%s: the mapping after a GPU write (cuMemcpyHtoD)",
                             what);
        if (last)
            memcpy(last, src, n);
    }
    free(src);
    free(dst);
    return ok;
}

/* Reads n bytes at user through the mapping and compares them with want. */
static int mapping_shows(gdr_mh_t mh, const void *user, const void *want, size_t n,
                         const char *what) {
    unsigned char *dst = xmalloc(n);
    memset(dst, 0xee, n);
    int ok = EXPECT_RC(gdr_copy_from_mapping(mh, dst, user, n), 0) &&
             SAME_BYTES(dst, want, n, "%s (through the mapping)", what);
    free(dst);
    return ok;
}

static int gpu_shows(CUdeviceptr dptr, const void *want, size_t n, const char *what) {
    unsigned char *dst = xmalloc(n);
    memset(dst, 0xee, n);
    int ok = CU_OK(cu.MemcpyDtoH(dst, dptr, n)) &&
             SAME_BYTES(dst, want, n, "%s (cuMemcpyDtoH)", what);
    free(dst);
    return ok;
}

/* Waits at most `seconds` for child pid; kills it (SIGKILL) and reaps it when late. */
static int wait_child(pid_t pid, int seconds, int *status) {
    for (long i = 0; i < (long)seconds * 100; i++) {
        pid_t w = waitpid(pid, status, WNOHANG);
        if (w == pid)
            return 1;
        if (w < 0 && errno != EINTR)
            return 0;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    return 0;
}

/* Reads one byte from fd within `seconds`; -1 on timeout or EOF. */
static int read_byte(int fd, int seconds) {
    struct pollfd p = {fd, POLLIN, 0};
    int n = poll(&p, 1, seconds * 1000);
    unsigned char b;
    if (n == 1 && read(fd, &b, 1) == 1)
        return b;
    return -1;
}

static struct rng main_rng;

/* ---- 1. orders ---- */

static void case_orders(void) {
    struct rng *r = &main_rng;
    struct vmm m;
    if (!vmm_alloc(4 * MiB, 1, &m))
        return;
    CUdeviceptr dptr = m.dptr + 64 * KiB + 100;
    size_t n = 1 * MiB;
    unsigned char *last = xmalloc(n), *junk = xmalloc(4096);
    struct pinmap p;
    fill_random(r, junk, 4096);

    /* map, unmap, unpin */
    if (pin_and_map(g, dptr, n, 0, &p, "orders: map+unmap+unpin")) {
        roundtrip(r, p.mh, p.user, dptr, n, NULL, "orders: map+unmap+unpin");
        EXPECT_RC(gdr_unmap(g, p.mh, p.base, p.info.mapped_size), 0);
        EXPECT_RC(gdr_copy_to_mapping(p.mh, p.user, junk, 16), EINVAL);
        EXPECT_RC(gdr_unmap(g, p.mh, p.base, p.info.mapped_size), EINVAL); /* unmap twice */
        EXPECT_RC(gdr_unpin_buffer(g, p.mh), 0);
    }

    /* map, then unpin without unmap: unpin tears the mapping down */
    if (pin_and_map(g, dptr, n, 0, &p, "orders: unpin while mapped")) {
        roundtrip(r, p.mh, p.user, dptr, n, NULL, "orders: unpin while mapped");
        EXPECT_RC(gdr_unpin_buffer(g, p.mh), 0);
        EXPECT_RC(gdr_copy_to_mapping(p.mh, p.user, junk, 16), EINVAL);
        EXPECT_RC(gdr_copy_from_mapping(p.mh, junk, p.user, 16), EINVAL);
        EXPECT_RC(gdr_unmap(g, p.mh, p.base, p.info.mapped_size), EINVAL);
        gdr_info_v2_t info;
        EXPECT_RC(gdr_get_info_v2(g, p.mh, &info), EINVAL);
    }

    /* unpin twice */
    gdr_mh_t mh = {0};
    if (EXPECT_RC(gdr_pin_buffer(g, dptr, n, 0, 0, &mh), 0)) {
        EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
        EXPECT_RC(gdr_unpin_buffer(g, mh), EINVAL);
    }

    /* unmap without map */
    if (EXPECT_RC(gdr_pin_buffer(g, dptr, n, 0, 0, &mh), 0)) {
        EXPECT_RC(gdr_unmap(g, mh, junk, 4096), EINVAL);
        EXPECT_RC(gdr_unmap(g, mh, NULL, 4096), EINVAL);
        EXPECT_RC(gdr_copy_to_mapping(mh, junk, junk + 16, 16), EINVAL);
        EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
    }

    /* map twice; unmap with a wrong va; re-map after unmap shows the same data */
    if (pin_and_map(g, dptr, n, 0, &p, "orders: map twice")) {
        void *again = NULL;
        EXPECT_RC(gdr_map(g, p.mh, &again, p.info.mapped_size), EAGAIN);
        EXPECT_RC(gdr_map_v2(g, p.mh, &again, p.info.mapped_size, GDR_MAP_FLAG_REQ_WC_MAPPING),
                  EAGAIN);
        roundtrip(r, p.mh, p.user, dptr, n, NULL, "orders: first mapping after a second map");

        EXPECT_RC(gdr_unmap(g, p.mh, (char *)p.base + 4096, p.info.mapped_size), EINVAL);
        EXPECT_RC(gdr_unmap(g, p.mh, (char *)p.base - 65536, p.info.mapped_size), EINVAL);
        EXPECT_RC(gdr_unmap(g, p.mh, NULL, p.info.mapped_size), EINVAL);
        EXPECT_RC(gdr_unmap(g, p.mh, junk, p.info.mapped_size), EINVAL);
        gdr_info_v2_t info;
        if (EXPECT_RC(gdr_get_info_v2(g, p.mh, &info), 0))
            check_info(&info, dptr, n, 1, "orders: after unmaps with a wrong va");
        roundtrip(r, p.mh, p.user, dptr, n, last, "orders: mapping after a wrong-va unmap");

        if (EXPECT_RC(gdr_unmap(g, p.mh, p.base, p.info.mapped_size), 0)) {
            void *base2 = NULL;
            if (EXPECT_RC(gdr_map(g, p.mh, &base2, p.info.mapped_size), 0)) {
                char *user2 = (char *)base2 + (dptr - p.info.va);
                mapping_shows(p.mh, user2, last, n, "orders: re-mapped handle shows the data");
                roundtrip(r, p.mh, user2, dptr, n, NULL, "orders: re-mapped");
                EXPECT_RC(gdr_unmap(g, p.mh, base2, p.info.mapped_size), 0);
            }
        }
        EXPECT_RC(gdr_unpin_buffer(g, p.mh), 0);
    }
    free(last);
    free(junk);
    vmm_free(&m);
}

/* ---- 2. two pins of one buffer ---- */

static void case_two_pins_one_buffer(void) {
    struct rng *r = &main_rng;
    struct vmm m;
    if (!vmm_alloc(4 * MiB, 1, &m))
        return;
    CUdeviceptr dptr = m.dptr + 3 * 64 * KiB + 17;
    size_t n = MiB + 333;
    struct pinmap a, b;
    if (!pin_and_map(g, dptr, n, 0, &a, "two_pins: pin A")) {
        vmm_free(&m);
        return;
    }
    if (!pin_and_map(g, dptr, n, 0, &b, "two_pins: pin B")) {
        unmap_and_unpin(g, &a);
        vmm_free(&m);
        return;
    }
    CHECK(a.mh.h != b.mh.h, "two_pins: both pins got handle %lu", a.mh.h);
    unsigned char *src = xmalloc(n), *dst = xmalloc(n);

    /* A write through A is read back through B and by the GPU, and the reverse. */
    fill_random(r, src, n);
    if (EXPECT_RC(gdr_copy_to_mapping(a.mh, a.user, src, n), 0)) {
        mapping_shows(b.mh, b.user, src, n, "two_pins: written through A, read through B");
        gpu_shows(dptr, src, n, "two_pins: written through A");
    }
    fill_random(r, src, n);
    if (EXPECT_RC(gdr_copy_to_mapping(b.mh, b.user, src, n), 0)) {
        mapping_shows(a.mh, a.user, src, n, "two_pins: written through B, read through A");
        gpu_shows(dptr, src, n, "two_pins: written through B");
    }
    fill_random(r, src, n);
    if (CU_OK(cu.MemcpyHtoD(dptr, src, n)) && CU_OK(cu.CtxSynchronize())) {
        mapping_shows(a.mh, a.user, src, n, "two_pins: GPU write seen through A");
        mapping_shows(b.mh, b.user, src, n, "two_pins: GPU write seen through B");
    }

    /* Unpinning A (still mapped) leaves B working. */
    EXPECT_RC(gdr_unpin_buffer(g, a.mh), 0);
    EXPECT_RC(gdr_copy_from_mapping(a.mh, dst, a.user, 16), EINVAL);
    mapping_shows(b.mh, b.user, src, n, "two_pins: B after unpinning A");
    roundtrip(r, b.mh, b.user, dptr, n, NULL, "two_pins: B after unpinning A");
    unmap_and_unpin(g, &b);
    free(src);
    free(dst);
    vmm_free(&m);
}

/* ---- 3. threads ---- */

#define OWN_THREADS 8
#define OWN_ROUNDS 20
#define SLICE_THREADS 4
#define SLICE_ROUNDS 30

struct thr {
    int idx;
    int rounds_done;
    pthread_t tid;
    struct vmm *shared; /* slice threads: the shared allocation */
};

static void *own_worker(void *arg) {
    struct thr *t = arg;
    struct rng r;
    rng_seed(&r, 100 + (uint64_t)t->idx);
    if (!CU_OK(cu.CtxSetCurrent(cu.ctx)))
        return NULL;
    for (int round = 0; round < OWN_ROUNDS; round++) {
        size_t size = 64 * KiB + (size_t)(rng_next(&r) % (2 * MiB - 64 * KiB + 1));
        char what[128];
        snprintf(what, sizeof what, "threads: own-buffer thread %d round %d (%zu bytes)",
                 t->idx, round, size);
        struct vmm m;
        if (!vmm_alloc(size, 1, &m))
            return NULL;
        CUdeviceptr dptr = m.dptr + (size_t)(rng_next(&r) % (m.size - size + 1));
        struct pinmap p;
        int ok = pin_and_map(g, dptr, size, 0, &p, what);
        if (ok) {
            ok &= roundtrip(&r, p.mh, p.user, dptr, size, NULL, what);
            ok &= unmap_and_unpin(g, &p);
        }
        ok &= vmm_free(&m);
        if (!ok)
            return NULL;
        t->rounds_done++;
    }
    return NULL;
}

static void *slice_worker(void *arg) {
    struct thr *t = arg;
    struct rng r;
    rng_seed(&r, 200 + (uint64_t)t->idx);
    if (!CU_OK(cu.CtxSetCurrent(cu.ctx)))
        return NULL;
    size_t quarter = t->shared->size / SLICE_THREADS;
    CUdeviceptr mine = t->shared->dptr + (size_t)t->idx * quarter;
    for (int round = 0; round < SLICE_ROUNDS; round++) {
        size_t off = (size_t)(rng_next(&r) % (quarter / 2));
        size_t len = 1 + (size_t)(rng_next(&r) % (quarter / 2));
        char what[128];
        snprintf(what, sizeof what, "threads: slice thread %d round %d (+%zu, %zu bytes)",
                 t->idx, round, (size_t)(mine - t->shared->dptr) + off, len);
        struct pinmap p;
        if (!pin_and_map(g, mine + off, len, 0, &p, what))
            return NULL;
        int ok = roundtrip(&r, p.mh, p.user, mine + off, len, NULL, what);
        ok &= unmap_and_unpin(g, &p);
        if (!ok)
            return NULL;
        t->rounds_done++;
    }
    return NULL;
}

static void case_threads(void) {
    struct thr own[OWN_THREADS], slice[SLICE_THREADS];
    int started = 0;
    memset(own, 0, sizeof own);
    for (int i = 0; i < OWN_THREADS; i++) {
        own[i].idx = i;
        int rc = pthread_create(&own[i].tid, NULL, own_worker, &own[i]);
        if (!CHECK(rc == 0, "threads: pthread_create %d: %d", i, rc))
            break;
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(own[i].tid, NULL);
    for (int i = 0; i < started; i++)
        CHECK(own[i].rounds_done == OWN_ROUNDS, "threads: own-buffer thread %d did %d of %d rounds",
              i, own[i].rounds_done, OWN_ROUNDS);

    struct vmm shared;
    if (!vmm_alloc(8 * MiB, 1, &shared))
        return;
    CHECK(shared.size % (SLICE_THREADS * GPU_PAGE_SIZE) == 0, "threads: shared size %zu",
          shared.size);
    memset(slice, 0, sizeof slice);
    started = 0;
    for (int i = 0; i < SLICE_THREADS; i++) {
        slice[i].idx = i;
        slice[i].shared = &shared;
        int rc = pthread_create(&slice[i].tid, NULL, slice_worker, &slice[i]);
        if (!CHECK(rc == 0, "threads: pthread_create slice %d: %d", i, rc))
            break;
        started++;
    }
    for (int i = 0; i < started; i++)
        pthread_join(slice[i].tid, NULL);
    for (int i = 0; i < started; i++)
        CHECK(slice[i].rounds_done == SLICE_ROUNDS, "threads: slice thread %d did %d of %d rounds",
              i, slice[i].rounds_done, SLICE_ROUNDS);
    vmm_free(&shared);
}

/* ---- 4. unaligned small pins ---- */

static void case_unaligned_small(void) {
    struct rng *r = &main_rng;
    static const size_t sizes[] = {1, 7, 4095, 65537};
    static const size_t offsets[] = {1, 4099, 65535, 65536 + 13};
    struct vmm m;
    if (!vmm_alloc(4 * MiB, 1, &m))
        return;
    size_t total = 4 * MiB;
    unsigned char *base_data = xmalloc(total), *got = xmalloc(total);
    fill_random(r, base_data, total);
    if (!CU_OK(cu.MemcpyHtoD(m.dptr, base_data, total)) || !CU_OK(cu.CtxSynchronize()))
        goto out;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
            size_t off = offsets[oi], n = sizes[si];
            CUdeviceptr addr = m.dptr + off;
            char what[128];
            snprintf(what, sizeof what, "unaligned_small: %zu bytes at +%zu", n, off);
            struct pinmap p;
            if (!pin_and_map(g, addr, n, 0, &p, what))
                continue;
            /* The whole window shows what the GPU holds, neighbours included. */
            size_t woff = (size_t)(p.info.va - m.dptr);
            if (CHECK(woff + p.info.mapped_size <= total, "%s: window +%zu+%llu outside the buffer",
                      what, woff, (unsigned long long)p.info.mapped_size))
                mapping_shows(p.mh, p.base, base_data + woff, p.info.mapped_size, what);
            /* New bytes, each different from the old one, at exactly [addr, addr + n). */
            unsigned char *src = xmalloc(n);
            fill_random(r, src, n);
            for (size_t i = 0; i < n; i++)
                src[i] = (unsigned char)(base_data[off + i] ^ (1 + src[i] % 255));
            if (EXPECT_RC(gdr_copy_to_mapping(p.mh, p.user, src, n), 0)) {
                memcpy(base_data + off, src, n);
                mapping_shows(p.mh, p.user, src, n, what);
                memset(got, 0xee, total);
                if (CU_OK(cu.MemcpyDtoH(got, m.dptr, total)))
                    SAME_BYTES(got, base_data, total,
                               "%s: the GPU sees exactly those bytes changed", what);
                if (woff + p.info.mapped_size <= total)
                    mapping_shows(p.mh, p.base, base_data + woff, p.info.mapped_size, what);
            }
            free(src);
            unmap_and_unpin(g, &p);
        }
    }
out:
    free(base_data);
    free(got);
    vmm_free(&m);
}

/* ---- 5. gdr_close releases everything ---- */

static void case_close_releases(void) {
    struct rng *r = &main_rng;
    size_t free0 = gpu_free();
    gdr_t g2 = gdr_open();
    if (!CHECK(g2 != NULL, "close_releases: second gdr_open returned NULL"))
        return;
    struct vmm m[3];
    gdr_mh_t mh[3];
    void *map[3] = {NULL, NULL, NULL};
    size_t mapsize[3] = {0, 0, 0};
    int have = 0;
    for (int i = 0; i < 3; i++) {
        if (!vmm_alloc(8 * MiB, 1, &m[i]))
            break;
        have++;
        if (!EXPECT_RC(gdr_pin_buffer(g2, m[i].dptr, m[i].size, 0, 0, &mh[i]), 0)) {
            mh[i].h = 0;
            continue;
        }
        if (i < 2) {
            gdr_info_v2_t info;
            if (EXPECT_RC(gdr_get_info_v2(g2, mh[i], &info), 0) &&
                EXPECT_RC(gdr_map(g2, mh[i], &map[i], info.mapped_size), 0)) {
                mapsize[i] = info.mapped_size;
                roundtrip(r, mh[i], (char *)map[i] + (m[i].dptr - info.va), m[i].dptr, 64 * KiB,
                          NULL, "close_releases: mapped before gdr_close");
            }
        }
    }
    EXPECT_RC(gdr_close(g2), 0);
    gdr_t g3 = gdr_open();
    CHECK(g3 != NULL, "close_releases: gdr_open after gdr_close returned NULL");
    CHECK(g3 != g2, "close_releases: the new gdr_t has the closed one's value %p", (void *)g2);
    for (int i = 0; i < have; i++) {
        if (!mh[i].h)
            continue;
        gdr_info_v2_t info;
        void *va = NULL;
        int flag;
        unsigned char b[16] = {0};
        EXPECT_RC(gdr_get_info_v2(g2, mh[i], &info), EINVAL);
        EXPECT_RC(gdr_get_info_v2(g, mh[i], &info), EINVAL);
        EXPECT_RC(gdr_map(g2, mh[i], &va, 65536), EINVAL);
        EXPECT_RC(gdr_unpin_buffer(g2, mh[i]), EINVAL);
        EXPECT_RC(gdr_unpin_buffer(g, mh[i]), EINVAL);
        EXPECT_RC(gdr_get_callback_flag(g2, mh[i], &flag), EINVAL);
        if (g3) {
            EXPECT_RC(gdr_get_info_v2(g3, mh[i], &info), EINVAL);
            EXPECT_RC(gdr_map(g3, mh[i], &va, 65536), EINVAL);
            EXPECT_RC(gdr_unpin_buffer(g3, mh[i]), EINVAL);
            EXPECT_RC(gdr_get_callback_flag(g3, mh[i], &flag), EINVAL);
        }
        if (map[i]) {
            EXPECT_RC(gdr_copy_to_mapping(mh[i], map[i], b, sizeof b), EINVAL);
            EXPECT_RC(gdr_copy_from_mapping(mh[i], b, map[i], sizeof b), EINVAL);
            EXPECT_RC(gdr_unmap(g2, mh[i], map[i], mapsize[i]), EINVAL);
            if (g3)
                EXPECT_RC(gdr_unmap(g3, mh[i], map[i], mapsize[i]), EINVAL);
        }
    }
    /* The closed gdr_t itself is refused. */
    int v = -1, maj = -1, min = -1;
    gdr_mh_t nh = {0};
    EXPECT_RC(gdr_close(g2), EINVAL);
    EXPECT_RC(gdr_get_attribute(g2, GDR_ATTR_USE_PERSISTENT_MAPPING, &v), EINVAL);
    EXPECT_RC(gdr_driver_get_version(g2, &maj, &min), EINVAL);
    if (have > 0)
        EXPECT_RC(gdr_pin_buffer(g2, m[0].dptr, 4096, 0, 0, &nh), EINVAL);
    /* The new one works on the same memory. */
    if (g3 && have > 0) {
        struct pinmap p;
        if (pin_and_map(g3, m[0].dptr + 5, 100000, 0, &p, "close_releases: new gdr_t")) {
            roundtrip(r, p.mh, p.user, p.addr, p.size, NULL, "close_releases: new gdr_t");
            unmap_and_unpin(g3, &p);
        }
    }
    if (g3)
        EXPECT_RC(gdr_close(g3), 0);
    for (int i = 0; i < have; i++)
        vmm_free(&m[i]);
    size_t free1 = gpu_free();
    long long diff = (long long)free1 - (long long)free0;
    CHECK(diff >= -(long long)(4 * MiB) && diff <= (long long)(4 * MiB),
          "close_releases: GPU free memory %zu MiB before, %zu MiB after (diff %lld KiB): "
          "gdr_close did not release the pins",
          free0 / MiB, free1 / MiB, diff / 1024);
}

/* ---- 6. memory freed while pinned ---- */

static void case_free_while_pinned(void) {
    struct rng *r = &main_rng;
    size_t size = 32 * MiB;
    size_t free0 = gpu_free();
    struct vmm m;
    if (!vmm_alloc(size, 1, &m))
        return;
    size_t head = MiB, tail = 64 * KiB;
    unsigned char *a = xmalloc(m.size);
    fill_random(r, a, m.size);
    struct pinmap p;
    if (!CU_OK(cu.MemcpyHtoD(m.dptr, a, m.size)) || !CU_OK(cu.CtxSynchronize()) ||
        !pin_and_map(g, m.dptr, m.size, 0, &p, "free_while_pinned")) {
        vmm_free(&m);
        free(a);
        return;
    }
    size_t pinned_size = m.size;
    CUdeviceptr dptr = m.dptr;
    mapping_shows(p.mh, p.user, a, head, "free_while_pinned: pattern A before the free");
    int flag = -1;
    if (EXPECT_RC(gdr_get_callback_flag(g, p.mh, &flag), 0))
        CHECK(flag == 0, "free_while_pinned: callback flag %d before the free", flag);

    vmm_free(&m); /* the application frees it: cuMemUnmap + cuMemRelease + cuMemAddressFree */
    size_t free_mid = gpu_free();

    int shows_a = -1, copies_ok = -1;
    if (persistent) {
        /* The pin holds the memory: the mapping still shows pattern A and copies work. */
        shows_a = mapping_shows(p.mh, p.user, a, head, "free_while_pinned: head after the free") &&
                  mapping_shows(p.mh, p.user + pinned_size - tail, a + pinned_size - tail, tail,
                                "free_while_pinned: tail after the free");
        fill_random(r, a, head);
        copies_ok = EXPECT_RC(gdr_copy_to_mapping(p.mh, p.user, a, head), 0) &&
                    mapping_shows(p.mh, p.user, a, head,
                                  "free_while_pinned: written after the free");
        CHECK(free_mid + pinned_size <= free0 + 4 * MiB,
              "free_while_pinned: GPU free memory %zu MiB before the allocation, %zu MiB after "
              "the application's free: the pin should still hold the %zu MiB",
              free0 / MiB, free_mid / MiB, pinned_size / MiB);
    }
    /* gdrdrv (non-persistent): the mapping is revoked; it is not touched here. */
    flag = -1;
    if (EXPECT_RC(gdr_get_callback_flag(g, p.mh, &flag), 0))
        CHECK(flag == 1, "free_while_pinned: callback flag %d after the application's free, "
                         "want 1",
              flag);
    EXPECT_RC(gdr_unmap(g, p.mh, p.base, p.info.mapped_size), 0);
    EXPECT_RC(gdr_unpin_buffer(g, p.mh), 0);
    size_t free1 = gpu_free();
    long long diff = (long long)free1 - (long long)free0;
    CHECK(diff >= -(long long)(4 * MiB) && diff <= (long long)(4 * MiB),
          "free_while_pinned: GPU free memory %zu MiB before the allocation, %zu MiB after "
          "unpin (diff %lld KiB): leaked",
          free0 / MiB, free1 / MiB, diff / 1024);
    printf("  free_while_pinned (%s): %zu MiB at %#llx freed by the application while pinned; "
           "mapping %s, copies %s, callback flag %d, GPU memory held by the pin %lld MiB, "
           "returned after unpin (diff %lld KiB)\n",
           backend_name(backend), pinned_size / MiB, dptr,
           shows_a < 0 ? "not touched" : shows_a ? "still showed pattern A" : "did NOT show pattern A",
           copies_ok < 0 ? "not tried" : copies_ok ? "worked" : "FAILED", flag,
           ((long long)free0 - (long long)free_mid) / (long long)MiB, diff / 1024);
    free(a);
}

/* ---- 7. fork ---- */

static int child_einval(int rc, const char *call) {
    if (rc == EINVAL)
        return 0;
    fprintf(stderr, "FAIL [fork child]: %s returned %d (%s), expected EINVAL\n", call, rc,
            errname(rc));
    return 1;
}
#define CHILD_EINVAL(call) (bad += child_einval((call), #call))

static void case_fork(void) {
    struct rng *r = &main_rng;
    struct vmm m;
    if (!vmm_alloc(4 * MiB, 1, &m))
        return;
    CUdeviceptr dptr = m.dptr + 64 * KiB;
    size_t n = MiB;
    unsigned char *pat = xmalloc(n);
    struct pinmap p;

    /* (a) the child can use neither the handles nor the mapping */
    if (pin_and_map(g, dptr, n, 0, &p, "fork (a)")) {
        roundtrip(r, p.mh, p.user, dptr, n, pat, "fork (a): before fork");
        int pfd[2];
        if (CHECK(pipe(pfd) == 0, "fork (a): pipe: %s", strerror(errno))) {
            fflush(NULL);
            pid_t pid = fork();
            if (pid == 0) {
                /* child: no CUDA; every gdr_* call with the parent's gdr_t/handle is EINVAL */
                int bad = 0;
                unsigned char buf[64];
                void *va2 = NULL;
                gdr_info_v2_t inf;
                gdr_mh_t mh2 = {0};
                int flag = -1;
                close(pfd[0]);
                memset(buf, 0x5a, sizeof buf);
                CHILD_EINVAL(gdr_copy_to_mapping(p.mh, p.user, buf, sizeof buf));
                memset(buf, 0xee, sizeof buf);
                CHILD_EINVAL(gdr_copy_from_mapping(p.mh, buf, p.user, sizeof buf));
                for (size_t i = 0; i < sizeof buf; i++)
                    if (buf[i] != 0xee) {
                        fprintf(stderr, "FAIL [fork child]: gdr_copy_from_mapping wrote the "
                                        "output buffer\n");
                        bad++;
                        break;
                    }
                CHILD_EINVAL(gdr_map(g, p.mh, &va2, p.info.mapped_size));
                CHILD_EINVAL(gdr_unmap(g, p.mh, p.base, p.info.mapped_size));
                CHILD_EINVAL(gdr_get_info_v2(g, p.mh, &inf));
                CHILD_EINVAL(gdr_get_callback_flag(g, p.mh, &flag));
                CHILD_EINVAL(gdr_pin_buffer(g, dptr, 4096, 0, 0, &mh2));
                CHILD_EINVAL(gdr_unpin_buffer(g, p.mh));
                CHILD_EINVAL(gdr_close(g));
                /* A gdr_open of the child's own (as gdrcopy's fork tests make): it opens, can
                 * be closed, and pins nothing. */
                gdr_t gc = gdr_open();
                if (!gc) {
                    fprintf(stderr, "FAIL [fork child]: gdr_open returned NULL\n");
                    bad++;
                } else {
                    CHILD_EINVAL(gdr_pin_buffer(gc, dptr, 4096, 0, 0, &mh2));
                    if (gdr_close(gc) != 0) {
                        fprintf(stderr, "FAIL [fork child]: gdr_close of the child's gdr_t\n");
                        bad++;
                    }
                }
                unsigned char report = (unsigned char)(bad > 250 ? 250 : bad);
                if (write(pfd[1], &report, 1) != 1)
                    _exit(3);
                close(pfd[1]);
                /* Last: a raw store through the parent's mapping must fault. */
                struct rlimit no_core = {0, 0};
                setrlimit(RLIMIT_CORE, &no_core);
                *(volatile unsigned char *)p.user = 0x5a;
                *(volatile unsigned char *)(p.user + n - 1) = 0x5a;
                _exit(42);
            }
            close(pfd[1]);
            if (CHECK(pid > 0, "fork (a): fork: %s", strerror(errno))) {
                int report = read_byte(pfd[0], 60);
                CHECK(report == 0,
                      report < 0 ? "fork (a): the child died before reporting (%d)"
                                 : "fork (a): %d gdr_* calls in the child did not give EINVAL",
                      report);
                int status = 0;
                if (CHECK(wait_child(pid, 60, &status), "fork (a): child did not exit in 60 s")) {
                    if (WIFSIGNALED(status))
                        CHECK(WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS,
                              "fork (a): child died by signal %d, want SIGSEGV/SIGBUS",
                              WTERMSIG(status));
                    else
                        CHECK(0,
                              "fork (a): the child's store through the parent's mapping did not "
                              "fault (exit status %d)",
                              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
                }
            }
            close(pfd[0]);
        }
        /* The parent's data is unchanged, and everything still works. */
        mapping_shows(p.mh, p.user, pat, n, "fork (a): parent's data after the child");
        gpu_shows(dptr, pat, n, "fork (a): parent's data after the child");
        roundtrip(r, p.mh, p.user, dptr, n, NULL, "fork (a): parent after the child");
        unmap_and_unpin(g, &p);
    }

    /* (b) the parent unmaps and unpins while a child is alive */
    if (pin_and_map(g, dptr, n, 0, &p, "fork (b)")) {
        int pfd[2];
        if (CHECK(pipe(pfd) == 0, "fork (b): pipe: %s", strerror(errno))) {
            fflush(NULL);
            pid_t pid = fork();
            if (pid == 0) {
                close(pfd[1]);
                int go = read_byte(pfd[0], 60);
                int bad = 0;
                CHILD_EINVAL(gdr_unpin_buffer(g, p.mh));
                _exit(go == 1 && bad == 0 ? 0 : 3);
            }
            close(pfd[0]);
            if (CHECK(pid > 0, "fork (b): fork: %s", strerror(errno))) {
                roundtrip(r, p.mh, p.user, dptr, n, NULL, "fork (b): parent with a live child");
                unmap_and_unpin(g, &p);
                unsigned char go = 1;
                CHECK(write(pfd[1], &go, 1) == 1, "fork (b): write to the child: %s",
                      strerror(errno));
                int status = 0;
                if (CHECK(wait_child(pid, 60, &status), "fork (b): child did not exit in 60 s"))
                    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                          "fork (b): child ended with status %#x, want exit 0", status);
            } else {
                unmap_and_unpin(g, &p);
            }
            close(pfd[1]);
        } else {
            unmap_and_unpin(g, &p);
        }
    }

    /* (c) a mapping made before fork stays good in the parent after the child exits */
    if (pin_and_map(g, dptr, n, 0, &p, "fork (c)")) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (CHECK(pid > 0, "fork (c): fork: %s", strerror(errno))) {
            int status = 0;
            if (CHECK(wait_child(pid, 60, &status), "fork (c): child did not exit in 60 s"))
                CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "fork (c): child ended with status %#x", status);
        }
        roundtrip(r, p.mh, p.user, dptr, n, NULL, "fork (c): parent after the child exited");
        unmap_and_unpin(g, &p);
    }
    free(pat);
    vmm_free(&m);
}

/* ---- 8. FORCE_PCIE ---- */

static void case_force_pcie(void) {
    struct rng *r = &main_rng;
    int v = -1;
    if (EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &v), 0) &&
        backend != GDR_GDR_BACKEND_GDRDRV)
        CHECK(v == 1, "force_pcie: SUPPORT_PIN_FLAG_FORCE_PCIE is %d on %s, want 1", v,
              backend_name(backend));
    struct vmm m;
    if (!vmm_alloc(4 * MiB, 1, &m))
        return;
    CUdeviceptr dptr = m.dptr + 12345;
    size_t n = 2 * MiB - 999;
    if (v == 1) {
        struct pinmap p, d;
        if (pin_and_map(g, dptr, n, GDR_PIN_FLAG_FORCE_PCIE, &p, "force_pcie: FORCE_PCIE pin")) {
            roundtrip(r, p.mh, p.user, dptr, n, NULL, "force_pcie: FORCE_PCIE pin");
            if (pin_and_map(g, dptr, n, 0, &d, "force_pcie: default pin")) {
                CHECK(p.info.va == d.info.va && p.info.mapped_size == d.info.mapped_size &&
                          p.info.page_size == d.info.page_size,
                      "force_pcie: FORCE_PCIE pin covers %#llx+%llu (page %u), default pin "
                      "%#llx+%llu (page %u)",
                      (unsigned long long)p.info.va, (unsigned long long)p.info.mapped_size,
                      p.info.page_size, (unsigned long long)d.info.va,
                      (unsigned long long)d.info.mapped_size, d.info.page_size);
                unsigned char *src = xmalloc(n);
                fill_random(r, src, n);
                if (EXPECT_RC(gdr_copy_to_mapping(p.mh, p.user, src, n), 0))
                    mapping_shows(d.mh, d.user, src, n,
                                  "force_pcie: written through FORCE_PCIE, read through default");
                free(src);
                unmap_and_unpin(g, &d);
            }
            unmap_and_unpin(g, &p);
        }
    }
    gdr_mh_t mh = {0};
    EXPECT_RC(gdr_pin_buffer_v2(g, dptr, n, 0x80, &mh), EINVAL);
    EXPECT_RC(gdr_pin_buffer_v2(g, dptr, n, 0x2, &mh), EINVAL);
    EXPECT_RC(gdr_pin_buffer_v2(g, dptr, n, GDR_PIN_FLAG_FORCE_PCIE | 0x80, &mh), EINVAL);
    if (EXPECT_RC(gdr_pin_buffer_v2(g, dptr, n, GDR_PIN_FLAG_DEFAULT, &mh), 0))
        EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
    vmm_free(&m);
}

/* ---- 9. refusals ---- */

static void refusal_expect(CUdeviceptr dptr, size_t n, const char *what) {
    gdr_mh_t mh = {0};
    int want = backend == GDR_GDR_BACKEND_VULKAN ? ENOTSUP : 0;
    int rc = gdr_pin_buffer(g, dptr, n, 0, 0, &mh);
    CHECK(rc == want, "refusals: gdr_pin_buffer of %s on %s returned %d (%s), want %d (%s)", what,
          backend_name(backend), rc, errname(rc), want, errname(want));
    if (rc == 0) {
        struct rng *r = &main_rng;
        gdr_info_v2_t info;
        void *base = NULL;
        int aligned = dptr % map_page() == 0;
        if (EXPECT_RC(gdr_get_info_v2(g, mh, &info), 0) &&
            EXPECT_RC(gdr_map(g, mh, &base, info.mapped_size), aligned ? 0 : EINVAL) && aligned) {
            roundtrip(r, mh, (char *)base + (dptr - info.va), dptr, n, NULL, what);
            EXPECT_RC(gdr_unmap(g, mh, base, info.mapped_size), 0);
        }
        EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
    }
    rc = gdr_pin_buffer_v2(g, dptr, n, GDR_PIN_FLAG_FORCE_PCIE, &mh);
    CHECK(rc == want, "refusals: gdr_pin_buffer_v2 of %s on %s returned %d (%s), want %d (%s)",
          what, backend_name(backend), rc, errname(rc), want, errname(want));
    if (rc == 0)
        EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
}

static void case_refusals(void) {
    /* plain cuMemAlloc memory */
    CUdeviceptr d = 0;
    if (CU_OK(cu.MemAlloc(&d, 2 * MiB))) {
        refusal_expect(d + 4096, MiB, "cuMemAlloc memory");
        CU_OK(cu.MemFree(d));
    }
    /* cuMemCreate memory without a POSIX-fd handle type */
    struct vmm m;
    if (vmm_alloc(2 * MiB, 0, &m)) {
        refusal_expect(m.dptr + 4096, MiB, "cuMemCreate memory without a POSIX-fd handle type");
        vmm_free(&m);
    }
    /* not CUDA memory, bad arguments */
    gdr_mh_t mh = {0};
    size_t hn = 4 * MiB;
    char *host = xmalloc(hn);
    memset(host, 1, hn);
    EXPECT_RC(gdr_pin_buffer(g, (unsigned long)(uintptr_t)host, MiB, 0, 0, &mh), EINVAL);
    EXPECT_RC(gdr_pin_buffer_v2(g, (unsigned long)(uintptr_t)host, MiB, 0, &mh), EINVAL);
    free(host);
    if (vmm_alloc(2 * MiB, 1, &m)) {
        EXPECT_RC(gdr_pin_buffer(g, m.dptr, 0, 0, 0, &mh), EINVAL);
        EXPECT_RC(gdr_pin_buffer_v2(g, m.dptr, 0, 0, &mh), EINVAL);
        EXPECT_RC(gdr_pin_buffer(g, m.dptr, MiB, 0, 0, NULL), EINVAL);
        EXPECT_RC(gdr_pin_buffer_v2(g, m.dptr, MiB, 0, NULL), EINVAL);
        EXPECT_RC(gdr_pin_buffer(NULL, m.dptr, MiB, 0, 0, &mh), EINVAL);
        /* A range running past the end of the allocation is refused. */
        int rc = gdr_pin_buffer(g, m.dptr + m.size - 4096, MiB, 0, 0, &mh);
        CHECK(rc != 0, "refusals: a pin running %zu bytes past the allocation's end succeeded",
              MiB - 4096);
        if (rc == 0)
            EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
        /* The good pin still works after all that. */
        if (EXPECT_RC(gdr_pin_buffer(g, m.dptr, MiB, 0, 0, &mh), 0))
            EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
        vmm_free(&m);
    }
}

/* ---- 10. info and versions ---- */

static int info_equal(const gdr_info_v2_t *a, const gdr_info_v2_t *b) {
    return a->va == b->va && a->mapped_size == b->mapped_size && a->page_size == b->page_size &&
           a->tm_cycles == b->tm_cycles && a->cycles_per_ms == b->cycles_per_ms &&
           a->mapped == b->mapped && a->wc_mapping == b->wc_mapping;
}

static void compare_infos(gdr_mh_t mh, CUdeviceptr addr, size_t n, int mapped,
                          const char *when) {
    typedef int (*get_info_v1_t)(gdr_t, gdr_mh_t, void *);
    gdr_info_v2_t a, b;
    memset(&a, 0xcc, sizeof a);
    memset(&b, 0x33, sizeof b);
    if (!EXPECT_RC(gdr_get_info(g, mh, &a), 0) || !EXPECT_RC(gdr_get_info_v2(g, mh, &b), 0))
        return;
    CHECK(info_equal(&a, &b) && a.mapping_type == b.mapping_type,
          "info: %s: gdr_get_info and gdr_get_info_v2 disagree", when);
    check_info(&b, addr, n, mapped, "info");
    CHECK(b.tm_cycles == 0 && b.cycles_per_ms == 0, "info: %s: tm_cycles %llu cycles_per_ms %u",
          when, (unsigned long long)b.tm_cycles, b.cycles_per_ms);
    /* The exported v1 symbol fills the first 40 bytes only. */
    void *sym = dlsym(RTLD_DEFAULT, "gdr_get_info");
    get_info_v1_t v1;
    if (CHECK(sym != NULL, "info: libgdrapi exports no gdr_get_info symbol")) {
        memcpy(&v1, &sym, sizeof v1);
        unsigned char raw[sizeof(gdr_info_v2_t)];
        memset(raw, 0xcc, sizeof raw);
        if (EXPECT_RC(v1(g, mh, raw), 0)) {
            gdr_info_v2_t c;
            memcpy(&c, raw, sizeof c);
            CHECK(info_equal(&c, &b), "info: %s: the v1 gdr_get_info symbol disagrees with v2",
                  when);
            int untouched = 1;
            for (size_t i = 40; i < sizeof raw; i++)
                untouched &= raw[i] == 0xcc;
            CHECK(untouched, "info: %s: the v1 gdr_get_info wrote past its 40-byte struct", when);
        }
    }
}

static void case_info_and_versions(void) {
    struct rng *r = &main_rng;
    int major = -1, minor = -1;
    gdr_runtime_get_version(&major, &minor);
    CHECK(major == 2 && minor == 6, "info: runtime version %d.%d, want 2.6", major, minor);
    major = minor = -1;
    if (EXPECT_RC(gdr_driver_get_version(g, &major, &minor), 0)) {
        if (backend == GDR_GDR_BACKEND_GDRDRV)
            CHECK(((major << MAJOR_VERSION_SHIFT) | minor) >= MINIMUM_GDRDRV_VERSION,
                  "info: gdrdrv version %d.%d below the minimum", major, minor);
        else
            CHECK(major == 2 && minor == 6, "info: driver version %d.%d on %s, want 2.6", major,
                  minor, backend_name(backend));
    }
    EXPECT_RC(gdr_driver_get_version(g, NULL, &minor), EINVAL);

    int v = -1;
    if (EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v), 0))
        CHECK(v == (backend == GDR_GDR_BACKEND_DMABUF),
              "info: USING_DMA_BUF_MMAP %d on %s", v, backend_name(backend));
    if (EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v), 0) &&
        backend != GDR_GDR_BACKEND_GDRDRV)
        CHECK(v == 1, "info: USE_PERSISTENT_MAPPING %d on %s, want 1", v, backend_name(backend));
    EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_MAX, &v), EINVAL);
    EXPECT_RC(gdr_get_attribute(g, (gdr_attr_t)0, &v), EINVAL);
    EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP, NULL), EINVAL);

    static const struct {
        gdr_mapping_type_t t;
        const char *s;
    } names[] = {{GDR_MAPPING_TYPE_NONE, "None"},
                 {GDR_MAPPING_TYPE_WC, "Write Combining"},
                 {GDR_MAPPING_TYPE_CACHING, "Caching"},
                 {GDR_MAPPING_TYPE_DEVICE, "Device"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *s = NULL;
        if (EXPECT_RC(gdr_get_mapping_type_string(names[i].t, &s), 0))
            CHECK(s && strcmp(s, names[i].s) == 0, "info: mapping type %d is named \"%s\"",
                  (int)names[i].t, s ? s : "(null)");
    }
    const char *s = NULL;
    EXPECT_RC(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_MAX, &s), EINVAL);
    EXPECT_RC(gdr_get_mapping_type_string(GDR_MAPPING_TYPE_WC, NULL), EINVAL);

    struct vmm m;
    if (!vmm_alloc(4 * MiB, 1, &m))
        return;
    CUdeviceptr dptr = m.dptr + 65536; /* page aligned: gdr_map maps only such pins */
    size_t n = 300000;
    gdr_mh_t mh = {0};
    if (EXPECT_RC(gdr_pin_buffer(g, dptr, n, 0, 0, &mh), 0)) {
        gdr_info_v2_t info;
        compare_infos(mh, dptr, n, 0, "before map");
        if (EXPECT_RC(gdr_get_info_v2(g, mh, &info), 0)) {
            void *base = NULL;
            EXPECT_RC(gdr_map_v2(g, mh, &base, info.mapped_size, GDR_MAP_FLAG_REQ_CACHE_MAPPING),
                      EINVAL);
            EXPECT_RC(gdr_map_v2(g, mh, &base, info.mapped_size, GDR_MAP_FLAG_REQ_DEVICE_MAPPING),
                      EINVAL);
            EXPECT_RC(gdr_map_v2(g, mh, &base, info.mapped_size, 7), EINVAL);
            EXPECT_RC(gdr_map(g, mh, &base, info.mapped_size + 1), EINVAL);
            EXPECT_RC(gdr_map(g, mh, &base, 0), EINVAL);
            EXPECT_RC(gdr_map(g, mh, NULL, info.mapped_size), EINVAL);
            compare_infos(mh, dptr, n, 0, "after refused maps");
            base = NULL;
            if (EXPECT_RC(gdr_map_v2(g, mh, &base, info.mapped_size, GDR_MAP_FLAG_REQ_WC_MAPPING),
                          0)) {
                compare_infos(mh, dptr, n, 1, "after a WC map");
                roundtrip(r, mh, (char *)base + (dptr - info.va), dptr, n, NULL,
                          "info: REQ_WC mapping");
                EXPECT_RC(gdr_unmap(g, mh, base, info.mapped_size), 0);
                compare_infos(mh, dptr, n, 0, "after unmap");
            }
            if (EXPECT_RC(gdr_map_v2(g, mh, &base, info.mapped_size, GDR_MAP_FLAG_DEFAULT), 0)) {
                compare_infos(mh, dptr, n, 1, "after a DEFAULT map");
                EXPECT_RC(gdr_unmap(g, mh, base, info.mapped_size), 0);
            }
        }
        EXPECT_RC(gdr_get_info_v2(g, mh, NULL), EINVAL);
        EXPECT_RC(gdr_unpin_buffer(g, mh), 0);
    }
    vmm_free(&m);
}

/* ---- main ---- */

static void on_alarm(int sig) {
    static const char msg[] = "semantics: timed out (SEMANTICS_TIMEOUT_S)\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) {
        /* nothing more to do */
    }
    _exit(1);
}

/* ---- copy paths: every size class of gdr_copy_{to,from}_mapping ---- */

/* By default libgdrapi copies large sizes off the one-thread mapping (several threads, the
 * copy engine); GDR_CAPI_COPY=mapping keeps them on it. Whatever the path, for sizes across every class and
 * unaligned offsets: bytes written with gdr_copy_to_mapping are what the GPU holds, and only
 * those bytes change; stores made straight through the mapping just before are what
 * gdr_copy_from_mapping reads (it fences them first); bytes the GPU wrote are what it reads. */
static void case_copy_paths(void) {
    struct rng *r = &main_rng;
    static const size_t sizes[] = {8, 4 * KiB, 8 * KiB + 1, 16 * KiB, 64 * KiB + 3, MiB,
                                   4 * MiB + 5};
    static const size_t offsets[] = {0, 1, 4095};
    size_t total = 8 * MiB;
    struct vmm m;
    if (!vmm_alloc(total, 1, &m))
        return;
    struct pinmap p;
    if (!pin_and_map(g, m.dptr, total, 0, &p, "copy_paths")) {
        vmm_free(&m);
        return;
    }
    unsigned char *want = xmalloc(total), *got = xmalloc(total), *src = xmalloc(total);
    fill_random(r, want, total);
    if (!CU_OK(cu.MemcpyHtoD(m.dptr, want, total)) || !CU_OK(cu.CtxSynchronize()))
        goto out;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        for (size_t oi = 0; oi < sizeof offsets / sizeof offsets[0]; oi++) {
            size_t n = sizes[si], off = offsets[oi] + (si * 4099) % (total - n - 4096);
            char *user = (char *)p.user + off;
            char what[128];
            snprintf(what, sizeof what, "copy_paths: %zu bytes at +%zu", n, off);
            /* Write: new bytes, each different from the old one. */
            fill_random(r, src, n);
            for (size_t i = 0; i < n; i++)
                src[i] = (unsigned char)(want[off + i] ^ (1 + src[i] % 255));
            if (!EXPECT_RC(gdr_copy_to_mapping(p.mh, user, src, n), 0))
                continue;
            memcpy(want + off, src, n);
            memset(got, 0xee, total);
            if (CU_OK(cu.MemcpyDtoH(got, m.dptr, total)))
                SAME_BYTES(got, want, total, "%s: the GPU after gdr_copy_to_mapping", what);
            /* Stores straight through the mapping, then a read of the same bytes. */
            fill_random(r, src, n);
            memcpy(user, src, n);
            memcpy(want + off, src, n);
            memset(got, 0xee, n);
            if (EXPECT_RC(gdr_copy_from_mapping(p.mh, got, user, n), 0))
                SAME_BYTES(got, src, n, "%s: read after stores through the mapping", what);
            /* Bytes the GPU wrote. */
            fill_random(r, src, n);
            if (CU_OK(cu.MemcpyHtoD(m.dptr + off, src, n)) && CU_OK(cu.CtxSynchronize())) {
                memcpy(want + off, src, n);
                memset(got, 0xee, n);
                if (EXPECT_RC(gdr_copy_from_mapping(p.mh, got, user, n), 0))
                    SAME_BYTES(got, src, n, "%s: read after cuMemcpyHtoD", what);
            }
        }
    }
out:
    free(want);
    free(got);
    free(src);
    unmap_and_unpin(g, &p);
    vmm_free(&m);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"orders", case_orders},
    {"two_pins_one_buffer", case_two_pins_one_buffer},
    {"threads", case_threads},
    {"unaligned_small", case_unaligned_small},
    {"close_releases", case_close_releases},
    {"free_while_pinned", case_free_while_pinned},
    {"fork", case_fork},
    {"force_pcie", case_force_pcie},
    {"refusals", case_refusals},
    {"info_and_versions", case_info_and_versions},
    {"copy_paths", case_copy_paths},
};

int main(int argc, char **argv) {
    const char *req = getenv("GDR_REQUIRE_GPU");
    int require = req && strcmp(req, "1") == 0;
    const char *t = getenv("SEMANTICS_TIMEOUT_S");
    const char *seed_env = getenv("SEMANTICS_SEED");
    unsigned timeout = t ? (unsigned)strtoul(t, NULL, 10) : 540;
    signal(SIGALRM, on_alarm);
    signal(SIGPIPE, SIG_IGN); /* a child that died early must not kill us through a pipe */
    alarm(timeout ? timeout : 540);
    seed0 = seed_env ? strtoull(seed_env, NULL, 0)
                     : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    rng_seed(&main_rng, 0);

    for (int i = 1; i < argc; i++) {
        int known = 0;
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            known |= strcmp(argv[i], cases[c].name) == 0;
        if (!known) {
            fprintf(stderr, "semantics: unknown case %s\n", argv[i]);
            return 2;
        }
    }

    char why[256] = "";
    if (!cuda_setup(why, sizeof why) ||
        (g = gdr_open()) == NULL) {
        if (!why[0])
            snprintf(why, sizeof why, "gdr_open() returned NULL");
        if (require) {
            printf("semantics: no GPU (GDR_REQUIRE_GPU=1): %s\n", why);
            return 1;
        }
        fprintf(stderr, "semantics: %s\n", why);
        printf("semantics: skipped: no GPU\n");
        return 0;
    }

    if (EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_GDR_BACKEND, &backend), 0))
        CHECK(backend >= GDR_GDR_BACKEND_GDRDRV && backend <= GDR_GDR_BACKEND_VULKAN,
              "GDR_ATTR_GDR_BACKEND is %d", backend);
    persistent = backend == GDR_GDR_BACKEND_DMABUF || backend == GDR_GDR_BACKEND_VULKAN;
    printf("semantics: backend %s, seed %llu\n", backend_name(backend),
           (unsigned long long)seed0);
    fflush(stdout);

    int passed = 0, failed = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        if (argc > 1) {
            int wanted = 0;
            for (int i = 1; i < argc; i++)
                wanted |= strcmp(argv[i], cases[c].name) == 0;
            if (!wanted)
                continue;
        }
        cur_case = cases[c].name;
        int before = failure_count();
        time_t t0 = time(NULL);
        cases[c].fn();
        int k = failure_count() - before;
        if (k == 0) {
            printf("ok %s\n", cases[c].name);
            passed++;
        } else {
            printf("FAIL %s (%d checks failed, %lds)\n", cases[c].name, k,
                   (long)(time(NULL) - t0));
            failed++;
        }
        fflush(stdout);
    }
    cur_case = "teardown";
    EXPECT_RC(gdr_close(g), 0);
    EXPECT_RC(gdr_close(g), EINVAL);

    printf("semantics: %d passed, %d failed\n", passed, failed);
    return failure_count() ? 1 : 0;
}
