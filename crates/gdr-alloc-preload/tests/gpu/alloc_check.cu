// A CUDA program written as users write them (the runtime API, cudaMalloc), checked with and
// without gdr's allocator preloaded. scripts/alloc-gpu.sh builds it twice (runtime linked
// statically, nvcc's default, and shared) and runs it:
//
//   alloc_check pool     under `gdr run`: allocations come from the pool, pins of them work
//   alloc_check driver   without it: CUDA semantics are the same, pins of cudaMalloc memory
//                        are refused with ENOTSUP (no gdrdrv, no dma-buf mmap here)
//
// Prints one "ok ..."/"FAIL ..." line per check, "time ..." lines, and a last line
// "alloc_check: N passed, M failed"; exit status 1 on a failure.
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <gdrapi.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

static int passed, failed;
static bool pool;

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
    (ok ? passed : failed)++;
}

static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

// gdr_alloc.h's stats, looked up at run time (present only when the allocator is loaded).
struct Stats {
    unsigned long long live_allocations, live_bytes, reserved_bytes, chunks, mapped_chunks, pins,
        quarantined_bytes, allocations, passed_through, chunks_released;
};
static bool stats(Stats *s) {
    auto f = (int (*)(Stats *))dlsym(RTLD_DEFAULT, "gdr_alloc_get_stats");
    memset(s, 0, sizeof *s);
    return f && f(s) == 0;
}

__global__ void fill(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)((i * 2654435761u) ^ seed ^ (i >> 13));
}

static uint8_t expect_byte(size_t i, uint32_t seed) {
    return (uint8_t)((i * 2654435761u) ^ seed ^ (i >> 13));
}

static bool verify(const uint8_t *h, size_t n, uint32_t seed, size_t *bad) {
    for (size_t i = 0; i < n; i++)
        if (h[i] != expect_byte(i, seed)) {
            *bad = i;
            return false;
        }
    return true;
}

// A kernel fills, the CPU reads back with cudaMemcpy: the memory works as device memory.
static bool round_trip(uint8_t *d, size_t n, uint32_t seed, cudaStream_t s = 0) {
    fill<<<128, 256, 0, s>>>(d, n, seed);
    std::vector<uint8_t> h(n);
    if (cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, s) != cudaSuccess) return false;
    if (cudaStreamSynchronize(s) != cudaSuccess) return false;
    size_t bad;
    return verify(h.data(), n, seed, &bad);
}

// What a peer process does with a VMM buffer it was handed (UCX's cuda_ipc, NCCL): the
// allocation handle of the address (cuMemRetainAllocationHandle), mapped at offset 0 for the
// length cuMemGetAddressRange gave, at a new address. Done here in one process: the view must
// show the block's bytes at the block's offset from `base`.
static bool exported_view_matches(uint8_t *d, size_t n, CUdeviceptr base, size_t size) {
    CUmemGenericAllocationHandle h;
    if (cuMemRetainAllocationHandle(&h, d) != CUDA_SUCCESS) return false;
    CUdeviceptr va = 0;
    bool ok = cuMemAddressReserve(&va, size, 0, 0, 0) == CUDA_SUCCESS;
    bool mapped = ok && cuMemMap(va, size, 0, h, 0) == CUDA_SUCCESS;
    if (mapped) {
        CUmemAccessDesc access = {};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = 0;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        ok = cuMemSetAccess(va, size, &access, 1) == CUDA_SUCCESS;
        std::vector<uint8_t> direct(n), viewed(n, 0x5A);
        ok = ok && cudaMemcpy(direct.data(), d, n, cudaMemcpyDeviceToHost) == cudaSuccess &&
             cudaMemcpy(viewed.data(), (void *)(va + ((CUdeviceptr)d - base)), n,
                        cudaMemcpyDeviceToHost) == cudaSuccess &&
             direct == viewed;
        cuMemUnmap(va, size);
    } else {
        ok = false;
    }
    if (va) cuMemAddressFree(va, size);
    cuMemRelease(h);
    return ok;
}

