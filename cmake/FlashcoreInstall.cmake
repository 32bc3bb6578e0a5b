# Install rules for libflashcore: the header, the shared library with its
# SONAME links, a pkg-config file and a CMake package (flashcore::flashcore).
#
# Included from the top-level CMakeLists.txt once the `flashcore` target
# exists. Everything installed is relocatable: the CMake package and the
# pkg-config file find the prefix from their own location, so a copied or
# moved install tree keeps working.
#
# Layout (libdir is CMAKE_INSTALL_LIBDIR, usually "lib"):
#   include/flashcore.h
#   <libdir>/libflashcore.so.X.Y.Z, libflashcore.so.X -> .X.Y.Z, libflashcore.so -> .X
#   <libdir>/pkgconfig/flashcore.pc
#   <libdir>/cmake/flashcore/flashcoreConfig.cmake, flashcoreConfigVersion.cmake,
#                            flashcoreTargets.cmake (+ per-config file)

include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(NOT TARGET flashcore)
  message(FATAL_ERROR "FlashcoreInstall.cmake: include it after the flashcore target is defined")
endif()

set(FLASHCORE_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/flashcore"
    CACHE STRING "Where flashcoreConfig.cmake is installed, relative to the prefix")
set(FLASHCORE_INSTALL_PKGCONFIGDIR "${CMAKE_INSTALL_LIBDIR}/pkgconfig"
    CACHE STRING "Where flashcore.pc is installed, relative to the prefix")

# The same name in-tree (add_subdirectory / FetchContent users, bindings) as
# for consumers of the installed package.
if(NOT TARGET flashcore::flashcore)
  add_library(flashcore::flashcore ALIAS flashcore)
endif()

set(_flashcore_repo_dir "${CMAKE_CURRENT_LIST_DIR}/..")

# --- library and header -----------------------------------------------------
# Runtime gets libflashcore.so.X.Y.Z and the .so.X link; the development
# files (unversioned link, header, pkg-config, CMake package) go to
# Development, so packagers can split them.
install(TARGETS flashcore
        EXPORT flashcoreTargets
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
                COMPONENT Runtime
                NAMELINK_COMPONENT Development
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}" COMPONENT Development
        RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}" COMPONENT Runtime)
install(FILES "${_flashcore_repo_dir}/include/flashcore.h"
        DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
        COMPONENT Development)

# --- CMake package ----------------------------------------------------------
# The CUDA runtime is linked statically and privately, so the exported target
# carries no CUDA dependency and flashcoreConfig.cmake needs no find_dependency.
install(EXPORT flashcoreTargets
        NAMESPACE flashcore::
        FILE flashcoreTargets.cmake
        DESTINATION "${FLASHCORE_INSTALL_CMAKEDIR}"
        COMPONENT Development)
configure_package_config_file(
  "${CMAKE_CURRENT_LIST_DIR}/flashcoreConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/flashcoreConfig.cmake"
  INSTALL_DESTINATION "${FLASHCORE_INSTALL_CMAKEDIR}"
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
# SameMajorVersion matches the SONAME policy: libflashcore.so.<MAJOR> keeps its
# ABI within a major version.
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/flashcoreConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMajorVersion)
install(FILES "${PROJECT_BINARY_DIR}/flashcoreConfig.cmake"
              "${PROJECT_BINARY_DIR}/flashcoreConfigVersion.cmake"
        DESTINATION "${FLASHCORE_INSTALL_CMAKEDIR}"
        COMPONENT Development)

# --- pkg-config -------------------------------------------------------------
# With relative install dirs the prefix is computed from ${pcfiledir} (the
# directory holding flashcore.pc), which keeps the install relocatable.
# Absolute install dirs given by the user are written as they are.
if(IS_ABSOLUTE "${FLASHCORE_INSTALL_PKGCONFIGDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}"
   OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(FLASHCORE_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(FLASHCORE_PC_LIBDIR "${CMAKE_INSTALL_FULL_LIBDIR}")
  set(FLASHCORE_PC_INCLUDEDIR "${CMAKE_INSTALL_FULL_INCLUDEDIR}")
else()
  # "/p" is only an anchor to turn the relative pkgconfig dir into "../.."-style.
  file(RELATIVE_PATH _flashcore_pc_up "/p/${FLASHCORE_INSTALL_PKGCONFIGDIR}" "/p")
  string(REGEX REPLACE "/$" "" _flashcore_pc_up "${_flashcore_pc_up}")
  set(FLASHCORE_PC_PREFIX "\${pcfiledir}/${_flashcore_pc_up}")
  set(FLASHCORE_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(FLASHCORE_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file("${_flashcore_repo_dir}/pkgconfig/flashcore.pc.in"
               "${PROJECT_BINARY_DIR}/flashcore.pc" @ONLY)
install(FILES "${PROJECT_BINARY_DIR}/flashcore.pc"
        DESTINATION "${FLASHCORE_INSTALL_PKGCONFIGDIR}"
        COMPONENT Development)
