/* flashcore_set_contiguous_strides, which takes an enum by value: see src/abi_enums.h
 * for why it is C. */
#include "fwd/abi_enums.h"

flashcore_status flashcore_set_contiguous_strides(flashcore_forward_params *params, flashcore_layout layout) {
    return (flashcore_status)fcimpl_set_contiguous_strides(params, (int32_t)layout);
}
