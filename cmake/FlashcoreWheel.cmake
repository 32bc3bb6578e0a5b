# The Python wheel's libraries (pyproject.toml; scikit-build-core sets SKBUILD
# and installs only the Python component). Each flavour of the library goes
# into the flashcore package as flashcore/cuda<MAJOR>/libflashcore.so.<major>
# (named after its SONAME); the package loads the newest one the machine's
# NVIDIA driver runs (bindings/python/flashcore/_library.py):
#
#   flashcore/cuda13/libflashcore.so.0   this build (its toolkit's major)
#   flashcore/cuda12/libflashcore.so.0   FLASHCORE_WHEEL_EXTRA_NVCC's build
#
# FLASHCORE_WHEEL_EXTRA_NVCC names the nvcc of another CUDA major (e.g. the
# CUDA 12.4 of packaging/fetch_cuda12_toolkit.sh): this same source tree is
# then also configured and built with it (ExternalProject, the library only,
# with this build's head dims and build type, and its architectures unless
# FLASHCORE_WHEEL_EXTRA_CUDA_ARCHITECTURES says otherwise) in
# FLASHCORE_WHEEL_EXTRA_BINARY_DIR, and the wheel carries both:
#
#   pip wheel . -Ccmake.define.FLASHCORE_WHEEL_EXTRA_NVCC=$HOME/.cache/flashcore/cuda-12.4/bin/nvcc
#
# Pointing FLASHCORE_WHEEL_EXTRA_BINARY_DIR at a build folder of that flavour
# configured the same way reuses what it built.

include_guard(GLOBAL)

set(FLASHCORE_WHEEL_EXTRA_NVCC "" CACHE FILEPATH
    "nvcc of another CUDA major whose build of the library the wheel carries too (empty: this build's only)")
set(FLASHCORE_WHEEL_EXTRA_BINARY_DIR "${PROJECT_BINARY_DIR}/extra-flavour" CACHE PATH
    "Build folder of the FLASHCORE_WHEEL_EXTRA_NVCC flavour")
set(FLASHCORE_WHEEL_EXTRA_CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}" CACHE STRING
    "CMAKE_CUDA_ARCHITECTURES of the FLASHCORE_WHEEL_EXTRA_NVCC flavour (default: this build's)")

# install(FILES) of a library into the package as its SONAME, stripped as
# install(TARGETS) would be (scikit-build-core installs with --strip).
function(flashcore_wheel_install_library library major)
  set(directory flashcore/cuda${major})
  set(name libflashcore.so.${PROJECT_VERSION_MAJOR})
  install(FILES "${library}" DESTINATION ${directory} RENAME ${name} COMPONENT Python)
  if(CMAKE_STRIP)
    install(CODE "if(CMAKE_INSTALL_DO_STRIP)
  execute_process(COMMAND \"${CMAKE_STRIP}\" \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${directory}/${name}\"
                  COMMAND_ERROR_IS_FATAL ANY)
endif()" COMPONENT Python)
  endif()
endfunction()

flashcore_wheel_install_library($<TARGET_FILE:flashcore> ${FLASHCORE_CUDA_MAJOR})

if(FLASHCORE_WHEEL_EXTRA_NVCC)
  execute_process(COMMAND "${FLASHCORE_WHEEL_EXTRA_NVCC}" --version
                  OUTPUT_VARIABLE _flashcore_extra_nvcc_version RESULT_VARIABLE _flashcore_extra_nvcc_rc)
  if(NOT _flashcore_extra_nvcc_rc EQUAL 0 OR NOT _flashcore_extra_nvcc_version MATCHES "release ([0-9]+)\\.([0-9]+)")
    message(FATAL_ERROR "FLASHCORE_WHEEL_EXTRA_NVCC=${FLASHCORE_WHEEL_EXTRA_NVCC} is not a working nvcc "
                        "(`nvcc --version` gave ${_flashcore_extra_nvcc_rc})")
  endif()
  set(_flashcore_extra_major ${CMAKE_MATCH_1})
  if(_flashcore_extra_major EQUAL FLASHCORE_CUDA_MAJOR)
    message(FATAL_ERROR "FLASHCORE_WHEEL_EXTRA_NVCC is CUDA ${CMAKE_MATCH_1}.${CMAKE_MATCH_2}, the same major as "
                        "this build's CUDA ${CUDAToolkit_VERSION}: name the nvcc of the other major")
  endif()
  message(STATUS "flashcore: the wheel carries the CUDA ${CMAKE_MATCH_1}.${CMAKE_MATCH_2} build too "
                 "(${FLASHCORE_WHEEL_EXTRA_BINARY_DIR})")
  # List values (architectures, head dims) reach the sub-build with '|' for
  # ';' (LIST_SEPARATOR below), which would otherwise split them here.
  string(REPLACE ";" "|" _flashcore_extra_architectures "${FLASHCORE_WHEEL_EXTRA_CUDA_ARCHITECTURES}")
  string(REPLACE ";" "|" _flashcore_extra_head_dims "${FLASHCORE_HEAD_DIMS}")
  set(_flashcore_extra_args
    -DCMAKE_CUDA_COMPILER=${FLASHCORE_WHEEL_EXTRA_NVCC}
    -DCMAKE_CUDA_ARCHITECTURES=${_flashcore_extra_architectures}
    -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}
    -DFLASHCORE_HEAD_DIMS=${_flashcore_extra_head_dims}
    -DFLASHCORE_BUILD_TESTS=OFF
    -DFLASHCORE_BUILD_EXAMPLES=OFF
    -DFLASHCORE_BUILD_BENCH=OFF
    -DFLASHCORE_BINDING_TESTS=OFF
    -DFLASHCORE_PYTHON_FASTCALL=OFF)
  if(CMAKE_CUDA_HOST_COMPILER)
    list(APPEND _flashcore_extra_args -DCMAKE_CUDA_HOST_COMPILER=${CMAKE_CUDA_HOST_COMPILER})
  endif()
  include(ExternalProject)
  ExternalProject_Add(flashcore_cuda${_flashcore_extra_major}
    SOURCE_DIR "${PROJECT_SOURCE_DIR}"
    BINARY_DIR "${FLASHCORE_WHEEL_EXTRA_BINARY_DIR}"
    LIST_SEPARATOR |
    CMAKE_ARGS ${_flashcore_extra_args}
    BUILD_COMMAND ${CMAKE_COMMAND} --build <BINARY_DIR> --target flashcore
    # Always asked to build (its own build is incremental), so that a source
    # change reaches it as it reaches this build.
    BUILD_ALWAYS ON
    INSTALL_COMMAND ""
    USES_TERMINAL_BUILD ON)
  flashcore_wheel_install_library(
    "${FLASHCORE_WHEEL_EXTRA_BINARY_DIR}/src/libflashcore.so.${PROJECT_VERSION}" ${_flashcore_extra_major})
endif()
