/* flashcore_status_string, an exported function that takes an enum by
 * value: see abi_enums.h for why it is C. */
#include "abi_enums.h"

const char *flashcore_status_string(flashcore_status status) { return fcimpl_status_string((int32_t)status); }
