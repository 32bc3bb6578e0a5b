/* Calls that pass an int outside an enum's enumerators where the API takes
 * the enum by value. In C an enum is an int of any value, so this is how a C
 * (or Python, or Rust) caller can reach the library; test_api.cpp calls
 * these, since in C++ producing such an enum value is itself undefined. */
#include "flashcore.h"

const char *status_string_of_int(int value);
flashcore_status set_contiguous_strides_of_int(flashcore_forward_params *params, int value);

const char *status_string_of_int(int value) { return flashcore_status_string((flashcore_status)value); }

flashcore_status set_contiguous_strides_of_int(flashcore_forward_params *params, int value) {
    return flashcore_set_contiguous_strides(params, (flashcore_layout)value);
}
