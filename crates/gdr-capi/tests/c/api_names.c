/*
 * Uses every name of gdrcopy 2.6's public API, as a program written against gdrcopy's header
 * would, and checks the values and signatures gdrcopy publishes. Built as C99 and as C++11 with
 * -Wall -Wextra -Werror (see tests/c_programs.rs and scripts/capi-check.sh). Runs without a GPU:
 * the calls that need one are made with bad arguments (which must be refused, not crash) or on
 * a gdr_t only when gdr_open() succeeds.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gdrapi.h>

/* Compile-time checks that hold in C99 and C++11 alike. */
#define STATIC_CHECK(name, cond) typedef char static_check_##name[(cond) ? 1 : -1]

STATIC_CHECK(major_shift, MAJOR_VERSION_SHIFT == 16);
STATIC_CHECK(minor_mask, MINOR_VERSION_MASK == 0xffffu);
STATIC_CHECK(api_major, GDR_API_MAJOR_VERSION == 2);
STATIC_CHECK(api_minor, GDR_API_MINOR_VERSION == 6);
STATIC_CHECK(api_version, GDR_API_VERSION == ((2 << 16) | 6));
STATIC_CHECK(min_drv_major, MINIMUM_GDRDRV_MAJOR_VERSION == 2);
STATIC_CHECK(min_drv_minor, MINIMUM_GDRDRV_MINOR_VERSION == 0);
STATIC_CHECK(min_drv, MINIMUM_GDRDRV_VERSION == (2 << 16));
STATIC_CHECK(page_shift, GPU_PAGE_SHIFT == 16);
STATIC_CHECK(page_size, GPU_PAGE_SIZE == 65536UL);
STATIC_CHECK(page_offset, GPU_PAGE_OFFSET == 65535UL);
STATIC_CHECK(page_mask, GPU_PAGE_MASK == ~65535UL);
STATIC_CHECK(pin_default, GDR_PIN_FLAG_DEFAULT == 0);
STATIC_CHECK(pin_force_pcie, GDR_PIN_FLAG_FORCE_PCIE == 1);
STATIC_CHECK(map_none, GDR_MAPPING_TYPE_NONE == 0);
STATIC_CHECK(map_wc, GDR_MAPPING_TYPE_WC == 1);
STATIC_CHECK(map_caching, GDR_MAPPING_TYPE_CACHING == 2);
STATIC_CHECK(map_device, GDR_MAPPING_TYPE_DEVICE == 3);
STATIC_CHECK(map_max, GDR_MAPPING_TYPE_MAX == 4);
STATIC_CHECK(flag_default, GDR_MAP_FLAG_DEFAULT == 0);
STATIC_CHECK(flag_wc, GDR_MAP_FLAG_REQ_WC_MAPPING == 1);
STATIC_CHECK(flag_cache, GDR_MAP_FLAG_REQ_CACHE_MAPPING == 2);
STATIC_CHECK(flag_device, GDR_MAP_FLAG_REQ_DEVICE_MAPPING == 3);
STATIC_CHECK(attr_persistent, GDR_ATTR_USE_PERSISTENT_MAPPING == 1);
STATIC_CHECK(attr_force_pcie, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE == 2);
STATIC_CHECK(attr_dmabuf, GDR_ATTR_USING_DMA_BUF_MMAP == 3);
STATIC_CHECK(attr_max, GDR_ATTR_MAX == 4);
STATIC_CHECK(mh_size, sizeof(gdr_mh_t) == sizeof(unsigned long));
STATIC_CHECK(info_size, sizeof(gdr_info_v2_t) == 48);
STATIC_CHECK(info_alias, sizeof(gdr_info_t) == sizeof(struct gdr_info_v2));
STATIC_CHECK(info_va, offsetof(gdr_info_t, va) == 0);
STATIC_CHECK(info_mapped_size, offsetof(gdr_info_t, mapped_size) == 8);
STATIC_CHECK(info_page_size, offsetof(gdr_info_t, page_size) == 16);
STATIC_CHECK(info_tm_cycles, offsetof(gdr_info_t, tm_cycles) == 24);
STATIC_CHECK(info_cycles_per_ms, offsetof(gdr_info_t, cycles_per_ms) == 32);
STATIC_CHECK(info_mapping_type, offsetof(gdr_info_t, mapping_type) == 40);

/* Every function, assigned to a pointer of the exact signature gdrcopy 2.6 declares: a
 * mismatch in any parameter or return type fails to compile (C++) or warns into an error (C). */
