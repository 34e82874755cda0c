/*
 * A client that dlclose()s libgdrapi while it still holds a handle, a mapped allocation and a
 * mapping (issue 42, fault 4). The contract (gdrapi.h): once loaded, the library stays loaded
 * for the life of the process (it is linked with -z nodelete), so the mapping, the handle and
 * the driver state behind them stay valid after the dlclose, and the exit is clean.
 *
 * Usage: unload PATH_OF_LIBGDRAPI. The program is not linked with -lgdrapi: the only
 * reference to the library is the dlopen below.
 *
 * Without a GPU (gdr_open gives NULL) it checks only that the library stays loaded and prints
 * "unload: skipped: no GPU" (exit 1 instead under GDR_REQUIRE_GPU=1). With one, it writes
 * fresh random bytes through the mapping, dlclose()s, then checks that the library is still
 * loaded at the same address, that the mapping still reads back those bytes, that the GPU sees
 * new bytes written through it (libcuda's cuMemcpyDtoH), and that the functions looked up
 * before the dlclose still free, unmap and close everything.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -I include tests/c/unload.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gdrapi.h"

static int failures = 0;

#define CHECK(cond, ...)                                                       \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)

struct api {
    gdr_t (*open)(void);
    int (*close)(gdr_t);
    int (*alloc_mapped)(gdr_t, size_t, unsigned long *, gdr_mh_t *);
    int (*free_mapped)(gdr_t, gdr_mh_t);
    int (*map)(gdr_t, gdr_mh_t, void **, size_t);
    int (*unmap)(gdr_t, gdr_mh_t, void *, size_t);
    int (*to)(gdr_mh_t, void *, const void *, size_t);
    int (*from)(gdr_mh_t, void *, const void *, size_t);
};

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "FAIL: %s not found: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

static void lookup(void *lib, struct api *a) {
    *(void **)&a->open = sym(lib, "gdr_open");
    *(void **)&a->close = sym(lib, "gdr_close");
    *(void **)&a->alloc_mapped = sym(lib, "gdr_alloc_mapped");
    *(void **)&a->free_mapped = sym(lib, "gdr_free_mapped");
    *(void **)&a->map = sym(lib, "gdr_map");
    *(void **)&a->unmap = sym(lib, "gdr_unmap");
    *(void **)&a->to = sym(lib, "gdr_copy_to_mapping");
    *(void **)&a->from = sym(lib, "gdr_copy_from_mapping");
}

/* Where the library's gdr_open lives: its load address, to tell a reload from a survivor. */
static void *base_of(void *fn) {
    Dl_info info;
    return dladdr(fn, &info) ? info.dli_fbase : NULL;
}

static void fill(unsigned char *p, size_t n, unsigned *seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)rand_r(seed);
}

/* Dropped by the library's dlclose when it is not kept loaded: then this is NULL. */
static int still_loaded(const char *path) {
    void *again = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!again)
        return 0;
    dlclose(again);
    return 1;
}

/* Reads device memory with libcuda, in device 0's primary context (the one gdr uses): -1
 * when libcuda or a function is missing, else the CUresult. */
