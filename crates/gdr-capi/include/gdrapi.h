/*
 * gdrapi.h: gdr's libgdrapi, a drop-in for gdrcopy 2.6's user-space library (libgdrapi.so.2).
 *
 * Every name, value and signature below is gdrcopy 2.6's, so a program written against
 * gdrcopy's header compiles against this one unchanged and a binary linked against gdrcopy's
 * libgdrapi.so.2 runs against gdr's. The differences in behaviour are listed here and in
 * docs/peer.md; the gdr extensions are at the end and all carry a gdr_ / GDR_GDR_ name.
 *
 * Backends. gdr_open() picks the first that works on this host:
 *   gdrdrv   gdrcopy's kernel module (/dev/gdrdrv): pins any cuMemAlloc/cudaMalloc range.
 *   dmabuf   cuMemGetHandleForAddressRange + mmap of the dma-buf (CUDA driver 13.3+ on discrete
 *            GPUs): any range. No kernel module.
 *   vulkan   the CUDA allocation is exported as a POSIX fd, imported into Vulkan's device-local
 *            host-visible memory type and mapped (BAR1, needs a large/resizable BAR). Pins only
 *            cuMemCreate memory made with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (NCCL's and
 *            NVSHMEM's buffers, PyTorch with expandable_segments:True), and every cudaMalloc/
 *            cuMemAlloc allocation of a program run under gdr's allocator (`gdr run -- PROGRAM`
 *            or LD_PRELOAD=libgdr_alloc.so.0: see gdr_alloc.h), whose chunks are mapped once so
 *            that a pin costs about a microsecond. No kernel module.
 * GDRCOPY_USE_DMABUF_MMAP=1 selects dmabuf (as in gdrcopy); GDR_BACKEND=gdrdrv|dmabuf|vulkan
 * selects any of them. The GPU is the one owning the pinned address; gdr_open() uses CUDA device
 * 0 (or GDR_CUDA_DEVICE) for its probes and for gdr_alloc_mapped().
 *
 * What the version and backend queries answer:
 *   gdr_runtime_get_version()           2.6 on every backend.
 *   gdr_driver_get_version()            gdrdrv: the loaded module's version. dmabuf and vulkan:
 *                                       2.6, the gdrdrv interface level that gdr's user-space
 *                                       backend implements (no kernel module is loaded), so that
 *                                       version gates written before GDR_ATTR_USING_DMA_BUF_MMAP
 *                                       existed (NCCL's asks for >= 2.1 or >= 2.5) accept a
 *                                       backend that works. gdrcopy's own dmabuf backend fails
 *                                       this call instead.
 *   GDR_ATTR_USING_DMA_BUF_MMAP         1 on dmabuf, 0 on gdrdrv and vulkan.
 *   GDR_ATTR_USE_PERSISTENT_MAPPING     gdrdrv: the module's answer. dmabuf, vulkan: 1.
 *   GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE gdrdrv: the module's answer. dmabuf, vulkan: 1 (on an
 *                                       x86 host with a discrete GPU every mapping is BAR1 over
 *                                       PCIe, which is what the flag asks for).
 *   GDR_ATTR_GDR_BACKEND (extension)    which backend: GDR_GDR_BACKEND_GDRDRV/_DMABUF/_VULKAN.
 *
 * Where gdr differs from gdrcopy, and why:
 *   - Pinning a range the backend cannot serve fails with ENOTSUP (plain cuMemAlloc memory, or
 *     cuMemCreate memory without a POSIX-fd handle type, on the vulkan backend without gdr's
 *     allocator). With GDRCOPY_ENABLE_LOGGING=1 one line on stderr says why and what works
 *     instead (`gdr run`).
 *   - dmabuf and vulkan pins are persistent: the pin holds the GPU memory, so memory the
 *     application frees while pinned stays allocated (and keeps its contents, as seen through the
 *     mapping) until gdr_unpin_buffer() or gdr_close(). gdr_get_callback_flag() then reports 1,
 *     as gdrdrv's does after its free callback (gdrcopy's own dmabuf backend always says 0).
 *     gdrcopy's gdrdrv backend in its non-persistent mode instead revokes the mapping.
 *   - A pin uses the GPU that owns the address, and gdr calls leave the calling thread's current
 *     CUDA context as they found it.
 *   - On vulkan the whole CUDA allocation is imported; the handle still reports, maps and copies
 *     only the 64 KiB-rounded range asked for (info.va = addr rounded down to GPU_PAGE_SIZE).
 *   - Handles and gdr_t values are checked: a stale, foreign or made-up one gives EINVAL instead
 *     of undefined behaviour, and no call crashes on NULL output pointers (EINVAL).
 *   - The library is thread safe: calls from several threads on one gdr_t are serialised inside.
 *   - After fork() the child inherits neither the CPU mappings (they are MADV_DONTFORK: touching
 *     one faults in the child) nor usable handles: every call with a gdr_t opened in the parent
 *     fails with EINVAL in the child. gdr_open() in the child gives a gdr_t that can only be
 *     closed (CUDA does not carry across fork). Such a child, once the parent has opened the
 *     Vulkan driver, ends at exit() after flushing stdio (the driver's inherited exit handlers
 *     crash in a forked child). The parent is unaffected.
 *   - gdr_map() of a handle already mapped gives EAGAIN, as gdrcopy; gdr_map_v2() grants
 *     GDR_MAP_FLAG_DEFAULT and GDR_MAP_FLAG_REQ_WC_MAPPING (mappings are write-combined) and
 *     refuses the caching and device requests with EINVAL, as gdrcopy's dmabuf backend does.
 *
 * Return values: 0 or a positive errno (EINVAL, EAGAIN, ENOTSUP, ENOMEM, EIO). No Rust panic
 * unwinds into the caller. Logging: GDRCOPY_ENABLE_LOGGING (any value) turns it on,
 * GDRCOPY_LOG_LEVEL sets the threshold (1 debug, 2 info, 3 warn, 4 error; default 4).
 *
 * Install: scripts/install-capi.sh [--prefix DIR] (cargo cinstall, see README.md); then
 * cc app.c $(pkg-config --cflags --libs gdrapi).
 */
