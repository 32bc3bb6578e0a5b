/* The fwd family's exported function that takes an enum by value,
 * flashcore_set_contiguous_strides: defined in C (fwd/abi_enums.c; src/abi_enums.h says
 * why), implemented in C++ (fwd/api.cpp) on an int32_t. */
#ifndef FLASHCORE_FWD_ABI_ENUMS_H
#define FLASHCORE_FWD_ABI_ENUMS_H

#include <stdint.h>

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* flashcore_set_contiguous_strides with the layout value `layout`; returns a flashcore_status. */
int32_t fcimpl_set_contiguous_strides(flashcore_forward_params *params, int32_t layout);

#ifdef __cplusplus
}
#endif

#endif
