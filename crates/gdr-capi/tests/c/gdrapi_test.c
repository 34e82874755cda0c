/*
 * Exercises every function of gdr's libgdrapi through gdrapi.h, as a C program would.
 *
 * Without a usable GPU, gdr_open() returns NULL and the test prints "skipped" and exits 0
 * (exit 1 instead when GDR_REQUIRE_GPU=1). With one, mapped memory comes from the extension
 * gdr_alloc_mapped(); pinning of cuMemAlloc memory is exercised when some backend can pin
 * here, and its refusal is checked otherwise. libcuda is opened with dlopen (when present) to
 * check through cuMemcpy that the GPU sees what the CPU wrote and the reverse.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -I include tests/c/gdrapi_test.c -L DIR -lgdrapi -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

#define EXPECT_RC(call, want)                                                  \
    do {                                                                       \
        int rc_ = (call);                                                      \
        CHECK(rc_ == (want), "%s returned %d, expected %d", #call, rc_, (want)); \
    } while (0)

typedef int (*cu_memcpy_htod_t)(unsigned long long, const void *, size_t);
typedef int (*cu_memcpy_dtoh_t)(void *, unsigned long long, size_t);
typedef int (*cu_mem_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_mem_free_t)(unsigned long long);
typedef int (*cu_sync_t)(void);
typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);

struct cuda {
    cu_memcpy_htod_t htod;
    cu_memcpy_dtoh_t dtoh;
    cu_mem_alloc_t alloc;
    cu_mem_free_t free_;
    cu_sync_t sync;
};

static int load_cuda(struct cuda *c) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib)
        return 0;
    c->htod = (cu_memcpy_htod_t)dlsym(lib, "cuMemcpyHtoD_v2");
    c->dtoh = (cu_memcpy_dtoh_t)dlsym(lib, "cuMemcpyDtoH_v2");
    c->alloc = (cu_mem_alloc_t)dlsym(lib, "cuMemAlloc_v2");
    c->free_ = (cu_mem_free_t)dlsym(lib, "cuMemFree_v2");
    c->sync = (cu_sync_t)dlsym(lib, "cuCtxSynchronize");
    if (!(c->htod && c->dtoh && c->alloc && c->free_ && c->sync))
        return 0;
    /* Our own CUDA calls need a current context: device 0's primary one, which gdr_open also
     * uses (gdr leaves the caller's current context as it found it). */
    cu_init_t init = (cu_init_t)dlsym(lib, "cuInit");
    cu_device_get_t device_get = (cu_device_get_t)dlsym(lib, "cuDeviceGet");
    cu_ctx_retain_t retain = (cu_ctx_retain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_t set = (cu_ctx_set_t)dlsym(lib, "cuCtxSetCurrent");
    int dev = 0;
    void *ctx = NULL;
    return init && device_get && retain && set && init(0) == 0 && device_get(&dev, 0) == 0 &&
           retain(&ctx, dev) == 0 && set(ctx) == 0;
}

static void fill_random(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(rand() >> 7);
}

