/* The bwd family's exported function that takes an enum by value,
 * flashcore_backward_set_contiguous_strides: defined in C (bwd/abi_enums.c; src/abi_enums.h says
 * why), implemented in C++ (bwd/api.cpp) on an int32_t. */
#ifndef FLASHCORE_BWD_ABI_ENUMS_H
#define FLASHCORE_BWD_ABI_ENUMS_H

#include <stdint.h>

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* flashcore_backward_set_contiguous_strides with the layout value `layout`; returns a flashcore_status. */
int32_t fcimpl_backward_set_contiguous_strides(flashcore_backward_params *params, int32_t layout);

#ifdef __cplusplus
}
#endif

#endif
