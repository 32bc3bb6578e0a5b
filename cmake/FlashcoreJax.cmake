# flashcore.jax's XLA FFI handlers (bindings/python/flashcore/jax/_handlers.cc,
# docs/log/jax.md): libflashcore_jax.so, loaded by flashcore.jax with
# ctypes and registered with jax.ffi.register_ffi_target.
#
# FLASHCORE_JAX=AUTO (the default) builds it where the Python that CMake
# finds imports jaxlib (which carries the header-only XLA FFI API, what
# jax.ffi.include_dir() names), ON insists, OFF skips it. It needs neither the
# CUDA toolkit's headers nor a link to libflashcore: the binding hands it
# the entry points of the library it loaded. Built against XLA FFI API
# version 0.N, it runs under jaxlibs of that major version and minor
# versions >= N (the C API grows by struct sizes). Put beside libflashcore
# in the build tree, where flashcore.jax looks next to the library it
# loaded; the wheel installs it into the package.
set(FLASHCORE_JAX AUTO CACHE STRING
    "Build flashcore.jax's XLA FFI handlers: ON, OFF, or AUTO (when Python imports jaxlib)")
set_property(CACHE FLASHCORE_JAX PROPERTY STRINGS AUTO ON OFF)

if(NOT FLASHCORE_JAX STREQUAL "OFF")
  find_package(Python3 COMPONENTS Interpreter)
  set(_flashcore_jax_include "")
  if(Python3_Interpreter_FOUND)
    execute_process(
      # jax.ffi.include_dir() is jaxlib's include folder; the wheel's build
      # (pyproject.toml) has jaxlib alone.
      COMMAND ${Python3_EXECUTABLE} -c
              "import os, jaxlib; print(os.path.join(os.path.dirname(jaxlib.__file__), 'include'))"
      OUTPUT_VARIABLE _flashcore_jax_include
      OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET
      RESULT_VARIABLE _flashcore_jax_found)
    if(NOT _flashcore_jax_found EQUAL 0 OR NOT EXISTS "${_flashcore_jax_include}/xla/ffi/api/ffi.h")
      set(_flashcore_jax_include "")
    endif()
  endif()
  if(_flashcore_jax_include STREQUAL "")
    set(_flashcore_jax_hint "jaxlib not importable by ${Python3_EXECUTABLE} (pip install jax), so no XLA FFI headers")
    if(NOT FLASHCORE_JAX STREQUAL "AUTO")
      message(FATAL_ERROR "FLASHCORE_JAX=${FLASHCORE_JAX}, but ${_flashcore_jax_hint}")
    endif()
    message(STATUS "flashcore: flashcore.jax's handlers are not built: ${_flashcore_jax_hint}")
  else()
    message(STATUS "flashcore: flashcore.jax's handlers built against ${_flashcore_jax_include}")
    add_library(flashcore_jax MODULE ${PROJECT_SOURCE_DIR}/bindings/python/flashcore/jax/_handlers.cc)
    target_include_directories(flashcore_jax PRIVATE ${PROJECT_SOURCE_DIR}/include)
    # SYSTEM: jaxlib's headers do not build warning-free.
    target_include_directories(flashcore_jax SYSTEM PRIVATE ${_flashcore_jax_include})
    target_compile_features(flashcore_jax PRIVATE cxx_std_17)
    target_compile_options(flashcore_jax PRIVATE -Wall -Wextra -Werror)
    # The handlers' symbols (XLA_FFI_DEFINE_HANDLER_SYMBOL's extern "C"
    # functions) keep the default visibility.
    set_target_properties(flashcore_jax PROPERTIES PREFIX "lib" OUTPUT_NAME flashcore_jax)
    flashcore_python_module(flashcore_jax)
  endif()
endif()
