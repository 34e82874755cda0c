/*
 * dlopen()s the library named on the command line, dlclose()s it, and checks that it is still
 * loaded (RTLD_NOLOAD finds it) at the address it had: a library that hands out memory and
 * mappings must not be unloaded under them (it is linked with -z nodelete).
 * Build: cc -std=c99 -Wall -Wextra -Werror stays_loaded.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: stays_loaded LIBRARY SYMBOL\n");
        return 2;
    }
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD)) {
        fprintf(stderr, "FAIL: %s is loaded before the dlopen\n", argv[1]);
        return 1;
    }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL: dlopen %s: %s\n", argv[1], dlerror());
        return 1;
    }
    void *sym = dlsym(h, argv[2]);
    if (!sym) {
        fprintf(stderr, "FAIL: %s not found: %s\n", argv[2], dlerror());
        return 1;
    }
    if (dlclose(h) != 0) {
        fprintf(stderr, "FAIL: dlclose: %s\n", dlerror());
        return 1;
    }
    void *again = dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD);
    if (!again) {
        fprintf(stderr, "FAIL: %s was unloaded by dlclose\n", argv[1]);
        return 1;
    }
    if (dlsym(again, argv[2]) != sym) {
        fprintf(stderr, "FAIL: %s moved\n", argv[2]);
        return 1;
    }
    printf("stays_loaded: %s stayed loaded after dlclose\n", argv[1]);
    return 0;
}
