/* A stand-in for the NVIDIA driver library (libcuda.so.1) too old for the
 * library's CUDA runtime: all it has is cuDriverGetVersion, which says CUDA
 * 1.0, or the version in $FLASHCORE_FAKE_DRIVER_VERSION (as CUDA writes
 * them: 12000 for 12.0). The runtime then fails with
 * cudaErrorInsufficientDriver, as with a real old driver. With its folder
 * first on LD_LIBRARY_PATH, flashcore_create must say the driver is too old,
 * not that there is none (ctest api.fake_old_driver and
 * api.fake_cuda12_driver, tests/CMakeLists.txt). */
#include <stdlib.h>

int cuDriverGetVersion(int *version);

int cuDriverGetVersion(int *version)
{
    const char *forced = getenv("FLASHCORE_FAKE_DRIVER_VERSION");
    *version = forced != NULL ? atoi(forced) : 1000;
    return 0;
}
