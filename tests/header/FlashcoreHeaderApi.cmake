# Facts read out of the public header, so that the tests never keep their own
# hand-typed copy of the API list or the version. Works both from a
# CMakeLists.txt (include()) and from a `cmake -P` script.
#
#   FLASHCORE_HEADER                        absolute path of include/flashcore.h
#   flashcore_header_functions(<var> [<header>])
#       names of every function declared with FLASHCORE_API, in header order
#   flashcore_header_version(<var> [<header>])
#       "MAJOR.MINOR.PATCH" from the FLASHCORE_VERSION_* macros

include_guard(GLOBAL)

get_filename_component(FLASHCORE_HEADER "${CMAKE_CURRENT_LIST_DIR}/../../include/flashcore.h" ABSOLUTE)

function(_flashcore_read_header out header)
  if(NOT header)
    set(header "${FLASHCORE_HEADER}")
  endif()
  if(NOT EXISTS "${header}")
    message(FATAL_ERROR "flashcore header not found: ${header}")
  endif()
  file(READ "${header}" text)
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(flashcore_header_functions out)
  _flashcore_read_header(text "${ARGV1}")

  # Strip /* */ comments (CMake regexes have no non-greedy match).
  set(code "")
  string(FIND "${text}" "/*" open)
  while(NOT open EQUAL -1)
    string(SUBSTRING "${text}" 0 ${open} before)
    string(APPEND code "${before} ")
    math(EXPR open "${open} + 2")
    string(SUBSTRING "${text}" ${open} -1 text)
    string(FIND "${text}" "*/" close)
    if(close EQUAL -1)
      message(FATAL_ERROR "unterminated comment in the flashcore header")
    endif()
    math(EXPR close "${close} + 2")
    string(SUBSTRING "${text}" ${close} -1 text)
    string(FIND "${text}" "/*" open)
  endwhile()
  string(APPEND code "${text}")

  # Strip // comments, join continued lines, drop preprocessor lines (the
  # FLASHCORE_API definitions among them).
  string(REGEX REPLACE "//[^\n]*" "" code "${code}")
  string(REPLACE "\\\n" " " code "${code}")
  string(REGEX REPLACE "\n[ \t]*#[^\n]*" "\n" code "\n${code}")

  # A declaration: FLASHCORE_API, the return type, the name, "(".
  string(REGEX MATCHALL "FLASHCORE_API[ \t\r\n][^;{}()]*\\(" decls "${code}")
  set(names "")
  foreach(decl IN LISTS decls)
    if(NOT decl MATCHES "([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*\\($")
      message(FATAL_ERROR "cannot find the function name in: ${decl}")
    endif()
    list(APPEND names "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT names)
    message(FATAL_ERROR "no FLASHCORE_API function found in the flashcore header")
  endif()
  set(${out} "${names}" PARENT_SCOPE)
endfunction()

function(flashcore_header_version out)
  _flashcore_read_header(text "${ARGV1}")
  set(parts "")
  foreach(part MAJOR MINOR PATCH)
    if(NOT text MATCHES "#[ \t]*define[ \t]+FLASHCORE_VERSION_${part}[ \t]+([0-9]+)")
      message(FATAL_ERROR "FLASHCORE_VERSION_${part} not found in the flashcore header")
    endif()
    list(APPEND parts "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN parts "." version)
  set(${out} "${version}" PARENT_SCOPE)
endfunction()
