# cmake -DMODE=<pkgconfig|cmake|dlopen|readme_pkgconfig|readme_cmake> -DPREFIX= -DLIBDIR= -DINCLUDEDIR=
#       -DPKGCONFIGDIR= -DWORK_DIR= -DCC= [-DPKG_CONFIG=] [-DDL_LIBS=] [-DGENERATOR=] [-DMAKE_PROGRAM=]
#       [-DREADME= -DEXAMPLE=] -P run_consumer.cmake
#
# Builds one consumer program against the flashcore installed in PREFIX (by
# the consumer.install fixture) and runs it:
#   pkgconfig  consumer.c compiled with `$CC $(pkg-config --cflags --libs flashcore)`,
#              PKG_CONFIG_PATH=<prefix>/<libdir>/pkgconfig, run with LD_LIBRARY_PATH
#   cmake      cmake_project/ configured with CMAKE_PREFIX_PATH=<prefix>
#              (find_package(flashcore 0.3), flashcore::flashcore), built, run
#   dlopen     dlopen_consumer.c, compiled without -lflashcore, given the
#              functions of the installed header, dlopens <prefix>/<libdir>/libflashcore.so.MAJOR
#   readme_pkgconfig, readme_cmake
#              README.md's build snippets as written (pkg-config's command line;
#              CMake's find_package and target_link_libraries lines) building
#              examples/example.c, which allocates device memory: the snippets
#              cannot drift from what links a real program
# The linked programs must also resolve libflashcore from PREFIX (checked with
# ldd where there is one), not from some other install.
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/../header/FlashcoreHeaderApi.cmake)

foreach(var MODE PREFIX LIBDIR INCLUDEDIR PKGCONFIGDIR WORK_DIR CC)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}= is required")
  endif()
endforeach()

set(lib_dir "${PREFIX}/${LIBDIR}")
set(test_api_dir "${CMAKE_CURRENT_LIST_DIR}/../header")
set(warnings -std=c99 -Wall -Wextra -Werror)
flashcore_header_version(version)
string(REGEX MATCH "^[0-9]+" major "${version}")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
# The generator the project was configured with, for the CMake consumers.
set(generator_args "")
if(GENERATOR)
  list(APPEND generator_args -G "${GENERATOR}")
endif()
if(MAKE_PROGRAM)
  list(APPEND generator_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()

# run(<what> <command...>): runs the command, its output shown; stops on failure.
function(run what)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc})")
  endif()
endfunction()

# skip(<why>): the test is reported skipped for want of a tool (ctest's
# SKIP_REGULAR_EXPRESSION, and the skip log the summary reads); ends the script.
macro(skip why)
  message(STATUS "SKIP: ${why}")
  if(DEFINED ENV{FLASHCORE_TOOL_SKIP_LOG})
    file(APPEND "$ENV{FLASHCORE_TOOL_SKIP_LOG}" "$ENV{FLASHCORE_CTEST_NAME} skipped: ${why}\n")
  endif()
  return()
endmacro()

# output_of(<var> <command...>): the command's stdout, stripped; stops on failure.
function(output_of var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "`${ARGN}` failed (${rc}): ${err}")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

# expect_same_path(<a> <b> <what>): both name the same place, links resolved.
function(expect_same_path a b what)
  get_filename_component(real_a "${a}" REALPATH)
  get_filename_component(real_b "${b}" REALPATH)
  if(NOT real_a STREQUAL real_b)
    message(FATAL_ERROR "${what}: ${a} is not ${b}")
  endif()
endfunction()

# The program must load libflashcore from PREFIX.
function(expect_library_from_prefix program)
  find_program(LDD ldd)
  if(NOT LDD)
    message(STATUS "no ldd: not checking where ${program} loads libflashcore from")
    return()
  endif()
  output_of(deps ${LDD} ${program})
  if(NOT deps MATCHES "libflashcore\\.so\\.${major} => ([^ \n]+)")
    message(FATAL_ERROR "ldd ${program} shows no libflashcore.so.${major}:\n${deps}")
  endif()
  get_filename_component(loaded_dir "${CMAKE_MATCH_1}" DIRECTORY)
  expect_same_path("${loaded_dir}" "${lib_dir}" "${program} loads libflashcore from elsewhere")
