/* cucount: counts a program's calls into the CUDA driver API and the time spent in them, per
 * function. A diagnostic for UCX (scripts/ucx-gpu.sh, part `calls`): it shows which driver
 * calls a transport makes per message and which of them cost more on gdr's allocator memory
 * than on the driver's.
 *
 * Build: cc -O2 -shared -fPIC cucount.c -o libcucount.so -ldl
 * Use:   CUCOUNT_OUT=DIR LD_PRELOAD=libcucount.so PROGRAM   (under `gdr run`, put it first:
 *        LD_PRELOAD=libcucount.so gdr run -- PROGRAM keeps it ahead of the allocator, so the
 *        time of the allocator's own answer is counted too)
 * At exit each process writes DIR/cucount.PID: its command line after `#`, then
 * `name calls total_ns` for each function it called.
 *
 * Only calls made through the dynamic linker are seen (UCX links libcuda and calls it so); the
 * CUDA runtime reaches the driver through cuGetProcAddress and is not counted. UCX's memory
 * hooks patch the code of cuMemAlloc, cuMemFree, cuMemMap and cuMemUnmap (UCM's bistro mode),
 * so those are not wrapped here. Every counted
 * function takes at most six integer or pointer arguments, which the System V x86-64 ABI passes
 * in the same registers whatever their declared types: each wrapper forwards six. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*fn6)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

#define FUNCS(X)                                                                                   \
    X(cuPointerGetAttribute) X(cuPointerGetAttributes) X(cuPointerSetAttribute)                   \
    X(cuMemGetAddressRange_v2) X(cuMemRetainAllocationHandle)                                     \
    X(cuMemGetAllocationPropertiesFromHandle) X(cuMemRelease) X(cuMemExportToShareableHandle)     \
    X(cuMemImportFromShareableHandle) X(cuMemSetAccess)                 \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2)      \
    X(cuIpcCloseMemHandle) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetCurrent)        \
    X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuCtxSetFlags) X(cuCtxGetFlags) X(cuDeviceGet)         \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2) X(cuMemcpyAsync)                  \
    X(cuMemcpyDtoDAsync_v2) X(cuMemcpyHtoDAsync_v2) X(cuMemcpyDtoHAsync_v2) X(cuMemcpyPeerAsync)  \
    X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuStreamWaitEvent)                   \
    X(cuStreamSynchronize) X(cuStreamQuery) X(cuCtxSynchronize) X(cuMemcpy) X(cuMemcpyHtoD_v2)    \
    X(cuMemcpyDtoH_v2) X(cuMemsetD8_v2) X(cuMemCreate)          \
    X(cuMemGetHandleForAddressRange) X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess)

enum {
#define ENUM(n) I_##n,
    FUNCS(ENUM)
#undef ENUM
        N_FUNCS
};

static const char *names[N_FUNCS] = {
#define NAME(n) #n,
    FUNCS(NAME)
#undef NAME
};

static _Atomic uint64_t calls[N_FUNCS];
static _Atomic uint64_t nanos[N_FUNCS];
static _Atomic(fn6) reals[N_FUNCS];

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int forward(int i, uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e,
                   uint64_t f) {
    fn6 real = atomic_load_explicit(&reals[i], memory_order_acquire);
    if (!real) {
        /* The next definition in the global scope (gdr's allocator, when preloaded after this
         * library), else libcuda's own: a program that loads libcuda with a module opened
         * RTLD_LOCAL (as UCX does) keeps it out of the scope RTLD_NEXT searches. */
        real = (fn6)dlsym(RTLD_NEXT, names[i]);
        if (!real) {
            void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
            real = cuda ? (fn6)dlsym(cuda, names[i]) : NULL;
        }
        if (!real) {
            return 999; /* CUDA_ERROR_UNKNOWN: no object defines it */
        }
        atomic_store_explicit(&reals[i], real, memory_order_release);
    }
    uint64_t t0 = now_ns();
    int rc = real(a, b, c, d, e, f);
    atomic_fetch_add_explicit(&nanos[i], now_ns() - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(&calls[i], 1, memory_order_relaxed);
    return rc;
}

#define WRAP(n)                                                                                    \
    int n(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t e, uint64_t f) {              \
        return forward(I_##n, a, b, c, d, e, f);                                                   \
    }
FUNCS(WRAP)
#undef WRAP

__attribute__((destructor)) static void report(void) {
    const char *dir = getenv("CUCOUNT_OUT");
    if (!dir) {
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/cucount.%d", dir, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) {
        return;
    }
    fputs("#", f);
    FILE *cmd = fopen("/proc/self/cmdline", "r");
    if (cmd) {
        int ch;
        while ((ch = fgetc(cmd)) != EOF) {
            fputc(ch ? ch : ' ', f);
        }
        fclose(cmd);
    }
    fputc('\n', f);
    for (int i = 0; i < N_FUNCS; i++) {
        uint64_t n = atomic_load(&calls[i]);
        if (n) {
            fprintf(f, "%s %llu %llu\n", names[i], (unsigned long long)n,
                    (unsigned long long)atomic_load(&nanos[i]));
        }
    }
    fclose(f);
}
