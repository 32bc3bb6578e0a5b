/* A stand-in for the NVIDIA driver library (libcuda.so.1) too old for any
 * CUDA runtime: all it has is cuDriverGetVersion, which says CUDA 1.0. The
 * runtime then fails with cudaErrorInsufficientDriver, as with a real old
 * driver. With its folder first on LD_LIBRARY_PATH, flashcore_create must say
 * the driver is too old, not that there is none (ctest api.fake_old_driver,
 * tests/CMakeLists.txt). */
int cuDriverGetVersion(int *version);

int cuDriverGetVersion(int *version)
{
    *version = 1000;
    return 0;
}
