/* A stand-in for libcuda.so.1 with no GPU behind it, for testing libgdr_alloc.so's plumbing on
 * machines without a driver: allocations hand out made-up addresses and count the calls,
 * cuGetProcAddress hands out this library's own functions, and a context is always current
 * (so the allocator gets as far as probing the GPU, which fails: gdr's loader finds most of the
 * driver API missing here). */
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

int fake_calls_alloc, fake_calls_free, fake_calls_create, fake_last_handle_types;
static CUdeviceptr next_addr = 0xf00d0000;

CUresult cuInit(unsigned flags) { (void)flags; return 100; /* CUDA_ERROR_NO_DEVICE */ }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
CUresult cuCtxGetCurrent(void **ctx) { *ctx = (void *)0x1; return 0; }
CUresult cuCtxGetDevice(int *dev) { *dev = 0; return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    fake_calls_alloc++;
    *p = next_addr;
    next_addr += (size + 0xfff) & ~0xfffull;
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; fake_calls_free++; return 0; }
CUresult cuMemCreate(unsigned long long *h, size_t size, const void *prop, unsigned long long f) {
    (void)size; (void)f;
    fake_calls_create++;
    memcpy(&fake_last_handle_types, (const char *)prop + 4, 4);
    *h = 42;
    return 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { (void)p; (void)v; (void)n; return 0; }

static const struct { const char *name; void *fn; } table[] = {
    {"cuMemAlloc", (void *)cuMemAlloc_v2},
    {"cuMemFree", (void *)cuMemFree_v2},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemsetD8", (void *)cuMemsetD8_v2},
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags,
                             int *status) {
    (void)ver; (void)flags;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(sym, table[i].name) == 0) {
            *pfn = table[i].fn;
            if (status) *status = 0;
            return 0;
        }
    *pfn = 0;
    if (status) *status = 1;
    return 500; /* CUDA_ERROR_NOT_FOUND */
}