static gdr_t (*const p_open)(void) = gdr_open;
static int (*const p_close)(gdr_t) = gdr_close;
static int (*const p_pin)(gdr_t, unsigned long, size_t, uint64_t, uint32_t, gdr_mh_t *) =
    gdr_pin_buffer;
static int (*const p_pin_v2)(gdr_t, unsigned long, size_t, uint32_t, gdr_mh_t *) =
    gdr_pin_buffer_v2;
static int (*const p_unpin)(gdr_t, gdr_mh_t) = gdr_unpin_buffer;
static int (*const p_cb_flag)(gdr_t, gdr_mh_t, int *) = gdr_get_callback_flag;
static int (*const p_info_v2)(gdr_t, gdr_mh_t, gdr_info_v2_t *) = gdr_get_info_v2;
static int (*const p_info)(gdr_t, gdr_mh_t, gdr_info_t *) = gdr_get_info;
static int (*const p_map)(gdr_t, gdr_mh_t, void **, size_t) = gdr_map;
static int (*const p_map_v2)(gdr_t, gdr_mh_t, void **, size_t, int) = gdr_map_v2;
static int (*const p_unmap)(gdr_t, gdr_mh_t, void *, size_t) = gdr_unmap;
static int (*const p_to)(gdr_mh_t, void *, const void *, size_t) = gdr_copy_to_mapping;
static int (*const p_from)(gdr_mh_t, void *, const void *, size_t) = gdr_copy_from_mapping;
static void (*const p_rt_version)(int *, int *) = gdr_runtime_get_version;
static int (*const p_drv_version)(gdr_t, int *, int *) = gdr_driver_get_version;
static int (*const p_attr)(gdr_t, gdr_attr_t, int *) = gdr_get_attribute;
static int (*const p_type_str)(gdr_mapping_type_t, const char **) = gdr_get_mapping_type_string;

static int failures = 0;

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

static void check_types(void) {
    struct gdr *raw = NULL;
    gdr_t g = raw;
    struct gdr_mh_s mh_s;
    mh_s.h = 0;
    gdr_mh_t mh = mh_s;
    enum gdr_pin_flags pf = GDR_PIN_FLAG_FORCE_PCIE;
    gdr_pin_flags_t pft = pf;
    enum gdr_mapping_type mt = GDR_MAPPING_TYPE_WC;
    gdr_mapping_type_t mtt = mt;
    enum gdr_map_flags mf = GDR_MAP_FLAG_REQ_WC_MAPPING;
    gdr_map_flags_t mft = mf;
    enum gdr_attr at = GDR_ATTR_USING_DMA_BUF_MMAP;
    gdr_attr_t att = at;
    gdr_info_v2_t info;
    memset(&info, 0, sizeof info);
    info.mapped = 1;
    info.wc_mapping = 1;
    info.mapping_type = mtt;
    CHECK(g == NULL && mh.h == 0 && pft == 1 && mft == 1 && att == 3, "enum round trip");
    CHECK(info.mapped == 1 && info.wc_mapping == 1, "bit-fields");
}

static void check_mapping_type_strings(void) {
    static const char *const want[] = {"None", "Write Combining", "Caching", "Device"};
    for (int t = GDR_MAPPING_TYPE_NONE; t < GDR_MAPPING_TYPE_MAX; t++) {
        const char *s = NULL;
        int rc = p_type_str((gdr_mapping_type_t)t, &s);
        CHECK(rc == 0 && s && strcmp(s, want[t]) == 0, "mapping type %d: rc %d name %s", t, rc,
              s ? s : "(null)");
    }
    const char *s = NULL;
    CHECK(p_type_str(GDR_MAPPING_TYPE_MAX, &s) == EINVAL, "GDR_MAPPING_TYPE_MAX has a name");
}

