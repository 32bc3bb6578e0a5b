# cmake -DLIBRARY=<libflashcore.so...> -DNM=<nm> -DREADELF=<readelf> -DCHECK=<check>
#       -P check_library.cmake
#
# Checks on the built shared library, one per CHECK:
#   exports           every dynamic symbol it defines starts with flashcore_
#                     (version-script nodes such as FLASHCORE_0, absolute
#                     symbols, aside) and is declared in flashcore.h
#   header_functions  every function flashcore.h declares is exported
#   soname            the SONAME is libflashcore.so.<MAJOR> and the file is
#                     libflashcore.so.<MAJOR.MINOR.PATCH>, from the header
#   static_cudart     no DT_NEEDED on libcudart (it is linked statically) nor
#                     on libcuda (the driver is loaded at run time, so the
#                     library loads, and reports NO_DEVICE, without a driver)
#   relro             full RELRO: a GNU_RELRO segment (readelf -l) and
#                     immediate binding (BIND_NOW, or NOW in FLAGS_1), so the
#                     GOT is read-only once the library is loaded
#   hardening         the four hardening measures at once: stack canaries
#                     (-fstack-protector-strong: it calls __stack_chk_fail),
#                     FORTIFY (-D_FORTIFY_SOURCE=2: it calls glibc's checked
#                     __*_chk functions), full RELRO as above, and hidden
#                     visibility (it exports flashcore_ symbols only)
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/../header/FlashcoreHeaderApi.cmake)

foreach(var LIBRARY CHECK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_library.cmake: -D${var}= is required")
  endif()
endforeach()
if(NOT EXISTS "${LIBRARY}")
  message(FATAL_ERROR "library not found: ${LIBRARY}")
endif()

# run(<out> <command...>): the command's stdout; fails the check if it fails.
function(run out)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE stdout ERROR_VARIABLE stderr)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "`${ARGN}` failed (${rc}):\n${stderr}")
  endif()
  set(${out} "${stdout}" PARENT_SCOPE)
endfunction()

# dynamic_entries(<out> <tag>): values of the readelf -d entries with that tag.
function(dynamic_entries out tag)
  run(dynamic ${READELF} -d ${LIBRARY})
  string(REGEX MATCHALL "\\(${tag}\\)[^\n]*\\[[^]\n]*\\]" entries "${dynamic}")
  set(values "")
  foreach(entry IN LISTS entries)
    string(REGEX REPLACE ".*\\[([^]]*)\\]$" "\\1" value "${entry}")
    list(APPEND values "${value}")
  endforeach()
  set(${out} "${values}" PARENT_SCOPE)
endfunction()

# Exported symbols as "<nm type letter> <name>", version suffix dropped.
function(exported_symbols out)
  run(listing ${NM} -D --defined-only ${LIBRARY})
  string(REPLACE "\n" ";" lines "${listing}")
  set(symbols "")
  foreach(line IN LISTS lines)
    if(line MATCHES "^[0-9A-Fa-f]* *([A-Za-z]) ([^@ ]+)")
      list(APPEND symbols "${CMAKE_MATCH_1} ${CMAKE_MATCH_2}")
    elseif(NOT line STREQUAL "")
      message(FATAL_ERROR "cannot read this line of `nm -D`: ${line}")
    endif()
  endforeach()
  set(${out} "${symbols}" PARENT_SCOPE)
endfunction()

# report(<list variable> <what>): adds the list, if not empty, to `problems`.
set(problems "")
macro(report list what)
  if(${list})
    list(JOIN ${list} "\n  " _text)
    string(APPEND problems "${what}:\n  ${_text}\n")
  endif()
endmacro()

# check_relro(): full RELRO, or what is missing added to `problems`.
macro(check_relro)
  run(segments ${READELF} -lW ${LIBRARY})
  set(relro "")
  if(NOT segments MATCHES "GNU_RELRO")
    list(APPEND relro "no GNU_RELRO segment (link with -z relro)")
  endif()
  run(dynamic ${READELF} -d ${LIBRARY})
  if(NOT dynamic MATCHES "\\(BIND_NOW\\)" AND NOT dynamic MATCHES "\\(FLAGS_1\\)[^\n]*NOW")
    list(APPEND relro "no BIND_NOW and no NOW in FLAGS_1 (link with -z now)")
  endif()
  report(relro "the library has only partial RELRO")
endmacro()

