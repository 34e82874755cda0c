/* vmm_copy_cost: what one cuMemcpyDtoDAsync costs, by the kind of memory on each side, the
 * way UCX's cuda_ipc copies a rendezvous message (scripts/ucx-gpu.sh measures UCX itself).
 *
 * Each source kind is copied into a cuMemAlloc buffer of the last visible GPU (the
 * receiver's), on a stream of that GPU's primary context, SIZE bytes at a time:
 *   legacy    cuMemAlloc memory of GPU 0 reached through peer access (what a peer process's
 *             cuIpcOpenMemHandle gives it, for the driver's own allocations)
 *   vmm       cuMemCreate memory of GPU 0 (POSIX fd handle type, 2 MiB granularity, as gdr's
 *             allocator makes its chunks), mapped once with access for both GPUs
 *   imported  the same memory exported to a POSIX fd, imported and mapped at a second address
 *             with access for the receiver only, as UCX's cuda_ipc maps a peer's VMM buffer
 *             (uct_cuda_ipc_open_memhandle_vmm)
 * Then the same across two processes, as UCX runs (x-legacy: the exporter's cuMemAlloc memory
 * opened with cuIpcOpenMemHandle; x-imported: its cuMemCreate memory imported from a POSIX fd
 * sent over a socket; x-imp>vmm: the same into cuMemCreate memory of the importer), which
 * comes first in the output.
 * legacy>vmm and imp>vmm copy the same into cuMemCreate memory of the receiver's GPU (what gdr's
 * allocator gives a receiver under `gdr run`).
 * For each: the median time of the launch call alone, and of launch + cuStreamSynchronize.
 * VCC_RDMA=1 makes the cuMemCreate memory GPUDirect RDMA capable, as gdr's allocator makes it.
 * VCC_SYNC_MEMOPS=1 sets CU_CTX_SYNC_MEMOPS on every context used, as UCX's cuda_copy memory
 * domain does when it first detects a CUDA buffer (uct_cuda_copy_sync_memops).
 * VCC_SPLIT=1 runs only the part across processes, the exporter seeing GPU 0 alone
 * (CUDA_VISIBLE_DEVICES=0) and the importer GPU 1 alone, as MPI launchers and ucx-gpu.sh place
 * ranks; VCC_SPLIT=2 the same with both GPUs visible to each, its own first ("0,1", "1,0").
 * VCC_GDR=open opens libgdrapi in each process (a Vulkan device beside CUDA, as under
 * `gdr run`); VCC_GDR=pin also pins and maps every cuMemCreate buffer through it (each imported
 * into Vulkan and mapped for the CPU, as the allocator's probe and UCX's gdr_copy do).
 * Usage: vmm_copy_cost [SIZE [ITERS]]   (defaults 4096, 20000). Build: cc -O2 vmm_copy_cost.c
 * -I$CUDA/include -lcuda. Prints one line per kind; exits 1 on a driver error. */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *s_ = "?";                                                                  \
            cuGetErrorName(r_, &s_);                                                               \
            fprintf(stderr, "vmm_copy_cost: %s failed: %s (line %d)\n", #x, s_, __LINE__);         \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* VCC_RDMA=1 marks the cuMemCreate memory GPUDirect RDMA capable, as gdr's allocator does where
 * the GPU supports it (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED). */
static unsigned char rdma_capable(void) {
    const char *v = getenv("VCC_RDMA");
    return v && v[0] == '1';
}

/* VCC_GDR: 0 nothing, 1 open libgdrapi, 2 open it and pin + map every cuMemCreate buffer. */
static int gdr_mode(void) {
    const char *v = getenv("VCC_GDR");
    if (!v || !*v || !strcmp(v, "0")) {
        return 0;
    }
    return !strcmp(v, "pin") ? 2 : 1;
}

typedef struct {
    unsigned long h;
} vcc_mh;

/* libgdrapi opened once per process (dlopen: the program runs without it when VCC_GDR is
 * unset); with VCC_GDR=pin, `[p, p + len)` pinned and mapped through it, kept until exit. */
static void gdr_touch(CUdeviceptr p, size_t len) {
    static void *g;
    static int (*pin)(void *, unsigned long, size_t, unsigned long long, unsigned, vcc_mh *);
    static int (*map)(void *, vcc_mh, void **, size_t);
    int mode = gdr_mode();
    if (!mode) {
        return;
    }
    if (!g) {
        void *lib = dlopen("libgdrapi.so.2", RTLD_NOW);
        void *(*open_)(void) = lib ? (void *(*)(void))dlsym(lib, "gdr_open") : NULL;
        pin = lib ? dlsym(lib, "gdr_pin_buffer") : NULL;
        map = lib ? dlsym(lib, "gdr_map") : NULL;
        g = open_ ? open_() : NULL;
        if (!g || !pin || !map) {
            fprintf(stderr, "vmm_copy_cost: VCC_GDR: libgdrapi did not open (%s)\n",
                    lib ? "gdr_open" : dlerror());
            exit(1);
        }
    }
    if (mode == 2 && p) {
        vcc_mh mh;
        void *va = NULL;
        int r = pin(g, p, len, 0, 0, &mh);
        if (r == 0) {
            r = map(g, mh, &va, len);
        }
        if (r != 0) {
            fprintf(stderr, "vmm_copy_cost: VCC_GDR=pin: pin/map of %zu B failed: %d\n", len, r);
            exit(1);
        }
    }
}

/* VCC_SPLIT: 0 every GPU visible to both processes; 1 one GPU each; 2 both, each its own first. */
static int split_mode(void) {
    const char *v = getenv("VCC_SPLIT");
    return v ? atoi(v) : 0;
}

/* VCC_SYNC_MEMOPS=1: the current context made to synchronise every memory operation. */
static void sync_memops(void) {
    const char *v = getenv("VCC_SYNC_MEMOPS");
    if (v && v[0] == '1') {
        CK(cuCtxSetFlags(CU_CTX_SYNC_MEMOPS));
    }
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    return v[n / 2];
}

static void measure(const char *kind, CUdeviceptr dst, CUdeviceptr src, size_t size, int iters,
                    CUstream s) {
    double *launch = malloc(sizeof(double) * iters), *whole = malloc(sizeof(double) * iters);
    if (!launch || !whole) {
        fprintf(stderr, "vmm_copy_cost: out of host memory for %d samples\n", iters);
        exit(1);
    }
    for (int i = 0; i < iters / 10; i++) { /* warm-up */
        CK(cuMemcpyDtoDAsync(dst, src, size, s));
        CK(cuStreamSynchronize(s));
    }
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        CK(cuMemcpyDtoDAsync(dst, src, size, s));
        double t1 = now_us();
        CK(cuStreamSynchronize(s));
        double t2 = now_us();
        launch[i] = t1 - t0;
        whole[i] = t2 - t0;
    }
    printf("%-10s %8zu B  launch p50 %6.2f us  launch+sync p50 %6.2f us\n", kind, size,
           median(launch, iters), median(whole, iters));
    free(launch);
    free(whole);
}

