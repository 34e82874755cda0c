/* Run with libgdr_alloc.so preloaded over the fake libcuda: every path by which a program
 * reaches the driver's allocation calls must reach the preloaded entry points, and with no
 * usable GPU they must pass each call through to the driver unchanged. Prints one line per
 * check ("ok ..." / "FAIL ...") and exits 1 on any failure. argv[1]: "on" (the allocator is
 * enabled) or "off" (GDR_ALLOC=off: cuMemCreate is left as asked). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*gpa_fn)(const char *, void **, int, unsigned long long, int *);

static int failures;
static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) failures++;
}

int main(int argc, char **argv) {
    int on = argc > 1 && strcmp(argv[1], "on") == 0;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    check(cuda != NULL, "libcuda.so.1 (the fake) loads");
    if (!cuda) return 1;
    int *allocs = dlsym(cuda, "fake_calls_alloc");
    int *frees = dlsym(cuda, "fake_calls_free");
    int *types = dlsym(cuda, "fake_last_handle_types");
    void *preload_alloc = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    void *(*real_dlsym)(void *, const char *) = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    void *fake_alloc = real_dlsym(cuda, "cuMemAlloc_v2");
    check(preload_alloc && fake_alloc && preload_alloc != fake_alloc,
          "the global scope finds the preloaded cuMemAlloc_v2, not libcuda's");

    /* By symbol. */
    CUdeviceptr p = 0;
    CUresult rc = ((alloc_fn)preload_alloc)(&p, 4096);
    check(rc == 0 && p == 0xf00d0000 && *allocs == 1, "cuMemAlloc_v2 passes through to the driver");
    rc = ((CUresult(*)(CUdeviceptr))dlsym(RTLD_DEFAULT, "cuMemFree_v2"))(p);
    check(rc == 0 && *frees == 1, "cuMemFree_v2 of driver memory passes through");

    /* Through dlsym on libcuda's handle. */
    check(dlsym(cuda, "cuMemAlloc_v2") == fake_alloc,
          "dlsym(libcuda, cuMemAlloc_v2) gives libcuda's own (for tools that patch it)");
    check(dlsym(cuda, "cuMemsetD8_v2") == real_dlsym(cuda, "cuMemsetD8_v2"),
          "dlsym(libcuda, cuMemsetD8_v2) (not served) gives libcuda's own");
    check(dlsym(cuda, "no_such_symbol") == NULL && dlerror() != NULL,
          "a missing symbol gives NULL and a dlerror() message");
    gpa_fn gpa = (gpa_fn)dlsym(cuda, "cuGetProcAddress_v2");
    check(gpa == (gpa_fn)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2") &&
              gpa != (gpa_fn)real_dlsym(cuda, "cuGetProcAddress_v2"),
          "dlsym(libcuda, cuGetProcAddress_v2) gives the preloaded one");

    /* Through cuGetProcAddress, as the CUDA runtime goes. */
    void *fn = NULL;
    int status = -1;
    rc = gpa("cuMemAlloc", &fn, 13000, 0, &status);
    check(rc == 0 && fn == preload_alloc, "cuGetProcAddress(cuMemAlloc) gives the preloaded entry point");
    rc = ((alloc_fn)fn)(&p, 100);
    check(rc == 0 && *allocs == 2, "... which passes through to the driver");
    rc = gpa("cuMemsetD8", &fn, 13000, 0, &status);
    check(rc == 0 && fn == real_dlsym(cuda, "cuMemsetD8_v2"), "cuGetProcAddress(cuMemsetD8) is libcuda's own");
    rc = gpa("cuNoSuchCall", &fn, 13000, 0, &status);
    check(rc == 500 && fn == NULL && status == 1, "cuGetProcAddress's own errors come back unchanged");

    /* cuMemCreate without a shareable handle type. */
    struct { int type, handle_types, loc_type, loc_id; void *meta; unsigned char rest[8]; } prop = {1, 0, 1, 0, 0, {0}};
    unsigned long long h = 0;
    /* By symbol, as a program linked against libcuda calls it. */
    rc = ((CUresult(*)(unsigned long long *, size_t, const void *, unsigned long long))dlsym(
        RTLD_DEFAULT, "cuMemCreate"))(&h, 2 << 20, &prop, 0);
    check(rc == 0 && h == 42 && prop.handle_types == 0, "cuMemCreate passes through, the caller's props untouched");
    check(*types == (on ? 1 : 0), on ? "... with the POSIX-fd handle type added"
                                      : "... as asked (GDR_ALLOC=off)");

    /* The allocator's own view. */
    int (*active)(int, char *, size_t) = dlsym(RTLD_DEFAULT, "gdr_alloc_active");
    char why[256] = "";
    check(active && active(0, why, sizeof why) == 0 && why[0] != 0, "gdr_alloc_active(0) says no, and why");
    printf("info why: %s\n", why);
    unsigned long long stats[10] = {0};
    int (*get_stats)(void *) = dlsym(RTLD_DEFAULT, "gdr_alloc_get_stats");
    check(get_stats && get_stats(stats) == 0 && stats[0] == 0 && stats[8] == (on ? 2 : 0),
          "stats: nothing served; passed-through calls counted when enabled");
    int (*pin)(unsigned long long, size_t, void *) = dlsym(RTLD_DEFAULT, "gdr_alloc_pin");
    unsigned char pinned[40];
    check(pin && pin(0xf00d0000, 4096, pinned) == 2 /* ENOENT */, "gdr_alloc_pin of driver memory: ENOENT");
    printf("passthrough: %d failed\n", failures);
    return failures != 0;
}