static void sizes_and_semantics() {
    const size_t sizes[] = {1, 7, 512, 4096, 65536 + 3, 1 << 20, (3 << 20) + 5, 33 << 20, 200 << 20};
    Stats before, after;
    stats(&before);
    for (size_t n : sizes) {
        uint8_t *d = nullptr;
        cudaError_t e = cudaMalloc(&d, n);
        check(e == cudaSuccess && d && ((uintptr_t)d % 256) == 0, "cudaMalloc(%zu) = %p (%s)", n,
              (void *)d, cudaGetErrorString(e));
        if (e != cudaSuccess) continue;
        check(round_trip(d, n, (uint32_t)n), "%zu B: a kernel's bytes read back by cudaMemcpy", n);
        // cudaMemset of the middle, read back.
        size_t off = n / 3, len = n - off - n / 5;
        if (len > 0) {
            cudaMemset(d + off, 0xA5, len);
            std::vector<uint8_t> h(n);
            cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost);
            bool ok = true;
            for (size_t i = 0; i < n && ok; i++)
                ok = h[i] == ((i >= off && i < off + len) ? 0xA5 : expect_byte(i, (uint32_t)n));
            check(ok, "%zu B: cudaMemset of [%zu, +%zu) and nothing else", n, off, len);
        }
        cudaPointerAttributes a;
        e = cudaPointerGetAttributes(&a, d + n / 2);
        check(e == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device == 0,
              "%zu B: cudaPointerGetAttributes says device memory of GPU 0", n);
        CUcontext owner = nullptr, current = nullptr;
        cuCtxGetCurrent(&current);
        CUresult rc = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT,
                                            (CUdeviceptr)(d + n / 2));
        check(rc == CUDA_SUCCESS && owner != nullptr && owner == current,
              "%zu B: CU_POINTER_ATTRIBUTE_CONTEXT is the context it was allocated in (%p)", n,
              (void *)owner);
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult r = cuMemGetAddressRange(&base, &size, (CUdeviceptr)(d + n / 2));
        if (pool) {
            // The chunk that holds the block, as the driver reports a cuMemCreate mapping.
            check(r == CUDA_SUCCESS && base <= (CUdeviceptr)d && (CUdeviceptr)d + n <= base + size &&
                      size % (2 << 20) == 0,
                  "%zu B: cuMemGetAddressRange(middle) = %#llx+%zu (the chunk holding %p)", n,
                  (unsigned long long)base, size, (void *)d);
            check(r == CUDA_SUCCESS && exported_view_matches(d, n, base, size),
                  "%zu B: the handle cuMemRetainAllocationHandle gives, mapped at offset 0 for "
                  "the range's length as UCX's cuda_ipc and NCCL map it, shows the block's bytes "
                  "at its offset",
                  n);
        } else {
            check(r == CUDA_SUCCESS && base == (CUdeviceptr)d && size >= n && size < n + (2 << 20),
                  "%zu B: cuMemGetAddressRange(middle) = %#llx+%zu (the allocation)", n,
                  (unsigned long long)base, size);
        }
        e = cudaFree(d);
        check(e == cudaSuccess, "cudaFree(%zu B)", n);
    }
    stats(&after);
    if (pool)
        check(after.allocations - before.allocations == sizeof sizes / sizeof sizes[0] &&
                  after.live_allocations == before.live_allocations,
              "the pool served every allocation (%llu) and has them all back",
              after.allocations - before.allocations);
    else
        check(after.allocations == 0, "no pool without the allocator");
}

