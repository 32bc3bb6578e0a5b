# cmake -DCOMPILER=<cc> -DINCLUDE_DIR=<dir of flashcore.h> -DSOURCE=<file> -P check_includes.cmake
#
# The header promises to need only the C standard library (no CUDA headers),
# so that ctypes, bindgen and plain C compilers can read it. Leaving the CUDA
# include path out of the compile line does not prove it: CUDA headers may sit
# in a default directory such as /usr/local/include. So this preprocesses
# SOURCE (which includes flashcore.h first) with -H, which lists every header
# opened with its nesting depth, and fails when flashcore.h itself includes
# anything but a standard C header.
cmake_minimum_required(VERSION 3.16)

foreach(var COMPILER INCLUDE_DIR SOURCE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_includes.cmake: -D${var}= is required")
  endif()
endforeach()

set(c_standard_headers
    assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h
    locale.h math.h setjmp.h signal.h stdalign.h stdarg.h stdbool.h stddef.h stdint.h
    stdio.h stdlib.h string.h tgmath.h time.h wchar.h wctype.h)

execute_process(COMMAND ${COMPILER} -E -H -x c -std=c99 -I${INCLUDE_DIR} ${SOURCE} -o /dev/null
                RESULT_VARIABLE rc ERROR_VARIABLE trace)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "preprocessing ${SOURCE} failed:\n${trace}")
endif()

string(REPLACE "\n" ";" lines "${trace}")
set(header_seen FALSE)
set(bad "")
foreach(line IN LISTS lines)
  if(line MATCHES "^\\. (.*)$")
    # Depth 1: what SOURCE includes; flashcore.h must be the first of them.
    get_filename_component(name "${CMAKE_MATCH_1}" NAME)
    if(NOT header_seen AND NOT name STREQUAL "flashcore.h")
      message(FATAL_ERROR "${SOURCE} must include flashcore.h first, saw ${CMAKE_MATCH_1}")
    endif()
    set(header_seen TRUE)
  elseif(line MATCHES "^\\.\\. (.*)$")
    # Depth 2: what flashcore.h includes.
    set(path "${CMAKE_MATCH_1}")
    get_filename_component(name "${path}" NAME)
    message(STATUS "flashcore.h includes ${path}")
    if(NOT name IN_LIST c_standard_headers)
      list(APPEND bad "${path}")
    endif()
  endif()
endforeach()

if(NOT header_seen)
  message(FATAL_ERROR "flashcore.h was not opened while preprocessing ${SOURCE}:\n${trace}")
endif()
if(bad)
  list(JOIN bad "\n  " bad)
  message(FATAL_ERROR "flashcore.h includes headers outside the C standard library:\n  ${bad}")
endif()
message(STATUS "flashcore.h needs only the C standard library")