#ifndef __GDRAPI_H__
#define __GDRAPI_H__

#include <stddef.h>
#include <stdint.h>

#define MAJOR_VERSION_SHIFT 16
#define MINOR_VERSION_MASK (((uint32_t)1 << MAJOR_VERSION_SHIFT) - 1)

#define GDR_API_MAJOR_VERSION 2
#define GDR_API_MINOR_VERSION 6
#define GDR_API_VERSION ((GDR_API_MAJOR_VERSION << MAJOR_VERSION_SHIFT) | GDR_API_MINOR_VERSION)

#define MINIMUM_GDRDRV_MAJOR_VERSION 2
#define MINIMUM_GDRDRV_MINOR_VERSION 0
#define MINIMUM_GDRDRV_VERSION \
    ((MINIMUM_GDRDRV_MAJOR_VERSION << MAJOR_VERSION_SHIFT) | MINIMUM_GDRDRV_MINOR_VERSION)

#define GPU_PAGE_SHIFT 16
#define GPU_PAGE_SIZE (1UL << GPU_PAGE_SHIFT)
#define GPU_PAGE_OFFSET (GPU_PAGE_SIZE - 1)
#define GPU_PAGE_MASK (~GPU_PAGE_OFFSET)

#ifdef __cplusplus
extern "C" {
#endif

struct gdr;
typedef struct gdr *gdr_t;

/* NULL when no GPU is usable or no backend works here (the log says which and why).
 * Once loaded, the library stays loaded for the life of the process (it is linked with
 * -z nodelete): a dlclose() does not unload it, so handles and mappings stay valid. */
gdr_t gdr_open(void);
/* Unmaps and unpins everything still held through g, frees gdr_alloc_mapped memory, closes g. */
int gdr_close(gdr_t g);

typedef struct gdr_mh_s {
    unsigned long h;
} gdr_mh_t;

typedef enum gdr_pin_flags {
    GDR_PIN_FLAG_DEFAULT = 0,
    GDR_PIN_FLAG_FORCE_PCIE = 1
} gdr_pin_flags_t;

/* Pins [addr, addr + size) of CUDA memory for a CPU mapping; the range must lie inside one CUDA
 * allocation (EINVAL otherwise; for memory of gdr's allocator, inside its chunk, which the
 * 64 KiB pages around any allocation are). p2p_token and va_space are legacy (pre-UVA)
 * arguments; they are ignored, as by gdrcopy's dmabuf backend. */
int gdr_pin_buffer(gdr_t g, unsigned long addr, size_t size, uint64_t p2p_token,
                   uint32_t va_space, gdr_mh_t *handle);
/* flags: gdr_pin_flags_t bits; others give EINVAL. */
int gdr_pin_buffer_v2(gdr_t g, unsigned long addr, size_t size, uint32_t flags,
                      gdr_mh_t *handle);
/* A live mapping of handle is torn down first. */
int gdr_unpin_buffer(gdr_t g, gdr_mh_t handle);
/* 1 when the application freed the pinned memory before unpinning it: gdrdrv's free callback
 * ran, or (dmabuf, vulkan) CUDA no longer has the pinned allocation at that address. */
int gdr_get_callback_flag(gdr_t g, gdr_mh_t handle, int *flag);

typedef enum gdr_mapping_type {
    GDR_MAPPING_TYPE_NONE = 0,
    GDR_MAPPING_TYPE_WC = 1,
    GDR_MAPPING_TYPE_CACHING = 2,
    GDR_MAPPING_TYPE_DEVICE = 3,
    GDR_MAPPING_TYPE_MAX /* not a type: one past the last */
} gdr_mapping_type_t;

/* What a handle covers: va and mapped_size are the pinned range rounded out to page_size, so
 * they may differ from the address and size given to gdr_pin_buffer. tm_cycles and
 * cycles_per_ms are deprecated by gdrcopy and are 0 here. */
typedef struct gdr_info_v2 {
    uint64_t va;
    uint64_t mapped_size;
    uint32_t page_size;
    uint64_t tm_cycles;
    uint32_t cycles_per_ms;
    unsigned mapped : 1;
    unsigned wc_mapping : 1;
    gdr_mapping_type_t mapping_type;
} gdr_info_v2_t;
typedef gdr_info_v2_t gdr_info_t;

int gdr_get_info_v2(gdr_t g, gdr_mh_t handle, gdr_info_v2_t *info);
/* As in gdrcopy, gdr_get_info names gdr_get_info_v2 in source. The library also exports the
 * symbol gdr_get_info for binaries and dlsym() users (NCCL): it fills only the first 40 bytes
 * (the v1 struct: every field above but mapping_type). */
#define gdr_get_info gdr_get_info_v2

typedef enum gdr_map_flags {
    GDR_MAP_FLAG_DEFAULT = 0,
    GDR_MAP_FLAG_REQ_WC_MAPPING = 1,
    GDR_MAP_FLAG_REQ_CACHE_MAPPING = 2,
    GDR_MAP_FLAG_REQ_DEVICE_MAPPING = 3
} gdr_map_flags_t;

/* One CPU mapping per handle, of at most info.mapped_size bytes. *va maps info.va: the byte at
 * GPU address dptr is at (char *)*va + (dptr - info.va). As gdrcopy, only a pin whose address
 * starts a page (info.page_size) can be mapped; any other gives EINVAL: pin the page-aligned
 * range around the buffer. */
int gdr_map(gdr_t g, gdr_mh_t handle, void **va, size_t size);
/* flags: a gdr_map_flags_t value. */
int gdr_map_v2(gdr_t g, gdr_mh_t handle, void **va, size_t size, int flags);
/* va is what gdr_map gave; call before gdr_unpin_buffer (which also unmaps). */
int gdr_unmap(gdr_t g, gdr_mh_t handle, void *va, size_t size);

/* map_d_ptr and size must lie inside handle's live mapping. Neither integrity nor ordering of
 * the data is promised towards GPU work already running (see the GPUDirect RDMA guide).
 * gdr: each copy takes the path measured fastest for its direction and size (the mapping on
 * the calling thread, on several threads, or the GPU's copy engine, on a stream of the
 * library's own); when the call returns the bytes are in place, and a read sees the calling
 * thread's earlier stores through the mapping. GDR_CAPI_COPY=mapping keeps every copy on the
 * calling thread's loads and stores through the mapping, as gdrcopy. */
int gdr_copy_to_mapping(gdr_mh_t handle, void *map_d_ptr, const void *h_ptr, size_t size);
int gdr_copy_from_mapping(gdr_mh_t handle, void *h_ptr, const void *map_d_ptr, size_t size);

void gdr_runtime_get_version(int *major, int *minor);
int gdr_driver_get_version(gdr_t g, int *major, int *minor);

typedef enum gdr_attr {
    GDR_ATTR_USE_PERSISTENT_MAPPING = 1,
    GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE = 2,
    GDR_ATTR_USING_DMA_BUF_MMAP = 3,
    GDR_ATTR_MAX /* not an attribute: one past the last */
} gdr_attr_t;

int gdr_get_attribute(gdr_t g, gdr_attr_t attr, int *v);

/* *pstr = a static name of mapping_type ("None", "Write Combining", "Caching", "Device");
 * EINVAL for any other value. */
int gdr_get_mapping_type_string(gdr_mapping_type_t mapping_type, const char **pstr);

/* ---- gdr extensions (not in gdrcopy) ---- */

/* gdr_get_attribute(g, GDR_ATTR_GDR_BACKEND, &v): which backend g uses. */
#define GDR_ATTR_GDR_BACKEND ((gdr_attr_t)0x1000)
#define GDR_GDR_BACKEND_GDRDRV 1
#define GDR_GDR_BACKEND_DMABUF 2
#define GDR_GDR_BACKEND_VULKAN 3

/* size bytes of new GPU memory with a CPU mapping (Vulkan; 64 KiB aligned), pinned from the
 * start, on any host where gdr_open() found the vulkan backend usable. *dptr is its CUDA device
 * address; *handle works with gdr_map, gdr_unmap, gdr_get_info(_v2) and gdr_copy_*. Release
 * with gdr_free_mapped (not gdr_unpin_buffer). */
int gdr_alloc_mapped(gdr_t g, size_t size, unsigned long *dptr, gdr_mh_t *handle);
int gdr_free_mapped(gdr_t g, gdr_mh_t handle);

#ifdef __cplusplus
}
#endif

#endif /* __GDRAPI_H__ */
