/*
 * libgdrapi in a UCX process (crates/gdr-capi/src/ucx.rs, docs/ucx.md). UCX fails a whole
 * registration when one gdr_pin_buffer fails, so libgdrapi either stays out of its way or
 * stages the pins it cannot map. UCX's gdr_copy module is stood in for by a library that
 * carries its soname (libuct_cuda_gdrcopy.so.0), built by capi-check.sh.
 *
 *   ucx_staged guard STUB      no allocator in the process, the module loaded: gdr_open gives
 *                              NULL (needs no GPU: the decision comes before any CUDA call)
 *   ucx_staged staged          GDR_CAPI_UCX=staged, plain cuMemAlloc memory: a staged pin,
 *                              its copies checked byte for byte against cuMemcpy, its addresses
 *                              inaccessible, every refusal, memory freed under the pin not
 *                              reached (callback flag 1, copies EINVAL)
 *   ucx_staged allocator STUB  under `gdr run`, the module loaded: gdr_open works, allocator
 *                              memory pins write-combined, stream-ordered memory is staged
 *
 * Fresh random bytes (seed printed; UCX_STAGED_SEED=N repeats), poisoned outputs. Output: "ok"
 * or "FAIL" per check, then "ucx_staged: N passed, M failed". Without a GPU the GPU modes say
 * "ucx_staged: skipped: no GPU" (exit 1 under GDR_REQUIRE_GPU=1). libcuda.so.1 is opened with
 * dlopen (no CUDA headers).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gdrapi.h"

static int passed, failed;

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok" : "FAIL", what);
    fflush(stdout);
    if (ok)
        passed++;
    else
        failed++;
}

static int finish(const char *mode) {
    printf("ucx_staged %s: %d passed, %d failed\n", mode, passed, failed);
    return failed ? 1 : 0;
}

static int skip(const char *why) {
    const char *req = getenv("GDR_REQUIRE_GPU");
    if (req && strcmp(req, "1") == 0) {
        printf("FAIL no GPU under GDR_REQUIRE_GPU=1: %s\n", why);
        return 1;
    }
    printf("ucx_staged: skipped: no GPU (%s)\n", why);
    return 0;
}

/* ---- the driver API, by dlopen ---- */

typedef unsigned long long CUdeviceptr;
typedef int (*fn_init)(unsigned);
typedef int (*fn_dev_get)(int *, int);
typedef int (*fn_ctx_retain)(void **, int);
typedef int (*fn_ctx_set)(void *);
typedef int (*fn_alloc)(CUdeviceptr *, size_t);
typedef int (*fn_free)(CUdeviceptr);
typedef int (*fn_htod)(CUdeviceptr, const void *, size_t);
typedef int (*fn_dtoh)(void *, CUdeviceptr, size_t);
typedef int (*fn_alloc_async)(CUdeviceptr *, size_t, void *);
typedef int (*fn_free_async)(CUdeviceptr, void *);
typedef int (*fn_sync)(void);

static struct {
    fn_alloc alloc;
    fn_free free;
    fn_htod htod;
    fn_dtoh dtoh;
    fn_alloc_async alloc_async;
    fn_free_async free_async;
    fn_sync sync;
} cu;

