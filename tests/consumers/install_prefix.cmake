# cmake -DBUILD_DIR= -DPREFIX= -DLIBDIR= -DINCLUDEDIR= -DPKGCONFIGDIR= -DCMAKEDIR=
#       [-DCONFIG=] [-DREADELF=] -P install_prefix.cmake
#
# The consumer tests' fixture: installs the build tree, then moves the result
# to PREFIX, and checks the layout.
#
# The install runs with DESTDIR set and a prefix that does not exist
# (/flashcore-test-prefix), and only then is the tree moved to PREFIX, so
#   - no install rule of the project can write outside this test's folder,
#   - every consumer test uses a tree whose install prefix is gone: whatever
#     still points at it (pkg-config file, CMake package, RUNPATH) fails. The
#     install must be relocatable.
cmake_minimum_required(VERSION 3.16)
include(${CMAKE_CURRENT_LIST_DIR}/../header/FlashcoreHeaderApi.cmake)

foreach(var BUILD_DIR PREFIX LIBDIR INCLUDEDIR PKGCONFIGDIR CMAKEDIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "install_prefix.cmake: -D${var}= is required")
  endif()
endforeach()

set(install_prefix "/flashcore-test-prefix")
set(destdir "${PREFIX}.destdir")
file(REMOVE_RECURSE "${PREFIX}" "${destdir}")

set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
set(ENV{DESTDIR} "${destdir}")
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${install_prefix} ${config_args}
                RESULT_VARIABLE rc)
unset(ENV{DESTDIR})
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} failed (${rc})")
endif()
file(RENAME "${destdir}${install_prefix}" "${PREFIX}")
message(STATUS "installed into ${destdir}${install_prefix}, moved to ${PREFIX}")

set(errors "")
flashcore_header_version(version)
string(REPLACE "." ";" version_parts "${version}")
list(GET version_parts 0 major)
list(GET version_parts 1 minor)
set(lib "${PREFIX}/${LIBDIR}")

# Header: the source header, unchanged.
set(header "${PREFIX}/${INCLUDEDIR}/flashcore.h")
file(SHA256 "${FLASHCORE_HEADER}" source_hash)
if(NOT EXISTS "${header}")
  list(APPEND errors "missing ${header}")
else()
  file(SHA256 "${header}" installed_hash)
  if(NOT installed_hash STREQUAL source_hash)
    list(APPEND errors "${header} differs from ${FLASHCORE_HEADER}")
  endif()
endif()

# Library: the real file and the two SONAME/development links.
if(NOT EXISTS "${lib}/libflashcore.so.${version}" OR IS_SYMLINK "${lib}/libflashcore.so.${version}")
  list(APPEND errors "${lib}/libflashcore.so.${version} missing or not a regular file")
endif()
foreach(link_and_target "libflashcore.so.${major}=libflashcore.so.${version}"
                        "libflashcore.so=libflashcore.so.${major}")
  string(REPLACE "=" ";" pair "${link_and_target}")
  list(GET pair 0 link)
  list(GET pair 1 target)
  if(NOT IS_SYMLINK "${lib}/${link}")
    list(APPEND errors "${lib}/${link} missing or not a symbolic link")
    continue()
  endif()
  file(READ_SYMLINK "${lib}/${link}" points_to)
  if(NOT points_to STREQUAL target)
    list(APPEND errors "${lib}/${link} points to '${points_to}', expected ${target}")
  endif()
endforeach()

# pkg-config file and CMake package; none of them may name the install
# prefix, the build tree or the source tree.
set(package_files "${PREFIX}/${PKGCONFIGDIR}/flashcore.pc")
foreach(name flashcoreConfig.cmake flashcoreConfigVersion.cmake flashcoreTargets.cmake)
  list(APPEND package_files "${PREFIX}/${CMAKEDIR}/${name}")
endforeach()
file(GLOB per_config_targets "${PREFIX}/${CMAKEDIR}/flashcoreTargets-*.cmake")
list(APPEND package_files ${per_config_targets})
get_filename_component(source_dir "${FLASHCORE_HEADER}/../.." ABSOLUTE)
foreach(file IN LISTS package_files)
  if(NOT EXISTS "${file}")
    list(APPEND errors "missing ${file}")
    continue()
  endif()
  file(READ "${file}" text)
  foreach(path "${install_prefix}" "${BUILD_DIR}" "${source_dir}")
    string(FIND "${text}" "${path}" at)
    if(NOT at EQUAL -1)
      list(APPEND errors "${file} contains the absolute path ${path}: the install is not relocatable")
    endif()
  endforeach()
endforeach()

# No RPATH/RUNPATH into the build tree left in the installed library.
if(READELF AND EXISTS "${lib}/libflashcore.so.${version}")
  execute_process(COMMAND ${READELF} -d "${lib}/libflashcore.so.${version}" OUTPUT_VARIABLE dynamic)
  string(FIND "${dynamic}" "${BUILD_DIR}" at)
  if(NOT at EQUAL -1)
    list(APPEND errors "the installed library keeps an RPATH/RUNPATH into ${BUILD_DIR}")
  endif()
endif()

# flashcoreConfigVersion.cmake follows the SONAME policy: any version of the
# same major is accepted, as long as it is not older than the one asked for.
set(version_file "${PREFIX}/${CMAKEDIR}/flashcoreConfigVersion.cmake")
math(EXPR next_major "${major} + 1")
math(EXPR next_minor "${minor} + 1")
foreach(request_and_expected "${major}.${minor}=TRUE" "${major}=TRUE" "${next_major}.0=FALSE"
                             "${major}.${next_minor}=FALSE")
  if(NOT EXISTS "${version_file}")
    break()
  endif()
  string(REPLACE "=" ";" pair "${request_and_expected}")
  list(GET pair 0 PACKAGE_FIND_VERSION)
  list(GET pair 1 expected)
  string(REPLACE "." ";" request_parts "${PACKAGE_FIND_VERSION}.0.0")
  list(GET request_parts 0 PACKAGE_FIND_VERSION_MAJOR)
  list(GET request_parts 1 PACKAGE_FIND_VERSION_MINOR)
  list(GET request_parts 2 PACKAGE_FIND_VERSION_PATCH)
  unset(PACKAGE_VERSION_COMPATIBLE)
  include("${version_file}")
  if(NOT PACKAGE_VERSION STREQUAL version)
    list(APPEND errors "flashcoreConfigVersion.cmake says ${PACKAGE_VERSION}, flashcore.h ${version}")
  endif()
  if(NOT PACKAGE_VERSION_COMPATIBLE STREQUAL expected)
    list(APPEND errors "find_package(flashcore ${PACKAGE_FIND_VERSION}) with ${version} installed: \
compatible=${PACKAGE_VERSION_COMPATIBLE}, expected ${expected}")
  endif()
endforeach()

if(errors)
  list(JOIN errors "\n  " errors)
  message(FATAL_ERROR "install layout problems:\n  ${errors}")
endif()
message(STATUS "install layout of flashcore ${version} is complete and relocatable")
