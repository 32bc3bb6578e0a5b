/* flashcore_status_string, flashcore_set_contiguous_strides and
 * flashcore_backward_set_contiguous_strides, the exported functions that take
 * an enum by value: see abi_enums.h for why they are C. */
#include "abi_enums.h"

const char *flashcore_status_string(flashcore_status status) { return fcimpl_status_string((int32_t)status); }

flashcore_status flashcore_set_contiguous_strides(flashcore_forward_params *params, flashcore_layout layout) {
    return (flashcore_status)fcimpl_set_contiguous_strides(params, (int32_t)layout);
}

flashcore_status flashcore_backward_set_contiguous_strides(flashcore_backward_params *params, flashcore_layout layout) {
    return (flashcore_status)fcimpl_backward_set_contiguous_strides(params, (int32_t)layout);
}