static void pitch_and_2d() {
    uint8_t *d = nullptr;
    size_t pitch = 0, w = 100, hgt = 7;
    cudaError_t e = cudaMallocPitch((void **)&d, &pitch, w, hgt);
    check(e == cudaSuccess && pitch >= w, "cudaMallocPitch(100 x 7): pitch %zu", pitch);
    std::vector<uint8_t> src(w * hgt), back(w * hgt, 0);
    for (size_t i = 0; i < src.size(); i++) src[i] = (uint8_t)(i * 7 + 3);
    cudaMemcpy2D(d, pitch, src.data(), w, w, hgt, cudaMemcpyHostToDevice);
    cudaMemcpy2D(back.data(), w, d, pitch, w, hgt, cudaMemcpyDeviceToHost);
    check(src == back, "cudaMemcpy2D round trip through the pitched allocation");
    cudaFree(d);
    CUdeviceptr dp = 0;
    size_t p2 = 0;
    CUresult r = cuMemAllocPitch(&dp, &p2, 4096 + 1, 3, 16);
    check(r == CUDA_SUCCESS && p2 >= 4097, "cuMemAllocPitch(4097 x 3): pitch %zu", p2);
    cuMemFree(dp);
}

static void streams_and_graphs() {
    const size_t n = 3 << 20;
    uint8_t *d = nullptr;
    cudaMalloc(&d, n);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    check(round_trip(d, n, 77, s), "a non-blocking stream: kernel and copy");
    std::vector<uint8_t> h(n, 0);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    fill<<<64, 256, 0, s>>>(d, n, 1234);
    cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, s);
    cudaStreamEndCapture(s, &g);
    cudaError_t e = cudaGraphInstantiate(&ge, g, 0);
    bool ok = e == cudaSuccess;
    for (int i = 0; i < 2 && ok; i++) {
        memset(h.data(), 0, n);
        ok = cudaGraphLaunch(ge, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess;
        size_t bad;
        ok = ok && verify(h.data(), n, 1234, &bad);
    }
    check(ok, "a captured graph (kernel + copy) replayed twice");
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    cudaFree(d);
}

static void *thread_body(void *arg) {
    uintptr_t t = (uintptr_t)arg;
    unsigned seed = (unsigned)t * 7919u + 1;
    std::vector<std::pair<uint8_t *, size_t>> mine;
    bool ok = true;
    cudaSetDevice(0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int i = 0; i < 150 && ok; i++) {
        if (mine.empty() || rand_r(&seed) % 3 != 0) {
            size_t n = 1 + rand_r(&seed) % (rand_r(&seed) % 4 == 0 ? (4 << 20) : 20000);
            uint8_t *d = nullptr;
            ok = cudaMalloc(&d, n) == cudaSuccess;
            if (ok) {
                fill<<<32, 256, 0, s>>>(d, n, (uint32_t)(t << 24 | i));
                mine.push_back({d, n | ((size_t)(t << 24 | i) << 32)});
            }
        } else {
            size_t k = rand_r(&seed) % mine.size();
            auto [d, tagged] = mine[k];
            size_t n = tagged & 0xffffffff;
            uint32_t tag = (uint32_t)(tagged >> 32);
            std::vector<uint8_t> h(n);
            cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, s);
            cudaStreamSynchronize(s);
            size_t bad;
            ok = verify(h.data(), n, tag, &bad);
            cudaFree(d);
            mine.erase(mine.begin() + k);
        }
    }
    for (auto [d, tagged] : mine) {
        size_t n = tagged & 0xffffffff;
        std::vector<uint8_t> h(n);
        cudaMemcpyAsync(h.data(), d, n, cudaMemcpyDeviceToHost, s);
        cudaStreamSynchronize(s);
        size_t bad;
        ok = ok && verify(h.data(), n, (uint32_t)(tagged >> 32), &bad);
        cudaFree(d);
    }
    cudaStreamDestroy(s);
    return (void *)(uintptr_t)ok;
}