/* The exported symbols binaries and dlsym() users (NCCL, NVSHMEM, UCX) look up. */
static void check_symbols(void) {
    static const char *const names[] = {
        "gdr_open", "gdr_close", "gdr_pin_buffer", "gdr_pin_buffer_v2", "gdr_unpin_buffer",
        "gdr_get_callback_flag", "gdr_get_info", "gdr_get_info_v2", "gdr_map", "gdr_map_v2",
        "gdr_unmap", "gdr_copy_to_mapping", "gdr_copy_from_mapping", "gdr_runtime_get_version",
        "gdr_driver_get_version", "gdr_get_attribute", "gdr_get_mapping_type_string"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(dlsym(RTLD_DEFAULT, names[i]) != NULL, "symbol %s not exported", names[i]);
    CHECK(dlsym(RTLD_DEFAULT, "gdr_get_info") != dlsym(RTLD_DEFAULT, "gdr_get_info_v2"),
          "gdr_get_info (v1) must be its own symbol");
}

/* Bad arguments are refused without touching anything. */
static void check_refusals(void) {
    gdr_t bogus = (gdr_t)(uintptr_t)0x1230;
    gdr_mh_t mh = {0xdead};
    gdr_info_t info;
    void *va = NULL;
    int v = 0, a = 0, b = 0;
    char buf[8] = {0};
    CHECK(p_close(bogus) == EINVAL, "gdr_close(bogus)");
    CHECK(p_pin(bogus, 0x10000, 4096, 0, 0, &mh) == EINVAL, "gdr_pin_buffer(bogus)");
    CHECK(p_pin_v2(bogus, 0x10000, 4096, GDR_PIN_FLAG_FORCE_PCIE, &mh) == EINVAL,
          "gdr_pin_buffer_v2(bogus)");
    CHECK(p_unpin(bogus, mh) == EINVAL, "gdr_unpin_buffer(bogus)");
    CHECK(p_cb_flag(bogus, mh, &v) == EINVAL, "gdr_get_callback_flag(bogus)");
    CHECK(p_info(bogus, mh, &info) == EINVAL, "gdr_get_info(bogus)");
    CHECK(p_info_v2(bogus, mh, &info) == EINVAL, "gdr_get_info_v2(bogus)");
    CHECK(p_map(bogus, mh, &va, 4096) == EINVAL, "gdr_map(bogus)");
    CHECK(p_map_v2(bogus, mh, &va, 4096, GDR_MAP_FLAG_DEFAULT) == EINVAL, "gdr_map_v2(bogus)");
    CHECK(p_unmap(bogus, mh, va, 4096) == EINVAL, "gdr_unmap(bogus)");
    CHECK(p_to(mh, buf, buf, sizeof buf) == EINVAL, "gdr_copy_to_mapping(bogus)");
    CHECK(p_from(mh, buf, buf, sizeof buf) == EINVAL, "gdr_copy_from_mapping(bogus)");
    CHECK(p_drv_version(bogus, &a, &b) == EINVAL, "gdr_driver_get_version(bogus)");
    CHECK(p_attr(bogus, GDR_ATTR_USE_PERSISTENT_MAPPING, &v) == EINVAL, "gdr_get_attribute");
}

static void check_open(void) {
    gdr_t g = p_open();
    if (!g) {
        printf("api_names: gdr_open() found no usable GPU (the calls on a gdr_t are not made)\n");
        return;
    }
    int major = -1, minor = -1, v = -1;
    CHECK(p_drv_version(g, &major, &minor) == 0, "gdr_driver_get_version");
    CHECK((major << MAJOR_VERSION_SHIFT | minor) >= MINIMUM_GDRDRV_VERSION,
          "driver version %d.%d below the minimum", major, minor);
    CHECK(p_attr(g, GDR_ATTR_USE_PERSISTENT_MAPPING, &v) == 0, "USE_PERSISTENT_MAPPING");
    CHECK(p_attr(g, GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE, &v) == 0, "SUPPORT_PIN_FLAG_FORCE_PCIE");
    CHECK(p_attr(g, GDR_ATTR_USING_DMA_BUF_MMAP, &v) == 0 && (v == 0 || v == 1),
          "USING_DMA_BUF_MMAP %d", v);
    CHECK(p_attr(g, GDR_ATTR_MAX, &v) == EINVAL, "GDR_ATTR_MAX is no attribute");
    printf("api_names: gdr_open ok, driver version %d.%d, dma-buf mmap %d\n", major, minor, v);
    CHECK(p_close(g) == 0, "gdr_close");
}

int main(void) {
    int major = -1, minor = -1;
    p_rt_version(&major, &minor);
    CHECK(major == GDR_API_MAJOR_VERSION && minor == GDR_API_MINOR_VERSION,
          "runtime version %d.%d", major, minor);
    check_types();
    check_mapping_type_strings();
    check_symbols();
    check_refusals();
    check_open();
    if (failures) {
        printf("api_names: %d failures\n", failures);
        return 1;
    }
    printf("api_names: all checks passed\n");
    return 0;
}
