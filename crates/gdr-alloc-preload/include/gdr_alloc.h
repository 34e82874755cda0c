/*
 * gdr_alloc.h: gdr's allocator library (libgdr_alloc.so.0).
 *
 * Loaded into a program that is not rebuilt (LD_PRELOAD, or `gdr run -- CMD`), the library
 * serves cudaMalloc, cuMemAlloc (v1 and _v2), cuMemAllocPitch (v1 and _v2) and their frees from
 * a pool of cuMemCreate chunks made with a POSIX-fd handle type. Such memory can be pinned and
 * mapped for the CPU on hosts without gdrdrv and before CUDA 13.3 (Vulkan imports the chunk and
 * maps it through BAR1), so libgdrapi's gdr_pin_buffer() accepts it. docs/alloc.md says what
 * is covered, what is passed through and every switch.
 *
 * The functions below are for code that knows about the allocator: frameworks' allocator hooks
 * (PyTorch's CUDAPluggableAllocator, CuPy's set_allocator) and libraries that map its memory
 * (libgdrapi, gdr's Python package). Return values are CUresult codes for the allocation calls
 * and 0 or a positive errno for the others.
 */
#ifndef GDR_ALLOC_H
#define GDR_ALLOC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the functions and structures below. */
#define GDR_ALLOC_ABI_VERSION 1
int gdr_alloc_abi_version(void);

/*
 * Whether allocations on CUDA device `device` are served by the pool (1) or passed through to
 * the driver (0, and `why`, when not NULL, receives a NUL-terminated reason of at most `len`
 * bytes). Probes the device on first use (CUDA VMM with POSIX-fd handles, then a Vulkan import
 * and map of one chunk).
 */
int gdr_alloc_active(int device, char *why, size_t len);

/* Allocates `size` bytes on `device` from the pool (CUresult; CUDA_ERROR_NOT_SUPPORTED when
 * the pool is not active there). The memory is freed with gdr_alloc_free() or cudaFree(). */
int gdr_alloc_malloc(uint64_t *dptr, size_t size, int device);
/* Frees memory from the pool (CUresult; CUDA_ERROR_INVALID_VALUE for an address it did not
 * hand out). */
int gdr_alloc_free(uint64_t dptr);

/* PyTorch's CUDAPluggableAllocator signatures:
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "gdr_alloc_torch_malloc",
 *                                            "gdr_alloc_torch_free")
 * NULL from the first means out of memory. */
void *gdr_alloc_torch_malloc(ssize_t size, int device, void *stream);
void gdr_alloc_torch_free(void *ptr, ssize_t size, int device, void *stream);

/* A pin of pool memory: the chunk that holds the range stays allocated and mapped, and memory
 * freed inside it is not handed out again, until gdr_alloc_unpin(). The chunk's CPU mapping is
 * inaccessible except where a pin is mapped: gdr_alloc_map() opens the 64 KiB pages around the
 * pinned range (counted per page) and gdr_alloc_unmap() closes them again, so an address is
 * usable exactly while a mapping of it exists (touching it otherwise faults, as a gdrcopy
 * mapping does after gdr_unmap). */
typedef struct gdr_alloc_pin {
    uint64_t id;     /* token for gdr_alloc_unpin() and gdr_alloc_pin_freed() */
    uint64_t base;   /* device address of the chunk's first byte */
    uint64_t size;   /* bytes in the chunk */
    void *cpu;       /* CPU address of `base`: a write-combined mapping of the whole chunk */
    int32_t device;  /* CUDA device ordinal */
    uint32_t reserved;
} gdr_alloc_pin_t;

/* 0; ENOENT: [addr, addr + size) is not pool memory; EINVAL: it leaves its chunk (or size is
 * 0, or out is NULL); ENOTSUP: the chunk cannot be mapped here; ENOMEM, EIO. */
int gdr_alloc_pin(uint64_t addr, size_t size, gdr_alloc_pin_t *out);
/* 0, or EINVAL for an unknown id. A mapping of the pin still open is closed. */
int gdr_alloc_unpin(uint64_t id);
/* Opens the pinned range's pages: `cpu + (addr - base)` may be used until gdr_alloc_unmap().
 * 0, or EINVAL for an unknown id. */
int gdr_alloc_map(uint64_t id);
/* Undoes one gdr_alloc_map(); 0, or EINVAL for an unknown or unmapped id. */
int gdr_alloc_unmap(uint64_t id);
/* *freed = 1 once an allocation that overlapped the pinned range when it was pinned has been
 * freed (what gdrcopy's gdr_get_callback_flag reports); 0, or EINVAL for an unknown id. */
int gdr_alloc_pin_freed(uint64_t id, int *freed);

typedef struct gdr_alloc_stats {
    uint64_t live_allocations;  /* allocations handed out and not freed */
    uint64_t live_bytes;        /* bytes they asked for */
    uint64_t reserved_bytes;    /* bytes in chunks held from the driver */
    uint64_t chunks;            /* chunks held */
    uint64_t mapped_chunks;     /* chunks with a CPU mapping (pinned at least once) */
    uint64_t pins;              /* live pins */
    uint64_t quarantined_bytes; /* freed while pinned, waiting for the unpin */
    uint64_t allocations;       /* served since start */
    uint64_t passed_through;    /* allocation calls passed to the driver */
    uint64_t chunks_released;   /* chunks given back to the driver */
} gdr_alloc_stats_t;

/* 0, or EINVAL for NULL. */
int gdr_alloc_get_stats(gdr_alloc_stats_t *out);
/* Gives every empty, unpinned chunk back to the driver; the number of bytes released. */
uint64_t gdr_alloc_trim(void);

#ifdef __cplusplus
}
#endif

#endif /* GDR_ALLOC_H */