/* `h` mapped at a fresh range of `len` bytes with read-write access for the `n` devices of
 * `access`. */
static CUdeviceptr vmm_map(CUmemGenericAllocationHandle h, size_t len, const CUdevice *access,
                           int n) {
    CUdeviceptr p;
    CK(cuMemAddressReserve(&p, len, 0, 0, 0));
    CK(cuMemMap(p, len, 0, h, 0));
    CUmemAccessDesc acc[2];
    memset(acc, 0, sizeof acc);
    for (int i = 0; i < n && i < 2; i++) {
        acc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc[i].location.id = access[i];
        acc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    CK(cuMemSetAccess(p, len, acc, n < 2 ? n : 2));
    return p;
}

/* cuMemCreate memory of `len` bytes on `owner` (POSIX-fd handle), mapped at a fresh range with
 * read-write access for the `n` devices of `access`; its handle in `*h`. */
static CUdeviceptr vmm_alloc(CUdevice owner, size_t len, const CUdevice *access, int n,
                             CUmemGenericAllocationHandle *h) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = owner;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.allocFlags.gpuDirectRDMACapable = rdma_capable();
    CK(cuMemCreate(h, len, &prop, 0));
    return vmm_map(*h, len, access, n);
}

/* The memory of the POSIX fd `fd` imported and mapped with access for `dev` only, as UCX's
 * cuda_ipc maps a peer's VMM buffer (uct_cuda_ipc_open_memhandle_vmm). */
static CUdeviceptr import_fd(int fd, size_t len, CUdevice dev) {
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void *)(long)fd,
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    return vmm_map(h, len, &dev, 1);
}

