/*
 * dlopen_consumer <path of libflashcore.so.MAJOR>
 *
 * Built by the consumer.dlopen test without any link to libflashcore: loads
 * the library with dlopen (RTLD_NOW, so every undefined symbol of the
 * library must resolve), looks up every function flashcore.h declares (the
 * list, flashcore_symbols.inc, is generated from the installed header at
 * test time), then runs the consumer checks through the looked-up pointers.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "consumer_checks.h"

/* Every generated name must be a function the header declares. */
#define FLASHCORE_SYMBOL(name) (void)&name;
static void generated_names_are_declared(void)
{
#include "flashcore_symbols.inc"
}
#undef FLASHCORE_SYMBOL

#define FLASHCORE_SYMBOL(name) #name,
static const char *const header_functions[] = {
#include "flashcore_symbols.inc"
};
#undef FLASHCORE_SYMBOL

/* dlsym into a function pointer without the object-to-function pointer
 * conversion ISO C does not define (POSIX guarantees the sizes match). */
static int load(void *lib, const char *name, void *fn_ptr, size_t size)
{
    void *sym = dlsym(lib, name);
    if (sym == NULL || size != sizeof sym) {
        printf("FAIL: dlsym(%s): %s\n", name, sym ? "pointer size mismatch" : dlerror());
        return 0;
    }
    memcpy(fn_ptr, &sym, size);
    return 1;
}

int main(int argc, char **argv)
{
    flashcore_test_api api;
    size_t i, count = sizeof header_functions / sizeof header_functions[0];
    int missing = 0;
    void *lib;

    if (argc != 2) {
        fprintf(stderr, "usage: %s <path of libflashcore.so.MAJOR>\n", argv[0]);
        return 2;
    }
    generated_names_are_declared();
    if (dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) != NULL) {
        printf("FAIL: %s was loaded before dlopen: the program must not link it\n", argv[1]);
        return 1;
    }
    lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        printf("FAIL: dlopen(%s): %s\n", argv[1], dlerror());
        return 1;
    }

    for (i = 0; i < count; ++i) {
        void *sym = dlsym(lib, header_functions[i]);
        printf("%s %s\n", sym ? "ok:   dlsym" : "FAIL: dlsym", header_functions[i]);
        missing += sym == NULL;
    }
    printf("%d of the %u functions in flashcore.h missing from %s\n", missing, (unsigned)count, argv[1]);

#define FLASHCORE_TEST_API_LOAD(ret, name, params) \
    missing += !load(lib, "flashcore_" #name, &api.name, sizeof api.name);
    FLASHCORE_TEST_API(FLASHCORE_TEST_API_LOAD)
#undef FLASHCORE_TEST_API_LOAD
    if (missing)
        return 1;

    if (consumer_run_checks(&api, "dlopen") != 0)
        return 1;
    if (dlclose(lib) != 0) {
        printf("FAIL: dlclose: %s\n", dlerror());
        return 1;
    }
    return 0;
}