static int gpu_read(void *dst, unsigned long dptr, size_t n) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!cuda)
        return -1;
    int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
    int (*device_get)(int *, int) = (int (*)(int *, int))dlsym(cuda, "cuDeviceGet");
    int (*retain)(void **, int) = (int (*)(void **, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
    int (*set)(void *) = (int (*)(void *))dlsym(cuda, "cuCtxSetCurrent");
    int (*dtoh)(void *, unsigned long long, size_t) =
        (int (*)(void *, unsigned long long, size_t))dlsym(cuda, "cuMemcpyDtoH_v2");
    if (!(init && device_get && retain && set && dtoh))
        return -1;
    int dev = 0, rc;
    void *ctx = NULL;
    if ((rc = init(0)) || (rc = device_get(&dev, 0)) || (rc = retain(&ctx, dev)) || (rc = set(ctx)))
        return rc;
    return dtoh(dst, dptr, n);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: unload PATH_OF_LIBGDRAPI\n");
        return 2;
    }
    const char *path = argv[1];
    const char *require = getenv("GDR_REQUIRE_GPU");
    int required = require && strcmp(require, "1") == 0;
    CHECK(!still_loaded(path), "libgdrapi is loaded before the dlopen");

    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "FAIL: dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    struct api a;
    lookup(lib, &a);
    void *base = base_of((void *)a.open);
    gdr_t g = a.open();

    if (!g) {
        CHECK(dlclose(lib) == 0, "dlclose: %s", dlerror());
        CHECK(still_loaded(path), "libgdrapi was unloaded by dlclose");
        if (failures) {
            fprintf(stderr, "unload: %d failed\n", failures);
            return 1;
        }
        printf("unload: skipped: no GPU (the library stayed loaded after dlclose)\n");
        return required ? 1 : 0;
    }

    size_t size = (1 << 20) + 77;
    unsigned long dptr = 0;
    gdr_mh_t mh = {0};
    int rc = a.alloc_mapped(g, size, &dptr, &mh);
    if (rc != 0) {
        fprintf(stderr, "FAIL: gdr_alloc_mapped: %d\n", rc);
        return 1;
    }
    void *va = NULL;
    rc = a.map(g, mh, &va, size);
    if (rc != 0) {
        fprintf(stderr, "FAIL: gdr_map: %d\n", rc);
        return 1;
    }
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
    unsigned char *want = malloc(size), *got = malloc(size);
    if (!want || !got)
        return 1;
    fill(want, size, &seed);
    CHECK(a.to(mh, va, want, size) == 0, "copy to the mapping");

    /* The client lets go of the library with everything still held. */
    CHECK(dlclose(lib) == 0, "dlclose: %s", dlerror());
    CHECK(still_loaded(path), "libgdrapi was unloaded by dlclose");

    /* The mapping still holds the bytes (read with the CPU's own loads, not the library's). */
    memset(got, 0x5a, size);
    memcpy(got, va, size);
    CHECK(memcmp(got, want, size) == 0, "the mapping lost its bytes after dlclose");

    /* New bytes through the mapping reach the GPU (libcuda, which gdr_open loaded). */
    fill(want, size, &seed);
    memcpy(va, want, size);
    __sync_synchronize();
    memset(got, 0xa5, size);
    rc = gpu_read(got, dptr, size);
    CHECK(rc == 0, "cuMemcpyDtoH: %d", rc);
    if (rc == 0)
        CHECK(memcmp(got, want, size) == 0, "the GPU does not see bytes written after dlclose");
    memset(got, 0x3c, size);
    CHECK(a.from(mh, got, va, size) == 0, "copy from the mapping after dlclose");
    CHECK(memcmp(got, want, size) == 0, "gdr_copy_from_mapping after dlclose differs");

    /* Opened again: the same library at the same place, and a second handle works too. */
    void *lib2 = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECK(lib2 != NULL, "dlopen again: %s", dlerror());
    if (lib2) {
        struct api b;
        lookup(lib2, &b);
        CHECK(base_of((void *)b.open) == base, "libgdrapi came back at another address");
        gdr_t g2 = b.open();
        CHECK(g2 != NULL, "gdr_open after the dlclose");
        if (g2)
            CHECK(b.close(g2) == 0, "gdr_close of the second handle");
    }

    /* The first handle, through the pointers looked up before the dlclose. */
    CHECK(a.unmap(g, mh, va, size) == 0, "gdr_unmap after dlclose");
    CHECK(a.free_mapped(g, mh) == 0, "gdr_free_mapped after dlclose");
    CHECK(a.close(g) == 0, "gdr_close after dlclose");
    if (lib2)
        dlclose(lib2);
    free(want);
    free(got);
    if (failures) {
        fprintf(stderr, "unload: %d failed\n", failures);
        return 1;
    }
    printf("unload: all checks passed\n");
    return 0;
}