/* Opens GPU 0's primary context; 0 when there is no usable GPU. */
static int cuda_up(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return 0;
    fn_init init = (fn_init)dlsym(lib, "cuInit");
    fn_dev_get dev_get = (fn_dev_get)dlsym(lib, "cuDeviceGet");
    fn_ctx_retain retain = (fn_ctx_retain)dlsym(lib, "cuDevicePrimaryCtxRetain");
    fn_ctx_set set = (fn_ctx_set)dlsym(lib, "cuCtxSetCurrent");
    /* By the global scope, so that a preloaded allocator's entry points are the ones called. */
    cu.alloc = (fn_alloc)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    cu.free = (fn_free)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
    cu.htod = (fn_htod)dlsym(lib, "cuMemcpyHtoD_v2");
    cu.dtoh = (fn_dtoh)dlsym(lib, "cuMemcpyDtoH_v2");
    cu.alloc_async = (fn_alloc_async)dlsym(lib, "cuMemAllocAsync");
    cu.free_async = (fn_free_async)dlsym(lib, "cuMemFreeAsync");
    cu.sync = (fn_sync)dlsym(lib, "cuCtxSynchronize");
    if (!init || !dev_get || !retain || !set || !cu.alloc || !cu.free || !cu.htod || !cu.dtoh ||
        !cu.sync)
        return 0;
    int dev;
    void *ctx;
    return init(0) == 0 && dev_get(&dev, 0) == 0 && retain(&ctx, dev) == 0 && set(ctx) == 0;
}

/* ---- random bytes ---- */

static uint64_t rng;
static uint8_t next_byte(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint8_t)rng;
}
static void fill_random(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = next_byte();
}

/* Whether a load from `p` in a child process faults (the parent is unharmed). */
static int load_faults(const volatile uint8_t *p) {
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        volatile uint8_t x = *p;
        (void)x;
        _exit(0);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid) return 0;
    return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

/*
 * A staged pin of `len` bytes of device memory at `d` (GPU-page aligned, `len` a multiple of
 * 64 KiB): map, copies both ways at many offsets and sizes checked against cuMemcpy, the
 * mapping's addresses inaccessible, refusals past the end, unmap, unpin.
 */
static void staged_pin(gdr_t g, CUdeviceptr d, size_t len, const char *what) {
    char msg[256];
    gdr_mh_t mh;
    int rc = gdr_pin_buffer(g, d, len, 0, 0, &mh);
    snprintf(msg, sizeof msg, "%s: gdr_pin_buffer of %zu bytes succeeds (staged) (rc %d)", what, len, rc);
    check(rc == 0, msg);
    if (rc) return;
    void *va = NULL;
    rc = gdr_map(g, mh, &va, len);
    check(rc == 0 && va, "staged: gdr_map gives addresses");
    if (rc) {
        gdr_unpin_buffer(g, mh);
        return;
    }
    gdr_info_v2_t info;
    memset(&info, 0xee, sizeof info);
    rc = gdr_get_info_v2(g, mh, &info);
    check(rc == 0 && info.va == d && info.mapped_size == len && info.mapped && !info.wc_mapping &&
              info.mapping_type == GDR_MAPPING_TYPE_NONE,
          "staged: gdr_get_info_v2: va, size, mapped, not write-combined, mapping type NONE");
    check(load_faults((const volatile uint8_t *)va), "staged: a load through the addresses faults");

    uint8_t *src = malloc(len), *back = malloc(len), *dev = malloc(len);
    const size_t sizes[] = {1, 7, 64, 4093, 65536, 65536 + 17, 200003};
    const size_t offs[] = {0, 1, 63, 4096 + 5, 65536 * 2 - 3};
    int to_ok = 1, from_ok = 1, n = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t j = 0; j < sizeof offs / sizeof *offs; j++) {
            size_t s = sizes[i], o = offs[j];
            if (o + s > len) continue;
            n++;
            /* To the GPU: the device bytes around the range must stay as they were. */
            /* cuMemcpyHtoD from pageable memory may return before its DMA has landed, and
               gdr's copy engine runs on a stream of its own, unordered with the legacy one:
               the context is synchronised first, or the DMA may land over the copy. */
            fill_random(dev, len);
            to_ok &= cu.htod(d, dev, len) == 0 && cu.sync() == 0;
            fill_random(src, s);
            to_ok &= gdr_copy_to_mapping(mh, (uint8_t *)va + o, src, s) == 0;
            memcpy(dev + o, src, s);
            memset(back, 0xee, len);
            to_ok &= cu.dtoh(back, d, len) == 0 && memcmp(back, dev, len) == 0;
            /* From the GPU, into a poisoned buffer with guards. */
            fill_random(dev, len);
            from_ok &= cu.htod(d, dev, len) == 0 && cu.sync() == 0;
            memset(back, 0xee, s + 2);
            from_ok &= gdr_copy_from_mapping(mh, back + 1, (uint8_t *)va + o, s) == 0;
            from_ok &= memcmp(back + 1, dev + o, s) == 0 && back[0] == 0xee && back[s + 1] == 0xee;
        }
    snprintf(msg, sizeof msg, "staged: %d copies to the GPU, every byte as cuMemcpy reads it", n);
    check(to_ok, msg);
    snprintf(msg, sizeof msg, "staged: %d copies from the GPU, every byte and nothing past", n);
    check(from_ok, msg);
    check(gdr_copy_to_mapping(mh, (uint8_t *)va + len - 4, src, 8) == EINVAL &&
              gdr_copy_from_mapping(mh, back, (uint8_t *)va - 1, 2) == EINVAL,
          "staged: copies past either end are EINVAL");
    check(gdr_unmap(g, mh, va, len) == 0, "staged: gdr_unmap");
    check(gdr_copy_to_mapping(mh, va, src, 1) == EINVAL, "staged: a copy after gdr_unmap is EINVAL");
    check(gdr_unpin_buffer(g, mh) == 0, "staged: gdr_unpin_buffer");
    check(gdr_unpin_buffer(g, mh) == EINVAL, "staged: a second unpin is EINVAL");
    free(src);
    free(back);
    free(dev);
}