flashcore_header_functions(header_functions)
flashcore_header_version(version)
string(REGEX MATCH "^[0-9]+" major "${version}")

if(CHECK STREQUAL "exports")
  exported_symbols(symbols)
  set(foreign "")
  set(undeclared "")
  set(count 0)
  foreach(symbol IN LISTS symbols)
    string(REGEX REPLACE "^(.) (.*)$" "\\1;\\2" parts "${symbol}")
    list(GET parts 0 type)
    list(GET parts 1 name)
    if(type STREQUAL "A" AND name MATCHES "^[A-Z][A-Z0-9_.]*$")
      continue() # a version node of the version script
    endif()
    math(EXPR count "${count} + 1")
    if(NOT name MATCHES "^flashcore_")
      list(APPEND foreign "${symbol}")
    elseif(NOT name IN_LIST header_functions)
      list(APPEND undeclared "${symbol}")
    endif()
  endforeach()
  report(foreign "exported symbols without the flashcore_ prefix (nm type, name)")
  report(undeclared "exported flashcore_ symbols that flashcore.h does not declare")
  message(STATUS "${count} exported symbols (version nodes aside) checked")

elseif(CHECK STREQUAL "header_functions")
  exported_symbols(symbols)
  set(missing "")
  foreach(name IN LISTS header_functions)
    if(NOT "T ${name}" IN_LIST symbols)
      list(APPEND missing "${name}")
    endif()
  endforeach()
  report(missing "functions declared in flashcore.h but not exported as functions (nm type T)")
  list(LENGTH header_functions count)
  message(STATUS "${count} functions declared in flashcore.h checked")

elseif(CHECK STREQUAL "soname")
  dynamic_entries(soname SONAME)
  if(NOT soname STREQUAL "libflashcore.so.${major}")
    message(FATAL_ERROR "SONAME is '${soname}', expected libflashcore.so.${major}")
  endif()
  get_filename_component(file_name "${LIBRARY}" NAME)
  if(NOT file_name STREQUAL "libflashcore.so.${version}")
    message(FATAL_ERROR "the library is ${file_name}, expected libflashcore.so.${version} "
                        "(the version in flashcore.h)")
  endif()
  message(STATUS "SONAME ${soname}, file ${file_name}")

elseif(CHECK STREQUAL "static_cudart")
  dynamic_entries(needed NEEDED)
  message(STATUS "NEEDED: ${needed}")
  set(cuda "")
  foreach(lib IN LISTS needed)
    if(lib MATCHES "^lib(cudart|cuda)\\.so")
      list(APPEND cuda "${lib}")
    endif()
  endforeach()
  report(cuda "the library needs CUDA shared libraries; the runtime must be linked statically")

elseif(CHECK STREQUAL "relro")
  check_relro()
  message(STATUS "GNU_RELRO and BIND_NOW present")

elseif(CHECK STREQUAL "hardening")
  # Functions the library calls from other libraries (nm's U lines).
  run(listing ${NM} -D --undefined-only ${LIBRARY})
  set(hardening "")
  if(NOT listing MATCHES "__stack_chk_fail")
    list(APPEND hardening "no stack protector: it never calls __stack_chk_fail (compile with -fstack-protector-strong)")
  endif()
  string(REGEX MATCHALL "__[a-z0-9_]+_chk" checked "${listing}")
  list(REMOVE_ITEM checked "__stack_chk")
  list(REMOVE_DUPLICATES checked)
  if(NOT checked)
    list(APPEND hardening "no FORTIFY: it calls none of glibc's __*_chk functions (compile with -O2 -D_FORTIFY_SOURCE=2)")
  endif()
  report(hardening "the library's host code is not hardened")
  check_relro()
  exported_symbols(symbols)
  set(visible "")
  foreach(symbol IN LISTS symbols)
    if(NOT symbol MATCHES "^. flashcore_" AND NOT symbol MATCHES "^A [A-Z][A-Z0-9_.]*$")
      list(APPEND visible "${symbol}")
    endif()
  endforeach()
  report(visible "symbols visible outside the library without the flashcore_ prefix (build with hidden visibility)")
  if(NOT problems)
    message(STATUS "stack protector, FORTIFY (${checked}), full RELRO, hidden visibility")
  endif()

else()
  message(FATAL_ERROR "unknown CHECK '${CHECK}'")
endif()

if(problems)
  message(FATAL_ERROR "${problems}")
endif()
