/*
 * What every consumer program checks, through a table of function pointers
 * (flashcore_test_api.h) so the same checks run against the library linked
 * directly (consumer.c) and loaded with dlopen (dlopen_consumer.c).
 *
 * Each check prints one line; consumer_run_checks returns the number that
 * failed. Without a GPU, flashcore_create must report NO_DEVICE (printed, not
 * a failure); with one, it must succeed and the handle is destroyed again.
 */
#ifndef FLASHCORE_CONSUMER_CHECKS_H
#define FLASHCORE_CONSUMER_CHECKS_H

#include <stdio.h>
#include <string.h>

#include "flashcore_test_api.h"

static int consumer_failures = 0;

static void consumer_check(int ok, const char *what, const char *detail)
{
    printf("%s %s%s%s\n", ok ? "ok:  " : "FAIL:", what, detail ? ": " : "", detail ? detail : "");
    if (!ok)
        consumer_failures++;
}

static const char *consumer_status_name(const flashcore_test_api *api, flashcore_status status)
{
    const char *name = api->status_string(status);
    return name ? name : "(null)";
}

static void consumer_check_versions(const flashcore_test_api *api)
{
    char expected[64];
    char detail[128];
    unsigned number = api->version_number();

    snprintf(detail, sizeof detail, "library %u, header %u", number, (unsigned)FLASHCORE_VERSION_NUMBER);
    consumer_check(number == FLASHCORE_VERSION_NUMBER, "flashcore_version_number() == FLASHCORE_VERSION_NUMBER",
                   detail);
    snprintf(expected, sizeof expected, "%d.%d.%d", FLASHCORE_VERSION_MAJOR, FLASHCORE_VERSION_MINOR,
             FLASHCORE_VERSION_PATCH);
    consumer_check(api->version_string() && strcmp(api->version_string(), expected) == 0,
                   "flashcore_version_string() is MAJOR.MINOR.PATCH of the header", expected);
}

/* Each status has its own non-empty name; an unknown value gives "unknown status". */
static void consumer_check_status_strings(const flashcore_test_api *api)
{
    const char *names[FLASHCORE_STATUS_INTERNAL + 1];
    int s, t;

    for (s = FLASHCORE_STATUS_SUCCESS; s <= FLASHCORE_STATUS_INTERNAL; ++s) {
        const char *name = api->status_string((flashcore_status)s);
        int ok = name != NULL && name[0] != '\0' && strcmp(name, "unknown status") != 0;
        char what[64];

        for (t = 0; ok && t < s; ++t)
            ok = strcmp(names[t], name) != 0;
        names[s] = ok ? name : "";
        snprintf(what, sizeof what, "flashcore_status_string(%d) is its own name", s);
        consumer_check(ok, what, name ? name : "(null)");
    }
    consumer_check(strcmp(consumer_status_name(api, (flashcore_status)1000), "unknown status") == 0,
                   "flashcore_status_string(1000) is \"unknown status\"", consumer_status_name(api, (flashcore_status)1000));
}

static void consumer_check_params(const flashcore_test_api *api)
{
    flashcore_forward_params p;
    flashcore_status st;

    memset(&p, 0x5a, sizeof p);
    st = api->forward_params_init(&p, sizeof p);
    consumer_check(st == FLASHCORE_STATUS_SUCCESS, "flashcore_forward_params_init succeeds",
                   consumer_status_name(api, st));
    consumer_check(api->last_error_message() != NULL && api->last_error_message()[0] == '\0',
                   "flashcore_last_error_message() is \"\" after a success", api->last_error_message());
    consumer_check(p.struct_size == sizeof p && p.dtype == FLASHCORE_DTYPE_FP16 && p.causal == 0 &&
                       p.batch_size == 0 && p.head_dim == 0 && p.q == NULL && p.out == NULL &&
                       p.softmax_scale == FLASHCORE_SOFTMAX_SCALE_DEFAULT && p.out_head_stride == 0,
                   "flashcore_forward_params_init sets struct_size and the documented defaults", NULL);

    /* Deliberately invalid: every size 0, every pointer NULL. */
    st = api->forward_check(&p);
    consumer_check(st == FLASHCORE_STATUS_INVALID_ARGUMENT,
                   "flashcore_forward_check on sizes 0 and NULL pointers is INVALID_ARGUMENT",
                   consumer_status_name(api, st));
    consumer_check(api->last_error_message() != NULL && api->last_error_message()[0] != '\0',
                   "flashcore_last_error_message() explains the failure", api->last_error_message());
    st = api->forward_check(NULL);
    consumer_check(st == FLASHCORE_STATUS_INVALID_ARGUMENT, "flashcore_forward_check(NULL) is INVALID_ARGUMENT",
                   consumer_status_name(api, st));
}