endfunction()

if(MODE STREQUAL "pkgconfig")
  if(NOT PKG_CONFIG)
    skip("pkg-config was not found when the project was configured (apt-get install pkg-config)")
  endif()
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/${PKGCONFIGDIR}")
  unset(ENV{PKG_CONFIG_SYSROOT_DIR})
  output_of(pc_version ${PKG_CONFIG} --modversion flashcore)
  if(NOT pc_version STREQUAL version)
    message(FATAL_ERROR "pkg-config --modversion flashcore gives ${pc_version}, flashcore.h ${version}")
  endif()
  output_of(pc_prefix ${PKG_CONFIG} --variable=prefix flashcore)
  expect_same_path("${pc_prefix}" "${PREFIX}" "the prefix in flashcore.pc")
  output_of(flags ${PKG_CONFIG} --cflags --libs flashcore)
  message(STATUS "pkg-config --cflags --libs flashcore: ${flags}")
  separate_arguments(flags UNIX_COMMAND "${flags}")
  set(program "${WORK_DIR}/consumer_pkgconfig")
  run("compile" ${CC} ${warnings} -I${test_api_dir} ${CMAKE_CURRENT_LIST_DIR}/consumer.c ${flags} -o ${program})
  set(ENV{LD_LIBRARY_PATH} "${lib_dir}")
  expect_library_from_prefix(${program})
  run("run" ${program})

elseif(MODE STREQUAL "cmake")
  run("configure" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/cmake_project -B ${WORK_DIR}
      ${generator_args} -DCMAKE_C_COMPILER=${CC} -DCMAKE_BUILD_TYPE=Release
      -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
      -DFLASHCORE_EXPECTED_PREFIX=${PREFIX} -DFLASHCORE_EXPECTED_VERSION=${version})
  run("build" ${CMAKE_COMMAND} --build ${WORK_DIR} --config Release)
  set(program "${WORK_DIR}/bin/flashcore_cmake_consumer")
  # No LD_LIBRARY_PATH: the imported target gives the program its RUNPATH.
  unset(ENV{LD_LIBRARY_PATH})
  expect_library_from_prefix(${program})
  run("run" ${program})

