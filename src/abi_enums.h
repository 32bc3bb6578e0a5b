/* The exported functions that take an enum by value are defined in C
 * (abi_enums.c): a C enum parameter is an int of any value, whereas C++ may
 * not load an enum outside its enumerators' range (UBSan: -fsanitize=enum),
 * and callers in C, Python or Rust can pass any int. The C definitions pass
 * the value on as an int32_t to these C++ implementations, which check it.
 * A family's own are beside it (src/<family>/abi_enums.{h,c}).
 * (Not prefixed flashcore_: the version script exports only that prefix.) */
#ifndef FLASHCORE_ABI_ENUMS_H
#define FLASHCORE_ABI_ENUMS_H

#include <stdint.h>

#include "flashcore.h"

#ifdef __cplusplus
extern "C" {
#endif

/* flashcore_status_string of the status value `status`. */
const char *fcimpl_status_string(int32_t status);

#ifdef __cplusplus
}
#endif

#endif