/* Writes and reads through a mapping of `mh` whose GPU address is `dptr`, `size` bytes. */
static void exercise_mapping(gdr_t g, gdr_mh_t mh, unsigned long dptr, size_t size,
                             struct cuda *cu, const char *what) {
    gdr_info_v2_t info;
    memset(&info, 0xcc, sizeof info);
    EXPECT_RC(gdr_get_info_v2(g, mh, &info), 0);
    CHECK(info.mapped == 0, "%s: mapped before gdr_map", what);
    CHECK(info.va <= dptr && dptr + size <= info.va + info.mapped_size,
          "%s: info va %#lx+%lu does not cover %#lx+%zu", what, (unsigned long)info.va,
          (unsigned long)info.mapped_size, dptr, size);
    CHECK(info.page_size >= 4096, "%s: page size %u", what, info.page_size);

    void *base = NULL;
    EXPECT_RC(gdr_map_v2(g, mh, &base, info.mapped_size, 7), EINVAL);
    EXPECT_RC(gdr_map(g, mh, &base, info.mapped_size + 1), EINVAL);
    EXPECT_RC(gdr_map(g, mh, &base, info.mapped_size), 0);
    CHECK(base != NULL, "%s: gdr_map gave NULL", what);
    void *again = NULL;
    EXPECT_RC(gdr_map_v2(g, mh, &again, info.mapped_size, GDR_MAP_FLAG_REQ_WC_MAPPING), EAGAIN);
    EXPECT_RC(gdr_get_info_v2(g, mh, &info), 0);
    CHECK(info.mapped == 1 && info.wc_mapping == 1 && info.mapping_type == GDR_MAPPING_TYPE_WC,
          "%s: info after map: mapped %u wc %u type %d", what, info.mapped, info.wc_mapping,
          (int)info.mapping_type);

    char *user = (char *)base + (dptr - info.va);
    size_t off = 5, n = size - 11;
    unsigned char *src = malloc(size), *dst = malloc(size);
    fill_random(src, size);
    EXPECT_RC(gdr_copy_to_mapping(mh, user + off, src, n), 0);
    memset(dst, 0xee, size);
    EXPECT_RC(gdr_copy_from_mapping(mh, dst, user + off, n), 0);
    CHECK(memcmp(src, dst, n) == 0, "%s: read back through the mapping differs", what);
    if (cu) {
        memset(dst, 0xee, size);
        CHECK(cu->dtoh(dst, dptr + off, n) == 0, "%s: cuMemcpyDtoH failed", what);
        CHECK(memcmp(src, dst, n) == 0, "%s: the GPU does not see the CPU's writes", what);
        fill_random(src, size);
        CHECK(cu->htod(dptr, src, size) == 0, "%s: cuMemcpyHtoD failed", what);
        CHECK(cu->sync() == 0, "%s: cuCtxSynchronize failed", what);
        memset(dst, 0xee, size);
        EXPECT_RC(gdr_copy_from_mapping(mh, dst, user, size), 0);
        CHECK(memcmp(src, dst, size) == 0, "%s: the CPU does not see the GPU's writes", what);
    }
    /* Out of the mapping: refused, nothing copied. */
    EXPECT_RC(gdr_copy_to_mapping(mh, (char *)base + info.mapped_size - 4, src, 8), EINVAL);
    EXPECT_RC(gdr_copy_from_mapping(mh, dst, (char *)base - 64, 8), EINVAL);
    EXPECT_RC(gdr_copy_to_mapping(mh, user, NULL, 8), EINVAL);

    EXPECT_RC(gdr_unmap(g, mh, (char *)base + 64, info.mapped_size), EINVAL);
    EXPECT_RC(gdr_unmap(g, mh, base, info.mapped_size), 0);
    EXPECT_RC(gdr_unmap(g, mh, base, info.mapped_size), EINVAL);
    EXPECT_RC(gdr_copy_to_mapping(mh, user, src, 8), EINVAL);
    EXPECT_RC(gdr_get_info_v2(g, mh, &info), 0);
    CHECK(info.mapped == 0, "%s: still mapped after gdr_unmap", what);
    free(src);
    free(dst);
}

