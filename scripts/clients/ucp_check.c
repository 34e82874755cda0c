/*
 * Bytes through UCX between two processes, from CUDA buffers, every byte compared. This is the
 * data check that ucx_perftest lacks (docs/ucx.md): what gdr changes under UCX (its
 * libgdrapi, gdr's allocator, the chunk that cuMemGetAddressRange reports) must leave every
 * byte where UCX was asked to put it, whichever transport carries it (cuda_ipc, gdr_copy,
 * cuda_copy, shared memory).
 *
 *   ucp_check server PORT            waits for one client on 127.0.0.1:PORT
 *   ucp_check client PORT [SIZES]    sizes: comma-separated byte counts (K, M suffixes);
 *                                    default 1 B .. 16 MiB
 *
 * For every size and three rounds, the client sends fresh random bytes from a CUDA buffer at
 * an offset inside a shared allocation (under `gdr run`: inside an allocator chunk that holds
 * other blocks, not at its start, for every size up to 10 MiB; buffers are freed after each
 * size, so later sizes reuse memory that UCX has seen), the server receives them into a CUDA buffer poisoned with
 * 0xee and guarded by 64 bytes on each side, checks every byte and the guards, and sends the
 * bytes back from another such buffer; the client checks them the same way. Tag-matched
 * messages (ucp_tag_send_nbx / ucp_tag_recv_nbx), as MPI over UCX sends them; UCX detects the
 * memory type itself. The worker addresses travel over a TCP socket on loopback.
 *
 * Output: one "ok SIZE ..." / "FAIL SIZE ..." line per size and side, the chunk layout of the
 * buffers, and "ucp_check <role>: N passed, M failed"; exit 1 on a failure.
 *
 * Build (on the GPU host, against a UCX install): cc -O2 ucp_check.c -o ucp_check
 *   -I$UCX/include -L$UCX/lib -Wl,-rpath,$UCX/lib -lucp -lucs -I$CUDA/include -L$CUDA/lib64
 *   -lcudart -lcuda
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#define GUARD 64
#define ROUNDS 3
#define POISON 0xee

static int passed, failed;
static ucp_worker_h worker;

static void die(const char *what) {
    fprintf(stderr, "ucp_check: %s\n", what);
    exit(2);
}

/* ---- the socket: worker addresses and a barrier ---- */

static void xfer(int fd, void *p, size_t n, int out) {
    uint8_t *b = p;
    while (n) {
        ssize_t r = out ? write(fd, b, n) : read(fd, b, n);
        if (r <= 0) die(out ? "socket write failed" : "socket read failed (peer gone)");
        b += r;
        n -= (size_t)r;
    }
}

static int connect_oob(int server, int port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    if (server) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1)) die("cannot listen");
        int fd = accept(l, NULL, NULL);
        close(l);
        if (fd < 0) die("accept failed");
        return fd;
    }
    for (int i = 0; i < 300; i++) { /* the server may start a little later: 30 s */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            return fd;
        }
        close(fd);
        usleep(100000);
    }
    die("cannot connect to the server");
    return -1;
}

static void barrier(int fd) {
    char c = 'b';
    xfer(fd, &c, 1, 1);
    xfer(fd, &c, 1, 0);
}

/* ---- UCP ---- */

/* Waits for a request; its status. */
static ucs_status_t wait_req(ucs_status_ptr_t r) {
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    while ((st = ucp_request_check_status(r)) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(r);
    return st;
}

static ucs_status_t send_msg(ucp_ep_h ep, const void *buf, size_t len, ucp_tag_t tag) {
    ucp_request_param_t p = {.op_attr_mask = 0};
    return wait_req(ucp_tag_send_nbx(ep, buf, len, tag, &p));
}

/* Receives a message of tag `tag` into `buf` (room for `cap` bytes); its length in *got. */
static ucs_status_t recv_msg(void *buf, size_t cap, ucp_tag_t tag, size_t *got) {
    ucp_tag_recv_info_t info = {0};
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_RECV_INFO};
    p.recv_info.tag_info = &info;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker, buf, cap, tag, (ucp_tag_t)-1, &p);
    if (r == NULL) {
        *got = info.length;
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    while ((st = ucp_tag_recv_request_test(r, &info)) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(r);
    *got = info.length;
    return st;
}

/* ---- bytes ---- */

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)(x >> 24);
    }
}

/* A CUDA buffer for messages of up to `cap` bytes, at a place inside a shared allocation. */
struct slot {
    uint8_t *alloc; /* what cudaMalloc gave */
    uint8_t *msg;   /* where messages go: GUARD bytes in, at an odd offset */
    size_t cap;
};