/* The last byte of `size` bytes copied from `src` to `dst` on `s`: what arrived. */
static unsigned char copied_byte(CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream s) {
    unsigned char b;
    CK(cuMemsetD8Async(dst, 0xEE, size, s));
    CK(cuMemcpyDtoDAsync(dst, src, size, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemcpyDtoH(&b, dst + size - 1, 1));
    return b;
}

static size_t granules(size_t size) {
    size_t gran = 2u << 20;
    return ((size + gran - 1) / gran) * gran;
}

static int in_process(size_t size, int iters);
static int across_processes(size_t size, int iters);

int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : 4096;
    int iters = argc > 2 ? atoi(argv[2]) : 20000;
    if (size == 0 || iters < 10) {
        fprintf(stderr, "usage: vmm_copy_cost [SIZE>0 [ITERS>=10]]\n");
        return 2;
    }
    /* Across processes first: fork() comes before this process initializes CUDA. */
    int rc = across_processes(size, iters);
    return rc || split_mode() ? rc : in_process(size, iters);
}

static int in_process(size_t size, int iters) {
    CK(cuInit(0));
    int n;
    CK(cuDeviceGetCount(&n));
    CUdevice d[2];
    CK(cuDeviceGet(&d[0], 0));
    CK(cuDeviceGet(&d[1], n - 1));
    CUcontext c0, c1;
    CK(cuDevicePrimaryCtxRetain(&c0, d[0]));
    CK(cuDevicePrimaryCtxRetain(&c1, d[1]));
    printf("in one process: sender GPU 0, receiver GPU %d (%s)\n", n - 1,
           n > 1 ? "peer" : "the same GPU");

    /* The sender's memory, on GPU 0. */
    CK(cuCtxSetCurrent(c0));
    sync_memops();
    size_t len = granules(size);
    CUdeviceptr legacy;
    CK(cuMemAlloc(&legacy, len));
    CUmemGenericAllocationHandle h, hd;
    CUdeviceptr vmm = vmm_alloc(d[0], len, d, n > 1 ? 2 : 1, &h);
    CK(cuMemsetD8(legacy, 1, len));
    CK(cuMemsetD8(vmm, 2, len));
    CK(cuCtxSynchronize());

    /* The receiver's side: its buffers (the driver's, and cuMemCreate memory as gdr's allocator
     * gives the receiver), its stream, and the imported view of the VMM memory. */
    CK(cuCtxSetCurrent(c1));
    sync_memops();
    if (n > 1) {
        CUresult r = cuCtxEnablePeerAccess(c0, 0);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
            CK(r);
        }
    }
    CUdeviceptr dst;
    CK(cuMemAlloc(&dst, len));
    CUdeviceptr vdst = vmm_alloc(d[1], len, &d[1], 1, &hd);
    gdr_touch(vmm, len);
    gdr_touch(vdst, len);
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int fd = -1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CUdeviceptr imported = import_fd(fd, len, d[1]);

    for (int round = 0; round < 2; round++) { /* twice: the order makes no difference */
        measure("legacy", dst, legacy, size, iters, s);
        measure("vmm", dst, vmm, size, iters, s);
        measure("imported", dst, imported, size, iters, s);
        measure("legacy>vmm", vdst, legacy, size, iters, s);
        measure("imp>vmm", vdst, imported, size, iters, s);
    }
    /* The bytes of each source arrived (1 from the legacy buffer, 2 from the VMM memory). */
    unsigned char got[3] = {copied_byte(dst, legacy, size, s), copied_byte(dst, imported, size, s),
                            copied_byte(vdst, vmm, size, s)};
    if (got[0] != 1 || got[1] != 2 || got[2] != 2) {
        fprintf(stderr, "vmm_copy_cost: wrong bytes %d %d %d\n", got[0], got[1], got[2]);
        return 1;
    }
    printf("bytes ok\n");
    return 0;
}

/* `m` set up to carry `iov` and one file descriptor in `ctl`. */
static void fd_message(struct msghdr *m, struct iovec *iov, char *ctl, size_t ctl_len) {
    memset(m, 0, sizeof *m);
    m->msg_iov = iov;
    m->msg_iovlen = 1;
    m->msg_control = ctl;
    m->msg_controllen = ctl_len;
}

/* The exporter's half of across_processes: makes the two kinds of memory on GPU 0, sends a
 * legacy IPC handle and a POSIX fd of the VMM memory over the socket, and waits for a byte
 * (the importer is done) before it exits. */
