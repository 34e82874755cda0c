// What gdr's allocator costs a program: cudaMalloc/cudaFree time by size, and the device
// memory that 10^5 small allocations take. scripts/alloc-gpu.sh runs it twice in one call,
// without and under `gdr run`, and prints the two side by side (docs/alloc.md, "Results").
//
// Output: one JSON object on stdout:
//   {"pool": bool, "sizes": [{"size", "first_us", "alloc_us", "free_us", "pair_us", "n"}],
//    "burst": {"count", "size", "seconds", "device_bytes", "bytes_per_allocation"}}
// alloc_us/free_us/pair_us are medians over n rounds of cudaMalloc then cudaFree of one size;
// first_us is the first cudaMalloc of that size in the process.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

#include <algorithm>
#include <vector>

static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

int main() {
    cudaSetDevice(0);
    cudaFree(0);
    bool pool = dlsym(RTLD_DEFAULT, "gdr_alloc_get_stats") != nullptr;
    printf("{\"pool\": %s, \"sizes\": [", pool ? "true" : "false");
    const size_t sizes[] = {64, 4096, 65536, 1 << 20, 16 << 20, 256 << 20, (size_t)1 << 30};
    bool comma = false;
    for (size_t n : sizes) {
        int rounds = n >= (256 << 20) ? 20 : n >= (16 << 20) ? 200 : 2000;
        void *p = nullptr;
        double t0 = now_us();
        if (cudaMalloc(&p, n) != cudaSuccess) {
            fprintf(stderr, "cudaMalloc(%zu) failed\n", n);
            return 1;
        }
        double first = now_us() - t0;
        cudaFree(p);
        std::vector<double> a, f, pair;
        for (int i = 0; i < rounds; i++) {
            double t1 = now_us();
            cudaMalloc(&p, n);
            double t2 = now_us();
            cudaFree(p);
            double t3 = now_us();
            a.push_back(t2 - t1);
            f.push_back(t3 - t2);
            pair.push_back(t3 - t1);
        }
        printf("%s{\"size\": %zu, \"first_us\": %.2f, \"alloc_us\": %.3f, \"free_us\": %.3f, "
               "\"pair_us\": %.3f, \"n\": %d}",
               comma ? ", " : "", n, first, median(a), median(f), median(pair), rounds);
        comma = true;
    }
    // 10^5 allocations of 64 bytes at once: time and device memory.
    const int count = 100000;
    const size_t size = 64;
    size_t free0, free1, total;
    cudaDeviceSynchronize();
    cudaMemGetInfo(&free0, &total);
    std::vector<void *> ptrs(count);
    double t0 = now_us();
    for (auto &q : ptrs) cudaMalloc(&q, size);
    double secs = (now_us() - t0) / 1e6;
    cudaMemGetInfo(&free1, &total);
    for (auto q : ptrs) cudaFree(q);
    double used = (double)free0 - (double)free1;
    printf("], \"burst\": {\"count\": %d, \"size\": %zu, \"seconds\": %.4f, \"device_bytes\": %.0f, "
           "\"bytes_per_allocation\": %.1f}}\n",
           count, size, secs, used, used / count);
    return 0;
}