/*
 * A block of the same size class first (gdr's allocator: up to 1 MiB, up to 10 MiB, larger),
 * so that under gdr's allocator this one is not at its chunk's start: a peer that maps the chunk
 * at offset 0 must then add the block's offset. Larger requests get a chunk of their own. The
 * spacer stays allocated for the run.
 */
static void slot_make(struct slot *s, size_t cap, size_t skew) {
    size_t want = cap + 2 * GUARD + 64;
    size_t spacer_len = want <= (1u << 20) ? 4096 + skew : (1u << 20) + 4096 + skew;
    void *spacer = NULL;
    if (cudaMalloc(&spacer, spacer_len) != cudaSuccess) die("cudaMalloc (spacer)");
    if (cudaMalloc((void **)&s->alloc, want) != cudaSuccess) die("cudaMalloc");
    s->msg = s->alloc + GUARD + (skew % 61) + 1;
    s->cap = cap;
    CUdeviceptr base = 0;
    size_t size = 0;
    cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)s->msg);
    printf("buffer %p for %zu bytes: offset %llu in the allocation %#llx+%zu the driver reports\n",
           (void *)s->msg, cap, (unsigned long long)((CUdeviceptr)(uintptr_t)s->msg - base),
           (unsigned long long)base, size);
}

/* Poisons the message area and its guards. */
static void poison(struct slot *s, size_t len) {
    cudaMemset(s->msg - GUARD, POISON, len + 2 * GUARD);
    cudaDeviceSynchronize();
}

/* Whether the `len` bytes at the slot are `want` and the guards still poison. */
static int verify(struct slot *s, const uint8_t *want, size_t len, size_t *bad) {
    uint8_t *h = malloc(len + 2 * GUARD);
    cudaMemcpy(h, s->msg - GUARD, len + 2 * GUARD, cudaMemcpyDeviceToHost);
    int ok = 1;
    for (size_t i = 0; i < len + 2 * GUARD && ok; i++) {
        uint8_t w = (i < GUARD || i >= GUARD + len) ? POISON : want[i - GUARD];
        if (h[i] != w) {
            ok = 0;
            *bad = i;
        }
    }
    free(h);
    return ok;
}

static void result(const char *role, size_t len, int ok, const char *why) {
    printf("%s %zu B (%s): %s\n", ok ? "ok" : "FAIL", len, role, why);
    fflush(stdout);
    if (ok)
        passed++;
    else
        failed++;
}