static void threads() {
    pthread_t th[8];
    for (uintptr_t t = 0; t < 8; t++) pthread_create(&th[t], nullptr, thread_body, (void *)t);
    int good = 0;
    for (auto &x : th) {
        void *r;
        pthread_join(x, &r);
        good += r != nullptr;
    }
    check(good == 8, "8 threads x 150 random cudaMalloc/kernel/verify/cudaFree: %d of 8 clean", good);
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static void pins() {
    gdr_t g = gdr_open();
    check(g != nullptr, "gdr_open");
    if (!g) return;
    // UCX's pin: the 64 KiB GPU pages around a 16-byte cudaMalloc.
    uint8_t *d = nullptr;
    cudaMalloc(&d, 16);
    unsigned long page = (unsigned long)d & GPU_PAGE_MASK;
    gdr_mh_t mh;
    int rc = gdr_pin_buffer(g, page, GPU_PAGE_SIZE, 0, 0, &mh);
    if (!pool) {
        check(rc == ENOTSUP, "without the allocator: the pin of cudaMalloc memory is refused, ENOTSUP (%d)", rc);
        if (rc == 0) gdr_unpin_buffer(g, mh);
        cudaFree(d);
        gdr_close(g);
        return;
    }
    check(rc == 0, "the 64 KiB page around a 16-byte cudaMalloc pins (%d)", rc);
    if (rc == 0) {
        gdr_info_t info;
        gdr_get_info(g, mh, &info);
        void *map = nullptr;
        rc = gdr_map(g, mh, &map, info.mapped_size);
        check(rc == 0 && info.va == page && info.mapped_size == GPU_PAGE_SIZE,
              "gdr_map: va %#lx, %lu bytes", (unsigned long)info.va, (unsigned long)info.mapped_size);
        uint8_t *cpu = (uint8_t *)map + ((unsigned long)d - info.va);
        uint8_t src[16], back[16];
        for (int i = 0; i < 16; i++) src[i] = (uint8_t)rand();
        gdr_copy_to_mapping(mh, cpu, src, 16);
        cudaMemcpy(back, d, 16, cudaMemcpyDeviceToHost);
        check(memcmp(src, back, 16) == 0, "CPU -> GPU: bytes written through the mapping, read by cudaMemcpy");
        fill<<<1, 32>>>(d, 16, 99);
        cudaDeviceSynchronize();
        gdr_copy_from_mapping(mh, back, cpu, 16);
        size_t bad;
        check(verify(back, 16, 99, &bad), "GPU -> CPU: a kernel's bytes read through the mapping");
        gdr_unmap(g, mh, map, info.mapped_size);
        gdr_unpin_buffer(g, mh);
    }
    cudaFree(d);

    // Pin cost: fresh allocations of 4-64 KiB; the first pin of each chunk (its mapping is made
    // then) is reported apart.
    std::vector<double> warm, first;
    std::vector<uint8_t *> keep;
    Stats s;
    for (int i = 0; i < 400; i++) {
        size_t n = 4096 + (size_t)(rand() % 15) * 4096;
        uint8_t *b = nullptr;
        if (cudaMalloc(&b, n) != cudaSuccess) break;
        keep.push_back(b);
        stats(&s);
        unsigned long long mapped = s.mapped_chunks;
        double t0 = now_us();
        rc = gdr_pin_buffer(g, (unsigned long)b, n, 0, 0, &mh);
        double t1 = now_us();
        if (rc != 0) {
            check(false, "pin of a fresh %zu-byte cudaMalloc: %d", n, rc);
            break;
        }
        stats(&s);
        (s.mapped_chunks > mapped ? first : warm).push_back(t1 - t0);
        gdr_unpin_buffer(g, mh);
    }
    for (auto b : keep) cudaFree(b);
    printf("time pin of fresh 4-64 KiB allocations: median %.2f us over %zu pins; first pin of a "
           "chunk: median %.1f us over %zu chunks\n",
           median(warm), warm.size(), median(first), first.size());
    check(!warm.empty() && median(warm) <= 10.0, "pin of allocator memory: median %.2f us <= 10 us",
          median(warm));

    // Freed while pinned: the callback flag, the mapping still valid, the memory not reused.
    uint8_t *f = nullptr;
    cudaMalloc(&f, 4096);
    fill<<<4, 256>>>(f, 4096, 5);
    cudaDeviceSynchronize();
    // The 64 KiB page around it (gdr_map maps only page-aligned pins, as gdrcopy).
    unsigned long fpage = (unsigned long)f & GPU_PAGE_MASK;
    rc = gdr_pin_buffer(g, fpage, (unsigned long)f - fpage + 4096, 0, 0, &mh);
    void *map = nullptr;
    gdr_info_t info;
    gdr_get_info(g, mh, &info);
    int mrc = gdr_map(g, mh, &map, info.mapped_size);
    int flag = -1;
    gdr_get_callback_flag(g, mh, &flag);
    check(rc == 0 && mrc == 0 && flag == 0, "pinned and mapped: callback flag 0");
    cudaFree(f);
    gdr_get_callback_flag(g, mh, &flag);
    check(flag == 1, "freed while pinned: callback flag 1");
    uint8_t back[4096];
    gdr_copy_from_mapping(mh, back, (uint8_t *)map + ((unsigned long)f - info.va), 4096);
    size_t bad;
    check(verify(back, 4096, 5, &bad), "freed while pinned: the mapping still reads the bytes");
    std::vector<uint8_t *> again;
    bool reused = false;
    for (int i = 0; i < 64; i++) {
        uint8_t *x = nullptr;
        cudaMalloc(&x, 4096);
        again.push_back(x);
        reused |= x == f;
    }
    check(!reused, "freed while pinned: not handed out again before the unpin");
    gdr_unmap(g, mh, map, info.mapped_size);
    gdr_unpin_buffer(g, mh);
    for (auto x : again) cudaFree(x);
    gdr_close(g);
}

static void refusals() {
    uint8_t *d = nullptr;
    cudaMalloc(&d, 4096);
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, d);
    if (pool)
        check(e != cudaSuccess, "legacy IPC of allocator memory is refused (%s)", cudaGetErrorString(e));
    else
        check(e == cudaSuccess, "legacy IPC of cudaMalloc memory works without the allocator");
    cudaGetLastError();
    cudaFree(d);
    void *huge = nullptr;
    e = cudaMalloc(&huge, (size_t)1 << 50);
    check(e == cudaErrorMemoryAllocation, "cudaMalloc(1 PiB): cudaErrorMemoryAllocation (%s)",
          cudaGetErrorString(e));
    cudaGetLastError();
    uint8_t *ok = nullptr;
    e = cudaMalloc(&ok, 1 << 20);
    check(e == cudaSuccess && round_trip(ok, 1 << 20, 3), "an allocation after out-of-memory works");
    cudaFree(ok);
}