static void exporter(int sock, size_t len) {
    CK(cuInit(0));
    CUdevice d0;
    CK(cuDeviceGet(&d0, 0));
    CUcontext c0;
    CK(cuDevicePrimaryCtxRetain(&c0, d0));
    CK(cuCtxSetCurrent(c0));
    sync_memops();
    CUdeviceptr legacy;
    CK(cuMemAlloc(&legacy, len));
    CK(cuMemsetD8(legacy, 1, len));
    CUmemGenericAllocationHandle h;
    CUdeviceptr vmm = vmm_alloc(d0, len, &d0, 1, &h);
    CK(cuMemsetD8(vmm, 2, len));
    CK(cuCtxSynchronize());
    gdr_touch(vmm, len);
    CUipcMemHandle ipc;
    CK(cuIpcGetMemHandle(&ipc, legacy));
    int fd = -1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    struct iovec iov = {&ipc, sizeof ipc};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr m;
    fd_message(&m, &iov, ctl, sizeof ctl);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    if (sendmsg(sock, &m, 0) != (ssize_t)sizeof ipc) {
        perror("vmm_copy_cost: sendmsg");
        exit(1);
    }
    char done;
    exit(read(sock, &done, 1) == 1 ? 0 : 1);
}

/* What UCX's cuda_ipc does between two processes: the exporter's cuMemAlloc memory opened with
 * cuIpcOpenMemHandle, its cuMemCreate memory imported from the fd; each copied into cuMemAlloc
 * memory of the importer's GPU (the last visible one). */
static int across_processes(size_t size, int iters) {
    size_t len = granules(size);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        perror("vmm_copy_cost: socketpair");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("vmm_copy_cost: fork");
        return 1;
    }
    if (child == 0) {
        close(sv[0]);
        if (split_mode()) {
            setenv("CUDA_VISIBLE_DEVICES", split_mode() == 2 ? "0,1" : "0", 1);
        }
        exporter(sv[1], len);
    }
    if (split_mode()) {
        setenv("CUDA_VISIBLE_DEVICES", split_mode() == 2 ? "1,0" : "1", 1);
    }
    close(sv[1]);
    CUipcMemHandle ipc;
    int fd = -1;
    struct iovec iov = {&ipc, sizeof ipc};
    char ctl[CMSG_SPACE(sizeof(int))];
    struct msghdr m;
    fd_message(&m, &iov, ctl, sizeof ctl);
    if (recvmsg(sv[0], &m, MSG_WAITALL) != (ssize_t)sizeof ipc || !CMSG_FIRSTHDR(&m)) {
        fprintf(stderr, "vmm_copy_cost: the exporter sent nothing\n");
        return 1;
    }
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof fd);
    CK(cuInit(0));
    int n;
    CK(cuDeviceGetCount(&n));
    CUdevice d1;
    CK(cuDeviceGet(&d1, split_mode() ? 0 : n - 1)); /* split: its own GPU comes first */
    CUcontext c1;
    CK(cuDevicePrimaryCtxRetain(&c1, d1));
    CK(cuCtxSetCurrent(c1));
    sync_memops();
    printf("across processes: exporter GPU 0, importer GPU %d (VCC_SPLIT=%d)\n",
           split_mode() ? 1 : n - 1, split_mode());
    CUdeviceptr legacy;
    CK(cuIpcOpenMemHandle(&legacy, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CUdeviceptr imported = import_fd(fd, len, d1);
    CUdeviceptr dst;
    CK(cuMemAlloc(&dst, len));
    CUmemGenericAllocationHandle hd;
    CUdeviceptr vdst = vmm_alloc(d1, len, &d1, 1, &hd);
    gdr_touch(vdst, len);
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    for (int round = 0; round < 2; round++) {
        measure("x-legacy", dst, legacy, size, iters, s);
        measure("x-imported", dst, imported, size, iters, s);
        measure("x-imp>vmm", vdst, imported, size, iters, s);
    }
    unsigned char got[2] = {copied_byte(dst, legacy, size, s), copied_byte(dst, imported, size, s)};
    CK(cuIpcCloseMemHandle(legacy));
    CK(cuCtxSetCurrent(NULL));
    CK(cuDevicePrimaryCtxReset(d1)); /* everything this half made goes; in_process starts clean */
    if (write(sv[0], "", 1) != 1) {
        return 1;
    }
    int st = 0;
    waitpid(child, &st, 0);
    if (got[0] != 1 || got[1] != 2 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "vmm_copy_cost: across processes: bytes %d %d, exporter status %d\n",
                got[0], got[1], st);
        return 1;
    }
    return 0;
}