static int mode_guard(const char *stub) {
    check(dlsym(RTLD_DEFAULT, "gdr_alloc_abi_version") == NULL,
          "guard: gdr's allocator is not in this process");
    void *m = dlopen(stub, RTLD_NOW);
    check(m != NULL, "guard: the stand-in for UCX's gdr_copy module loads");
    if (!m) return finish("guard");
    gdr_t g = gdr_open();
    check(g == NULL, "guard: gdr_open gives NULL where UCX's module is loaded without the allocator");
    if (g) gdr_close(g);
    return finish("guard");
}

static int mode_staged(void) {
    setenv("GDR_CAPI_UCX", "staged", 1);
    if (!cuda_up()) return skip("no CUDA device");
    gdr_t g = gdr_open();
    if (!g) return skip("gdr_open gave NULL");
    const size_t len = 4 << 16;
    CUdeviceptr d = 0;
    check(cu.alloc(&d, len) == 0 && d % 65536 == 0, "staged: cuMemAlloc of 256 KiB (plain memory)");
    if (d) {
        staged_pin(g, d, len, "plain cuMemAlloc memory");
        /* A range that is not CUDA memory at all is still refused. */
        gdr_mh_t mh;
        uint8_t host[64];
        check(gdr_pin_buffer(g, (unsigned long)(uintptr_t)host, sizeof host, 0, 0, &mh) == EINVAL,
              "staged: host memory is still EINVAL");
        cu.free(d);
    }
    /* Memory freed under a staged pin: the copies must not reach what takes its place. */
    CUdeviceptr f = 0, n = 0;
    if (cu.alloc(&f, len) == 0) {
        gdr_mh_t mh;
        void *va = NULL;
        int flag = -1, ok = gdr_pin_buffer(g, f, len, 0, 0, &mh) == 0 && gdr_map(g, mh, &va, len) == 0;
        check(ok && gdr_get_callback_flag(g, mh, &flag) == 0 && flag == 0,
              "staged: a fresh pin's callback flag is 0");
        cu.free(f);
        /* The driver tends to hand the same address out again: the new owner's bytes. */
        uint8_t mine[256], back[256], one = 0x77;
        fill_random(mine, sizeof mine);
        int again = cu.alloc(&n, len) == 0 && cu.htod(n, mine, sizeof mine) == 0;
        if (ok) {
            check(gdr_get_callback_flag(g, mh, &flag) == 0 && flag == 1,
                  "staged: after cuMemFree the callback flag is 1");
            check(gdr_copy_to_mapping(mh, va, &one, 1) == EINVAL &&
                      gdr_copy_from_mapping(mh, back, va, sizeof back) == EINVAL,
                  "staged: copies after cuMemFree are EINVAL");
            check(!again || (cu.dtoh(back, n, sizeof back) == 0 &&
                             memcmp(back, mine, sizeof back) == 0),
                  "staged: the allocation made after the free kept its bytes");
            gdr_unmap(g, mh, va, len);
            check(gdr_unpin_buffer(g, mh) == 0, "staged: unpin of freed memory");
        }
        if (n) cu.free(n);
    }
    check(gdr_close(g) == 0, "staged: gdr_close");
    return finish("staged");
}