elseif(MODE STREQUAL "readme_pkgconfig" OR MODE STREQUAL "readme_cmake")
  # The README's build snippets as written (the indented lines after
  # "<!-- consumer snippet: pkgconfig|cmake -->"), building examples/example.c,
  # which allocates device memory through the CUDA runtime: run, it must
  # succeed, or stop at flashcore_create for want of a device.
  foreach(var README EXAMPLE)
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "run_consumer.cmake: -D${var}= is required for ${MODE}")
    endif()
  endforeach()
  string(REGEX REPLACE "^readme_" "" which "${MODE}")
  file(STRINGS "${README}" readme_lines)
  set(snippet "")
  set(state "looking")
  foreach(line IN LISTS readme_lines)
    if(state STREQUAL "looking" AND line STREQUAL "<!-- consumer snippet: ${which} -->")
      set(state "after marker")
    elseif(state STREQUAL "after marker" OR state STREQUAL "in snippet")
      if(line MATCHES "^    (.*)$")
        string(APPEND snippet "${CMAKE_MATCH_1}\n")
        set(state "in snippet")
      elseif(state STREQUAL "in snippet")
        break()
      endif()
    endif()
  endforeach()
  if(snippet STREQUAL "")
    message(FATAL_ERROR "${README} has no indented snippet after <!-- consumer snippet: ${which} -->")
  endif()
  message(STATUS "the README's ${which} snippet:\n${snippet}")
  # The snippets name the CUDA toolkit where Debian's NVIDIA packages and
  # NVIDIA's installer put it.
  if(NOT EXISTS /usr/local/cuda/include/cuda_runtime_api.h)
    skip("the README's snippets use the CUDA toolkit in /usr/local/cuda, and there is none")
  endif()
  file(COPY "${EXAMPLE}" DESTINATION "${WORK_DIR}")
  get_filename_component(example_name "${EXAMPLE}" NAME)
  if(which STREQUAL "pkgconfig")
    if(NOT PKG_CONFIG)
      message(FATAL_ERROR "pkg-config was not found when the project was configured")
    endif()
    string(STRIP "${snippet}" command)
    if(NOT command MATCHES "^cc ${example_name} ")
      message(FATAL_ERROR "the pkg-config snippet does not build ${example_name}: ${command}")
    endif()
    # As a user runs it, from the example's folder, the prefix on pkg-config's path.
    set(ENV{PKG_CONFIG_PATH} "${PREFIX}/${PKGCONFIGDIR}")
    string(REGEX REPLACE "^cc " "${CC} " command "${command}")
    run("compile (the README's line)" sh -c "cd '${WORK_DIR}' && ${command} -o app")
    set(program "${WORK_DIR}/app")
  else()
    file(WRITE "${WORK_DIR}/CMakeLists.txt"
         "cmake_minimum_required(VERSION 3.24)\nproject(app LANGUAGES C)\nadd_executable(app ${example_name})\n"
         "${snippet}")
    run("configure" ${CMAKE_COMMAND} -S ${WORK_DIR} -B ${WORK_DIR}/build ${generator_args} -DCMAKE_C_COMPILER=${CC}
        -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
    run("build" ${CMAKE_COMMAND} --build ${WORK_DIR}/build)
    set(program "${WORK_DIR}/build/app")
  endif()
  # The pkg-config program finds libflashcore as the README says (LD_LIBRARY_PATH
  # for a prefix the loader does not search); CMake's has a RUNPATH.
  if(which STREQUAL "pkgconfig")
    set(ENV{LD_LIBRARY_PATH} "${lib_dir}")
  else()
    unset(ENV{LD_LIBRARY_PATH})
  endif()
  expect_library_from_prefix(${program})
  execute_process(COMMAND ${program} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "run: exit ${rc}\nstdout: ${out}\nstderr: ${err}")
  if(NOT rc EQUAL 0 AND NOT err MATCHES "^flashcore_create: no CUDA device or driver: ")
    message(FATAL_ERROR "the program failed, and not at flashcore_create for want of a device")
  endif()

elseif(MODE STREQUAL "dlopen")
  set(header "${PREFIX}/${INCLUDEDIR}/flashcore.h")
  flashcore_header_functions(functions "${header}")
  set(inc "/* Generated by run_consumer.cmake from ${header} */\n")
  foreach(name IN LISTS functions)
    string(APPEND inc "FLASHCORE_SYMBOL(${name})\n")
  endforeach()
  file(WRITE "${WORK_DIR}/flashcore_symbols.inc" "${inc}")
  list(LENGTH functions count)
  message(STATUS "${count} functions in ${header}")
  set(program "${WORK_DIR}/dlopen_consumer")
  set(dl_flags "")
  foreach(dl IN LISTS DL_LIBS)
    list(APPEND dl_flags "-l${dl}")
  endforeach()
  run("compile" ${CC} ${warnings} -pedantic -I${PREFIX}/${INCLUDEDIR} -I${WORK_DIR} -I${test_api_dir}
      ${CMAKE_CURRENT_LIST_DIR}/dlopen_consumer.c ${dl_flags} -o ${program})
  unset(ENV{LD_LIBRARY_PATH})
  run("run" ${program} "${lib_dir}/libflashcore.so.${major}")

else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
