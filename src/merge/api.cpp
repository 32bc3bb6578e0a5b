// The merge's exported C functions (api_guard.h: how each runs).
#include "api_guard.h"
#include "handle.h"
#include "struct_io.h"
#include "merge/merge.h"

using namespace flashcore;

extern "C" {

flashcore_status flashcore_merge_params_init(flashcore_merge_params *params, size_t struct_size) {
    return guarded(__func__, [&] { return init_struct(params, struct_size, check_merge_struct_size, init_merge_params); });
}

flashcore_status flashcore_merge_check(const flashcore_merge_params *params) {
    return guarded(__func__, [&] {
        return check_call(params);
    });
}

flashcore_status flashcore_merge_states(flashcore_handle handle, const flashcore_merge_params *params, void *stream) {
    return guarded(__func__, [&] {
        FLASHCORE_TRY(check_handle(handle));
        return run_call(*handle, params, nullptr, 0, stream);
    });
}

}  // extern "C"