static int mode_allocator(const char *stub) {
    if (!dlsym(RTLD_DEFAULT, "gdr_alloc_abi_version")) {
        check(0, "allocator: run this mode under `gdr run` (gdr's allocator is not loaded)");
        return finish("allocator");
    }
    void *m = dlopen(stub, RTLD_NOW);
    check(m != NULL, "allocator: the stand-in for UCX's gdr_copy module loads");
    if (!cuda_up()) return skip("no CUDA device");
    gdr_t g = gdr_open();
    check(g != NULL, "allocator: gdr_open works where UCX's module and the allocator are loaded");
    if (!g) return finish("allocator");
    /* Allocator memory: pinned and mapped write-combined, as without UCX. */
    const size_t len = 4 << 16;
    CUdeviceptr d = 0;
    check(cu.alloc(&d, len) == 0, "allocator: cuMemAlloc (the allocator's)");
    gdr_mh_t mh;
    if (d && gdr_pin_buffer(g, d, len, 0, 0, &mh) == 0) {
        void *va = NULL;
        gdr_info_v2_t info;
        int ok = gdr_map(g, mh, &va, len) == 0 && gdr_get_info_v2(g, mh, &info) == 0 &&
                 info.mapping_type == GDR_MAPPING_TYPE_WC;
        uint8_t x = 0x5a, y = 0;
        ok = ok && gdr_copy_to_mapping(mh, va, &x, 1) == 0 && cu.dtoh(&y, d, 1) == 0 && y == 0x5a;
        check(ok, "allocator: its memory pins and maps write-combined, and a byte goes through");
        if (va) gdr_unmap(g, mh, va, len);
        gdr_unpin_buffer(g, mh);
    } else {
        check(0, "allocator: its memory pins");
    }
    if (d) cu.free(d);
    /* Stream-ordered memory passes through the allocator: staged, not refused. */
    CUdeviceptr a = 0;
    if (cu.alloc_async && cu.alloc_async(&a, len, NULL) == 0 && cu.sync() == 0) {
        staged_pin(g, a, len, "cuMemAllocAsync memory");
        cu.free_async(a, NULL);
        cu.sync();
    } else {
        check(0, "allocator: cuMemAllocAsync of 256 KiB");
    }
    check(gdr_close(g) == 0, "allocator: gdr_close");
    return finish("allocator");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *seed_env = getenv("UCX_STAGED_SEED");
    rng = seed_env ? strtoull(seed_env, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    if (rng == 0) rng = 1;
    printf("seed %llu\n", (unsigned long long)rng);
    if (argc == 3 && strcmp(argv[1], "guard") == 0) return mode_guard(argv[2]);
    if (argc == 2 && strcmp(argv[1], "staged") == 0) return mode_staged();
    if (argc == 3 && strcmp(argv[1], "allocator") == 0) return mode_allocator(argv[2]);
    fprintf(stderr, "usage: ucx_staged guard STUB | staged | allocator STUB\n");
    return 2;
}