/* The head dims query: a sizing call, then a call with room for every pair. */
static void consumer_check_supported_head_dims(const flashcore_test_api *api)
{
    int32_t dims[64] = {0}, dims_v[64] = {0};
    char detail[96];
    size_t count = 0, again = 0, i;
    int ok;
    flashcore_status st = api->supported_head_dims(NULL, NULL, 0, &count);

    snprintf(detail, sizeof detail, "%s, %u pair(s)", consumer_status_name(api, st), (unsigned)count);
    consumer_check(st == FLASHCORE_STATUS_SUCCESS && count >= 1 && count <= 64,
                   "flashcore_supported_head_dims(NULL, NULL, 0, &count) counts the pairs", detail);
    if (st != FLASHCORE_STATUS_SUCCESS || count < 1 || count > 64)
        return;
    st = api->supported_head_dims(dims, dims_v, 64, &again);
    ok = st == FLASHCORE_STATUS_SUCCESS && again == count;
    for (i = 0; ok && i < count; ++i)
        ok = dims[i] >= 8 && dims[i] % 8 == 0 && dims_v[i] >= 8 && dims_v[i] % 8 == 0;
    snprintf(detail, sizeof detail, "first (%d, %d)", (int)dims[0], (int)dims_v[0]);
    consumer_check(ok, "flashcore_supported_head_dims lists pairs of multiples of 8", detail);
    st = api->supported_head_dims(dims, dims_v, 64, NULL);
    consumer_check(st == FLASHCORE_STATUS_INVALID_ARGUMENT, "flashcore_supported_head_dims with count NULL is "
                   "INVALID_ARGUMENT", consumer_status_name(api, st));
}

static void consumer_check_handle(const flashcore_test_api *api)
{
    flashcore_forward_params sentinel;
    flashcore_handle h = (flashcore_handle)(void *)&sentinel; /* must be overwritten */
    flashcore_status st = api->create(&h);

    if (st == FLASHCORE_STATUS_SUCCESS) {
        int device = -1;
        consumer_check(h != NULL, "flashcore_create succeeds with a GPU and gives a handle", NULL);
        st = api->handle_device(h, &device);
        consumer_check(st == FLASHCORE_STATUS_SUCCESS && device >= 0, "flashcore_handle_device gives an ordinal",
                       consumer_status_name(api, st));
        st = api->destroy(h);
        consumer_check(st == FLASHCORE_STATUS_SUCCESS, "flashcore_destroy succeeds", consumer_status_name(api, st));
    } else if (st == FLASHCORE_STATUS_NO_DEVICE || st == FLASHCORE_STATUS_UNSUPPORTED) {
        /* No GPU or driver here (or one older than sm_80): the documented answer. */
        printf("note: flashcore_create: %s (%s)\n", consumer_status_name(api, st), api->last_error_message());
        consumer_check(h == NULL, "flashcore_create writes NULL to the handle on failure", NULL);
    } else {
        consumer_check(0, "flashcore_create gives SUCCESS, NO_DEVICE or UNSUPPORTED", api->last_error_message());
    }
    st = api->destroy(NULL);
    consumer_check(st == FLASHCORE_STATUS_SUCCESS, "flashcore_destroy(NULL) does nothing and succeeds",
                   consumer_status_name(api, st));
}

static int consumer_run_checks(const flashcore_test_api *api, const char *how)
{
    printf("flashcore consumer (%s), built against flashcore.h %d.%d.%d\n", how, FLASHCORE_VERSION_MAJOR,
           FLASHCORE_VERSION_MINOR, FLASHCORE_VERSION_PATCH);
    consumer_check_versions(api);
    consumer_check_status_strings(api);
    consumer_check_params(api);
    consumer_check_supported_head_dims(api);
    consumer_check_handle(api);
    printf("%d check(s) failed\n", consumer_failures);
    return consumer_failures;
}

#endif /* FLASHCORE_CONSUMER_CHECKS_H */