static size_t parse_size(const char *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'K' || *end == 'k') v <<= 10;
    if (*end == 'M' || *end == 'm') v <<= 20;
    return (size_t)v;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: ucp_check server PORT | client PORT [SIZES]\n");
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    const char *role = server ? "server" : "client";
    size_t sizes[64];
    int nsizes = 0;
    const char *list = argc > 3 ? argv[3]
                                : "1,7,8,64,1000,1024,2048,3000,4096,8192,16384,32768,65536,"
                                  "65541,262144,1M,1048583,4M,16M";
    char *copy = strdup(list), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && nsizes < 64; t = strtok_r(NULL, ",", &save))
        sizes[nsizes++] = parse_size(t);
    size_t max = 0;
    for (int i = 0; i < nsizes; i++) max = sizes[i] > max ? sizes[i] : max;

    if (cudaSetDevice(0) != cudaSuccess || cudaFree(0) != cudaSuccess) {
        const char *req = getenv("GDR_REQUIRE_GPU");
        printf("ucp_check: skipped: no GPU\n");
        return req && !strcmp(req, "1") ? 1 : 0;
    }
    int fd = connect_oob(server, atoi(argv[2]));

    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_TAG};
    ucp_config_t *config;
    ucp_context_h ctx;
    if (ucp_config_read(NULL, NULL, &config) != UCS_OK) die("ucp_config_read");
    if (ucp_init(&params, config, &ctx) != UCS_OK) die("ucp_init");
    ucp_config_release(config);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK) die("ucp_worker_create");
    ucp_address_t *addr;
    size_t addr_len;
    if (ucp_worker_get_address(worker, &addr, &addr_len) != UCS_OK) die("ucp_worker_get_address");
    uint64_t n = addr_len, peer_len;
    xfer(fd, &n, sizeof n, 1);
    xfer(fd, &peer_len, sizeof peer_len, 0);
    void *peer = malloc(peer_len);
    xfer(fd, addr, addr_len, 1);
    xfer(fd, peer, peer_len, 0);
    ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                                 .address = peer};
    ucp_ep_h ep;
    if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) die("ucp_ep_create");

    /* For every size, a buffer to send from and one to receive into, each inside a shared
     * allocation, freed after the size: the next sizes reuse the freed memory. */
    struct slot tx, rx;
    uint8_t *want = malloc(max);
    const uint64_t seed = (uint64_t)time(NULL);
    uint64_t peer_seed;
    xfer(fd, (void *)&seed, sizeof seed, 1);
    xfer(fd, &peer_seed, sizeof peer_seed, 0);
    uint64_t run_seed = server ? peer_seed : seed; /* the client's */
    printf("seed %llu\n", (unsigned long long)run_seed);

    for (int i = 0; i < nsizes; i++) {
        size_t len = sizes[i];
        slot_make(&tx, len, (server ? 3 : 5) + (size_t)i * 17);
        slot_make(&rx, len, (server ? 7 : 11) + (size_t)i * 13);
        int ok = 1;
        char why[160] = "every byte, guards intact, 3 rounds";
        for (int round = 0; round < ROUNDS; round++) { /* all rounds on both sides, even after a failure */
            ucp_tag_t tag = ((ucp_tag_t)i << 8) | (ucp_tag_t)round;
            fill(want, len, run_seed ^ (len * 131 + (size_t)round));
            size_t got = 0, bad = 0;
            ucs_status_t st;
            if (server) {
                /* Receive, check, send back what arrived from the other buffer. */
                poison(&rx, len);
                barrier(fd);
                st = recv_msg(rx.msg, len, tag, &got);
                if (!ok) {
                    /* the first failure is the one reported */
                } else if (st != UCS_OK || got != len) {
                    snprintf(why, sizeof why, "receive: %s, %zu bytes", ucs_status_string(st), got);
                    ok = 0;
                } else if (!verify(&rx, want, len, &bad)) {
                    snprintf(why, sizeof why, "received bytes differ at %zd (round %d)",
                             (ssize_t)bad - GUARD, round);
                    ok = 0;
                }
                cudaMemcpy(tx.msg, rx.msg, len, cudaMemcpyDeviceToDevice);
                cudaDeviceSynchronize(); /* a device-to-device copy returns before it is done */
                barrier(fd);
                st = send_msg(ep, tx.msg, len, tag);
                if (ok && st != UCS_OK) {
                    snprintf(why, sizeof why, "send back: %s", ucs_status_string(st));
                    ok = 0;
                }
            } else {
                cudaMemcpy(tx.msg, want, len, cudaMemcpyHostToDevice);
                cudaDeviceSynchronize(); /* from pageable memory it may return before the DMA */
                        barrier(fd);
                st = send_msg(ep, tx.msg, len, tag);
                if (ok && st != UCS_OK) {
                    snprintf(why, sizeof why, "send: %s", ucs_status_string(st));
                    ok = 0;
                }
                poison(&rx, len);
                barrier(fd);
                st = recv_msg(rx.msg, len, tag, &got);
                if (!ok) {
                    /* the first failure is the one reported */
                } else if (st != UCS_OK || got != len) {
                    snprintf(why, sizeof why, "receive back: %s, %zu bytes", ucs_status_string(st), got);
                    ok = 0;
                } else if (!verify(&rx, want, len, &bad)) {
                    snprintf(why, sizeof why, "bytes sent back differ at %zd (round %d)",
                             (ssize_t)bad - GUARD, round);
                    ok = 0;
                }
            }
        }
        result(role, len, ok, why);
        cudaFree(tx.alloc);
        cudaFree(rx.alloc);
        /* Both sides go on together even after a failure on one (the rounds stay paired). */
        int peer_ok = ok, mine = ok;
        xfer(fd, &mine, sizeof mine, 1);
        xfer(fd, &peer_ok, sizeof peer_ok, 0);
        if (!ok || !peer_ok) {
            printf("stopping after %zu B: %s failed\n", len, !ok ? role : "the peer");
            break;
        }
    }
    barrier(fd);
    ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_EP_CLOSE_FLAG_FORCE};
    wait_req(ucp_ep_close_nbx(ep, &cp));
    barrier(fd);
    ucp_worker_release_address(worker, addr);
    ucp_worker_destroy(worker);
    ucp_cleanup(ctx);
    printf("ucp_check %s: %d passed, %d failed\n", role, passed, failed);
    return failed ? 1 : 0;
}