int main(void) {
    const char *req = getenv("GDR_REQUIRE_GPU");
    int require = req && strcmp(req, "1") == 0;
    srand((unsigned)getpid());

    int major = -1, minor = -1;
    gdr_runtime_get_version(&major, &minor);
    CHECK(major == GDR_API_MAJOR_VERSION && minor == GDR_API_MINOR_VERSION,
          "runtime version %d.%d", major, minor);

    gdr_mh_t bogus = {.h = 0xdeadbeef};
    EXPECT_RC(gdr_close((gdr_t)(uintptr_t)0x1000), EINVAL);

    gdr_t g = gdr_open();
    if (!g) {
        printf("gdrapi_test: skipped: gdr_open() found no usable GPU or backend\n");
        if (failures)
            return 1;
        return require ? 1 : 0;
    }

    EXPECT_RC(gdr_driver_get_version(g, &major, &minor), 0);
    printf("driver version %d.%d\n", major, minor);
    int v = -1;
    EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v), 0);
    printf("persistent mapping %d\n", v);
    EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &v), 0);
    EXPECT_RC(gdr_get_attribute(g, (gdr_attr_t)99, &v), EINVAL);
    EXPECT_RC(gdr_get_attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING, NULL), EINVAL);

    /* Bad handles. */
    gdr_info_v2_t info;
    void *va = NULL;
    int flag = -1;
    EXPECT_RC(gdr_get_info_v2(g, bogus, &info), EINVAL);
    EXPECT_RC(gdr_map(g, bogus, &va, 4096), EINVAL);
    EXPECT_RC(gdr_unmap(g, bogus, va, 4096), EINVAL);
    EXPECT_RC(gdr_unpin_buffer(g, bogus), EINVAL);
    EXPECT_RC(gdr_free_mapped(g, bogus), EINVAL);
    EXPECT_RC(gdr_get_callback_flag(g, bogus, &flag), EINVAL);

    struct cuda cuda_fns, *cu = load_cuda(&cuda_fns) ? &cuda_fns : NULL;
    if (!cu)
        printf("libcuda not loadable: GPU-side checks skipped\n");

    /* The extension: mapped memory where pinning may not work. */
    unsigned long dptr = 0;
    gdr_mh_t mh = {0};
    size_t size = (1 << 20) + 13;
    EXPECT_RC(gdr_alloc_mapped(g, 0, &dptr, &mh), EINVAL);
    int rc = gdr_alloc_mapped(g, size, &dptr, &mh);
    if (rc == ENOTSUP) {
        printf("gdr_alloc_mapped: no Vulkan backend here\n");
    } else {
        EXPECT_RC(rc, 0);
        CHECK(dptr % GPU_PAGE_SIZE == 0, "alloc dptr %#lx not GPU-page aligned", dptr);
        exercise_mapping(g, mh, dptr, size, cu, "alloc_mapped");
        EXPECT_RC(gdr_get_callback_flag(g, mh, &flag), 0);
        CHECK(flag == 0, "callback flag %d on live memory", flag);
        EXPECT_RC(gdr_unpin_buffer(g, mh), EINVAL); /* wrong kind: use gdr_free_mapped */
        /* Freed while mapped: the mapping goes with it. */
        void *m = NULL;
        EXPECT_RC(gdr_map(g, mh, &m, size), 0);
        EXPECT_RC(gdr_free_mapped(g, mh), 0);
        EXPECT_RC(gdr_free_mapped(g, mh), EINVAL);
        EXPECT_RC(gdr_copy_to_mapping(mh, m, &size, 1), EINVAL);
        printf("alloc_mapped: ok\n");
    }

    /* Pinning an existing cuMemAlloc range. */
    if (cu) {
        unsigned long long buf = 0;
        size_t bsize = 3 << 20;
        CHECK(cu->alloc(&buf, bsize) == 0, "cuMemAlloc failed");
        gdr_mh_t ph = {0};
        EXPECT_RC(gdr_pin_buffer(g, buf, 0, 0, 0, &ph), EINVAL);
        EXPECT_RC(gdr_pin_buffer_v2(g, buf, 4096, 0x80, &ph), EINVAL);
        rc = gdr_pin_buffer(g, buf + 4099, 100000, 0, 0, &ph);
        if (rc == 0) {
            /* A pin inside a page can be queried, not mapped (as gdrcopy); the page-aligned
             * pin around it maps. */
            void *m = NULL;
            gdr_info_v2_t pi;
            EXPECT_RC(gdr_get_info_v2(g, ph, &pi), 0);
            EXPECT_RC(gdr_map(g, ph, &m, pi.mapped_size), EINVAL);
            EXPECT_RC(gdr_unpin_buffer(g, ph), 0);
            EXPECT_RC(gdr_pin_buffer(g, buf, 4099 + 100000, 0, 0, &ph), 0);
            exercise_mapping(g, ph, buf + 4099, 100000, cu, "pin_buffer");
            EXPECT_RC(gdr_get_callback_flag(g, ph, &flag), 0);
            CHECK(flag == 0, "callback flag %d on live memory", flag);
            EXPECT_RC(gdr_free_mapped(g, ph), EINVAL); /* wrong kind */
            EXPECT_RC(gdr_unpin_buffer(g, ph), 0);
            EXPECT_RC(gdr_unpin_buffer(g, ph), EINVAL); /* double unpin */
            gdr_mh_t ph2 = {0};
            EXPECT_RC(gdr_pin_buffer_v2(g, buf, bsize, GDR_PIN_FLAG_FORCE_PCIE, &ph2), 0);
            EXPECT_RC(gdr_unpin_buffer(g, ph2), 0);
            printf("pin_buffer: ok\n");
        } else {
            printf("pin_buffer: no backend can pin cuMemAlloc memory here (errno %d)\n", rc);
            CHECK(rc == ENOTSUP || rc == EIO, "pin refused with %d", rc);
            EXPECT_RC(gdr_pin_buffer_v2(g, buf, bsize, GDR_PIN_FLAG_FORCE_PCIE, &ph), rc);
        }
        cu->free_(buf);
    }

    /* A handle left behind is released by gdr_close. */
    if (gdr_alloc_mapped(g, 4096, &dptr, &mh) == 0) {
        void *m = NULL;
        EXPECT_RC(gdr_map(g, mh, &m, 4096), 0);
    }
    EXPECT_RC(gdr_close(g), 0);
    EXPECT_RC(gdr_close(g), EINVAL);
    EXPECT_RC(gdr_get_info_v2(g, mh, &info), EINVAL);

    if (failures) {
        printf("gdrapi_test: %d failures\n", failures);
        return 1;
    }
    printf("gdrapi_test: all checks passed\n");
    return 0;
}