static void driver_api() {
    // The driver API by symbol (as gdrcopy's tests): cuMemAlloc, and cuMemCreate without a
    // shareable handle type, which the allocator makes exportable.
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, 100000);
    check(r == CUDA_SUCCESS, "cuMemAlloc(100000)");
    Stats s;
    if (pool) check(stats(&s) && s.live_allocations >= 1, "cuMemAlloc is served by the pool");
    check(round_trip((uint8_t *)p, 100000, 11), "cuMemAlloc memory works with kernels");
    cuMemFree(p);
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    CUmemGenericAllocationHandle h;
    r = cuMemCreate(&h, gran, &prop, 0);
    CUmemAllocationProp got = {};
    cuMemGetAllocationPropertiesFromHandle(&got, h);
    bool posix = got.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    check(r == CUDA_SUCCESS && posix == pool, "cuMemCreate without a handle type: POSIX fd %s",
          posix ? "added" : "not added");
    cuMemRelease(h);
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "pool") && strcmp(argv[1], "driver"))) {
        fprintf(stderr, "usage: alloc_check pool|driver\n");
        return 2;
    }
    pool = strcmp(argv[1], "pool") == 0;
    srand((unsigned)time(nullptr));
    cudaSetDevice(0);
    cudaFree(0);
    Stats s;
    bool loaded = stats(&s);
    check(loaded == pool, "gdr's allocator is %s", loaded ? "loaded" : "not loaded");
    sizes_and_semantics();
    pitch_and_2d();
    streams_and_graphs();
    threads();
    driver_api();
    pins();
    refusals();
    if (stats(&s))
        printf("info stats: %llu served, %llu live, %llu chunks (%llu mapped), %llu MiB reserved, "
               "%llu passed through\n",
               s.allocations, s.live_allocations, s.chunks, s.mapped_chunks, s.reserved_bytes >> 20,
               s.passed_through);
    printf("alloc_check: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
