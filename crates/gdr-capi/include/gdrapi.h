/*
 * gdrapi.h: gdr's stand-in for gdrcopy's libgdrapi (API 2.5 names and semantics), built as
 * libgdrapi.so (soname libgdrapi.so.2) by the gdr-capi crate.
 *
 * Backends: pinning an existing cuMemAlloc range uses the first backend that works here
 * (gdrdrv, then dma-buf mmap, then Vulkan import of POSIX-fd cuMemCreate memory; the
 * environment variable GDR_BACKEND=gdrdrv|dmabuf|vulkan overrides). Where none can pin
 * (no /dev/gdrdrv, a CUDA driver older than 13.3), the extension gdr_alloc_mapped() still
 * gives GPU memory with a CPU mapping (Vulkan), whose handle works with gdr_map, gdr_unmap,
 * gdr_get_info_v2 and gdr_copy_*.
 *
 * The GPU is CUDA device 0, or the ordinal in GDR_CUDA_DEVICE. gdr_open() makes its primary
 * context current on the calling thread.
 *
 * Every int-returning function returns 0 on success or a positive errno value:
 * EINVAL (bad gdr_t, handle, pointer or size; a handle already unpinned; not mapped),
 * EBUSY (already mapped), ENOTSUP (no backend can do it here), ENOMEM, EIO (anything else,
 * including an internal error: no failure unwinds into the caller).
 */
#ifndef GDRAPI_H
#define GDRAPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GDR_API_MAJOR_VERSION 2
#define GDR_API_MINOR_VERSION 5

#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1UL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

typedef struct gdr *gdr_t;

typedef struct gdr_mh_s {
    unsigned long h;
} gdr_mh_t;

typedef enum gdr_pin_flags {
    GDR_PIN_FLAG_DEFAULT = 0,
    GDR_PIN_FLAG_FORCE_PCIE = 1
} gdr_pin_flags_t;

typedef enum gdr_mapping_type {
    GDR_MAPPING_TYPE_NONE = 0,
    GDR_MAPPING_TYPE_WC = 1,
    GDR_MAPPING_TYPE_CACHING = 2,
    GDR_MAPPING_TYPE_DEVICE = 3
} gdr_mapping_type_t;

typedef enum gdr_attr {
    GDR_ATTR_USE_PERSISTENT_MAPPING = 1,
    GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE = 2
} gdr_attr_t;

typedef struct gdr_info_v2 {
    uint64_t va;          /* GPU address where the pinned (rounded) range starts */
    uint64_t mapped_size; /* bytes pinned */
    uint32_t page_size;
    uint64_t tm_cycles;
    uint32_t cycles_per_ms;
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
    gdr_mapping_type_t mapping_type;
} gdr_info_v2_t;

/* NULL when no GPU is usable or no backend can pin or allocate mapped memory. */
gdr_t gdr_open(void);
/* Unmaps, unpins and frees everything still held through g. */
int gdr_close(gdr_t g);

int gdr_pin_buffer(gdr_t g, unsigned long addr, size_t size, uint64_t p2p_token,
                   uint32_t va_space, gdr_mh_t *handle);
int gdr_pin_buffer_v2(gdr_t g, unsigned long addr, size_t size, uint32_t flags,
                      gdr_mh_t *handle);
int gdr_unpin_buffer(gdr_t g, gdr_mh_t handle);
int gdr_get_callback_flag(gdr_t g, gdr_mh_t handle, int *flag);
int gdr_get_info_v2(gdr_t g, gdr_mh_t handle, gdr_info_v2_t *info);

/* One mapping per handle; size at most info.mapped_size. *va is the mapping of info.va: the
 * caller's byte at GPU address dptr is at (char *)*va + (dptr - info.va). */
int gdr_map(gdr_t g, gdr_mh_t handle, void **va, size_t size);
/* flags: the wanted gdr_mapping_type_t; NONE (driver's choice) or WC are granted (both WC). */
int gdr_map_v2(gdr_t g, gdr_mh_t handle, void **va, size_t size, uint32_t flags);
int gdr_unmap(gdr_t g, gdr_mh_t handle, void *va, size_t size);

/* map_d_ptr must lie, with size bytes, inside the live mapping of handle. No ordering against
 * GPU work already running is promised. */
int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size);
int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr, const void *map_d_ptr, size_t size);

int gdr_get_attribute(gdr_t g, gdr_attr_t attr, int *v);
void gdr_runtime_get_version(int *major, int *minor);
/* gdrdrv's version when gdrdrv is the backend; 0.0 otherwise (no kernel driver in use). */
int gdr_driver_get_version(gdr_t g, int *major, int *minor);

/* Extension: size bytes of GPU memory with a CPU mapping (64 KiB aligned), pinned from the
 * start: *dptr is its CUDA device address, *handle works with gdr_map/gdr_unmap/
 * gdr_get_info_v2/gdr_copy_*. Release with gdr_free_mapped (not gdr_unpin_buffer). */
int gdr_alloc_mapped(gdr_t g, size_t size, unsigned long *dptr, gdr_mh_t *handle);
int gdr_free_mapped(gdr_t g, gdr_mh_t handle);

#ifdef __cplusplus
}
#endif

#endif /* GDRAPI_H */
