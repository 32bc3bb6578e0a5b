/*
 * Every public function of flashcore.h with its exact signature, as an
 * X-macro, for the tests: abi.c initialises a table of typed pointers from it
 * (so a signature change in the header is a compile error), and the consumer
 * programs call the library through such a table (linked directly, or filled
 * with dlsym).
 *
 * X(return type, name without the "flashcore_" prefix, parameter list)
 */
#ifndef FLASHCORE_TEST_API_H
#define FLASHCORE_TEST_API_H

#include "flashcore.h"

#define FLASHCORE_TEST_API(X)                                                                             \
    X(unsigned, version_number, (void))                                                                   \
    X(const char *, version_string, (void))                                                               \
    X(const char *, status_string, (flashcore_status))                                                    \
    X(const char *, last_error_message, (void))                                                           \
    X(flashcore_status, create, (flashcore_handle *))                                                     \
    X(flashcore_status, create_for_device, (flashcore_handle *, int))                                     \
    X(flashcore_status, destroy, (flashcore_handle))                                                      \
    X(flashcore_status, handle_device, (flashcore_handle, int *))                                         \
    X(flashcore_status, forward_params_init, (flashcore_forward_params *, size_t))                        \
    X(flashcore_status, set_contiguous_strides, (flashcore_forward_params *, flashcore_layout))           \
    X(flashcore_status, supported_head_dims, (int32_t *, int32_t *, size_t, size_t *))                    \
    X(flashcore_status, forward_check, (const flashcore_forward_params *))                                \
    X(flashcore_status, forward_workspace_size,                                                           \
      (flashcore_handle, const flashcore_forward_params *, size_t *))                                     \
    X(flashcore_status, forward,                                                                          \
      (flashcore_handle, const flashcore_forward_params *, void *, size_t, void *))                       \
    X(flashcore_status, merge_params_init, (flashcore_merge_params *, size_t))                            \
    X(flashcore_status, merge_check, (const flashcore_merge_params *))                                    \
    X(flashcore_status, merge_states, (flashcore_handle, const flashcore_merge_params *, void *))         \
    X(flashcore_status, backward_params_init, (flashcore_backward_params *, size_t))                      \
    X(flashcore_status, backward_set_contiguous_strides, (flashcore_backward_params *, flashcore_layout)) \
    X(flashcore_status, backward_check, (const flashcore_backward_params *))                              \
    X(flashcore_status, backward_workspace_size,                                                          \
      (flashcore_handle, const flashcore_backward_params *, size_t *))                                    \
    X(flashcore_status, backward,                                                                         \
      (flashcore_handle, const flashcore_backward_params *, void *, size_t, void *))

#define FLASHCORE_TEST_API_MEMBER(ret, name, params) ret (*name) params;
typedef struct flashcore_test_api {
    FLASHCORE_TEST_API(FLASHCORE_TEST_API_MEMBER)
} flashcore_test_api;

/* Initialiser of a flashcore_test_api from the linked functions:
 *     flashcore_test_api api = { FLASHCORE_TEST_API(FLASHCORE_TEST_API_LINKED) }; */
#define FLASHCORE_TEST_API_LINKED(ret, name, params) flashcore_##name,

#endif /* FLASHCORE_TEST_API_H */
