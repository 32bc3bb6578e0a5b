# flashcore._fastcall (bindings/python/flashcore/_fastcall.c): the Python
# binding's compiled host path for repeated calls on torch tensors. Optional:
# the package runs the same calls in Python without it.
#
# FLASHCORE_PYTHON_FASTCALL=AUTO (the default) builds it where CMake finds
# Python's headers (Debian/Ubuntu: python3-dev), ON insists, OFF skips it.
# Written against Python's limited API (3.8), so the one file, named
# _fastcall.abi3.so, loads in every CPython 3 from 3.8 on. It is put beside
# libflashcore in the build tree, where the package looks for it next to the
# library it loaded (FLASHCORE_LIBRARY), and the wheel installs it into the
# package. It needs neither torch nor the CUDA toolkit to build.
set(FLASHCORE_PYTHON_FASTCALL AUTO CACHE STRING
    "Build the Python binding's compiled call path: ON, OFF, or AUTO (when Python's headers are found)")
set_property(CACHE FLASHCORE_PYTHON_FASTCALL PROPERTY STRINGS AUTO ON OFF)

if(NOT FLASHCORE_PYTHON_FASTCALL STREQUAL "OFF")
  find_package(Python3 COMPONENTS Interpreter Development.Module)
  if(NOT Python3_Development.Module_FOUND)
    set(_flashcore_fastcall_hint "Python's headers not found (Debian/Ubuntu: apt-get install python3-dev)")
    if(NOT FLASHCORE_PYTHON_FASTCALL STREQUAL "AUTO")
      message(FATAL_ERROR "FLASHCORE_PYTHON_FASTCALL=${FLASHCORE_PYTHON_FASTCALL}, but ${_flashcore_fastcall_hint}")
    endif()
    message(STATUS "flashcore: the Python binding's compiled call path is not built: ${_flashcore_fastcall_hint}. "
                   "The binding works without it (more host time per call).")
  else()
    # The oldest CPython whose stable ABI the module uses.
    set(_flashcore_fastcall_limited_api 0x03080000)
    add_library(flashcore_fastcall MODULE ${PROJECT_SOURCE_DIR}/bindings/python/flashcore/_fastcall.c)
    target_include_directories(flashcore_fastcall PRIVATE ${PROJECT_SOURCE_DIR}/include)
    target_link_libraries(flashcore_fastcall PRIVATE Python3::Module)
    target_compile_definitions(flashcore_fastcall PRIVATE Py_LIMITED_API=${_flashcore_fastcall_limited_api})
    target_compile_options(flashcore_fastcall PRIVATE -Wall -Wextra -Werror)
    set_target_properties(flashcore_fastcall PROPERTIES
      PREFIX ""
      OUTPUT_NAME _fastcall
      SUFFIX .abi3.so
      C_VISIBILITY_PRESET hidden)
    flashcore_python_module(flashcore_fastcall)
  endif()
endif()
