/*
 * What a gdr_copy_to_mapping call costs beyond its stores. Times, interleaved round by round
 * (each round a fresh order, each op a batch of calls): the call with size 0 (its entry
 * checks and handle lookup, nothing stored), the call with 8 bytes and with 1 KiB, and the
 * same bytes stored straight through the mapping (a volatile 8-byte store, a loop of 16-byte
 * non-temporal stores; each then sfence, as the library's copies end). Prints the median,
 * 10th and 90th percentile of each op's per-call time, and the differences.
 *
 * Without a usable GPU, gdr_open() returns NULL and it prints "skipped" and exits 0 (1 under
 * GDR_REQUIRE_GPU=1). Memory comes from the extension gdr_alloc_mapped().
 *
 * Usage: copy_overhead [ROUNDS]   (default 301)
 * Build: cc -std=c99 -O2 copy_overhead.c $(pkg-config --cflags --libs gdrapi)
 */
#define _POSIX_C_SOURCE 199309L
#include <emmintrin.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdrapi.h"

enum { OPS = 5, BATCH = 2000, KIB = 1024 };
static const char *const names[OPS] = {
    "gdr_copy_to_mapping, 0 B", "gdr_copy_to_mapping, 8 B", "direct store, 8 B",
    "gdr_copy_to_mapping, 1 KiB", "direct stores, 1 KiB",
};

static gdr_mh_t mh;
static void *va;
static unsigned char src[KIB] __attribute__((aligned(64)));

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* One call of op k; returns nonzero on a failed call. */
static int run_op(int k, uint64_t i) {
    switch (k) {
    case 0: return gdr_copy_to_mapping(mh, va, src, 0);
    case 1: return gdr_copy_to_mapping(mh, va, src, 8);
    case 2:
        *(volatile uint64_t *)va = i;
        _mm_sfence();
        return 0;
    case 3: return gdr_copy_to_mapping(mh, va, src, KIB);
    default: {
        __m128i v = _mm_set1_epi64x((long long)i);
        for (int o = 0; o < KIB; o += 16) _mm_stream_si128((__m128i *)((char *)va + o), v);
        _mm_sfence();
        return 0;
    }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 301;
    if (rounds < 1 || rounds > 100000) {
        fprintf(stderr, "usage: copy_overhead [ROUNDS]   (1..100000)\n");
        return 2;
    }
    gdr_t g = gdr_open();
    if (!g) {
        const char *req = getenv("GDR_REQUIRE_GPU");
        printf("copy_overhead: skipped: gdr_open() found no usable GPU or backend\n");
        return req && strcmp(req, "1") == 0 ? 1 : 0;
    }
    unsigned long dptr = 0;
    size_t size = 64 * KIB;
    int rc = gdr_alloc_mapped(g, size, &dptr, &mh);
    if (rc == ENOTSUP) { /* gdr_open found a backend, but no Vulkan mapping here */
        const char *req = getenv("GDR_REQUIRE_GPU");
        printf("copy_overhead: skipped: gdr_alloc_mapped: no Vulkan mapping on this GPU\n");
        gdr_close(g);
        return req && strcmp(req, "1") == 0 ? 1 : 0;
    }
    if (rc != 0 || gdr_map(g, mh, &va, size) != 0) {
        printf("copy_overhead: FAILED: gdr_alloc_mapped (%d) or gdr_map\n", rc);
        gdr_close(g);
        return 1;
    }
    for (int i = 0; i < KIB; i++) src[i] = (unsigned char)(i * 7 + 1);
    double *t[OPS];
    for (int k = 0; k < OPS; k++) {
        t[k] = calloc((size_t)rounds, sizeof(double));
        if (!t[k]) return 1;
    }
    int order[OPS] = {0, 1, 2, 3, 4};
    uint64_t i = 1;
    srand((unsigned)time(NULL));
    for (int r = -10; r < rounds; r++) { /* ten warm-up rounds */
        for (int k = OPS - 1; k > 0; k--) { /* a fresh order each round */
            int j = rand() % (k + 1), x = order[k];
            order[k] = order[j];
            order[j] = x;
        }
        for (int n = 0; n < OPS; n++) {
            int k = order[n];
            double t0 = now_ns();
            for (int b = 0; b < BATCH; b++, i++) {
                if (run_op(k, i)) {
                    printf("copy_overhead: FAILED: %s returned an error\n", names[k]);
                    return 1;
                }
            }
            if (r >= 0) t[k][r] = (now_ns() - t0) / BATCH;
        }
    }
    double med[OPS];
    for (int k = 0; k < OPS; k++) {
        qsort(t[k], (size_t)rounds, sizeof(double), cmp);
        med[k] = t[k][rounds / 2];
        printf("%-28s median %7.1f ns   p10 %7.1f   p90 %7.1f\n", names[k], med[k],
               t[k][rounds / 10], t[k][rounds * 9 / 10]);
    }
    printf("call beyond its stores: 8 B %+.1f ns, 1 KiB %+.1f ns; a call of 0 B %.1f ns\n",
           med[1] - med[2], med[3] - med[4], med[0]);
    gdr_unmap(g, mh, va, size);
    gdr_free_mapped(g, mh);
    gdr_close(g);
    for (int k = 0; k < OPS; k++) free(t[k]);
    printf("copy_overhead: 1 passed, 0 failed\n");
    return 0;
}
