# CPack configuration: Debian packages and a tarball of the install tree.
#
#   cmake --build build && cd build && cpack -G DEB    # libflashcore0_*.deb, libflashcore-dev_*.deb
#   (built with CUDA 12: libflashcore0-cuda12_*.deb and the same libflashcore-dev)
#   cpack -G TGZ                                       # flashcore-<version>-Linux.tar.gz
#
# The Debian packages follow the library conventions: the runtime package is
# named after the SONAME (libflashcore.so.0 -> libflashcore0) and holds only
# the versioned library and its SONAME link; libflashcore-dev holds the
# header, the unversioned .so link, flashcore.pc and the CMake package, and
# depends on exactly the same version of libflashcore0. They are made from the
# install components of cmake/FlashcoreInstall.cmake (Runtime, Development),
# installed under /usr. dpkg-shlibdeps computes the runtime's Depends from the
# library (libc6, libgcc-s1, libstdc++6): the CUDA runtime is linked in
# statically, and the NVIDIA driver is not packaged in Debian's main archive,
# so it is only suggested.
#
# The TGZ archive is the whole install tree (all components) for other
# distributions: unpack it anywhere, it is relocatable.

include_guard(GLOBAL)

if(NOT TARGET flashcore)
  message(FATAL_ERROR "FlashcorePackaging.cmake: include it after the flashcore target is defined")
endif()

# The project has no public address yet: the default maintainer address is a
# reserved, undeliverable one (.invalid); set a real one for published packages.
set(FLASHCORE_PACKAGE_MAINTAINER "flashcore developers <maintainers@flashcore.invalid>"
    CACHE STRING "Maintainer field of the Debian packages (name <email>)")
set(FLASHCORE_PACKAGE_RELEASE 1 CACHE STRING "Debian revision of the packages (the -N of 0.4.0-N)")

# Each flavour (the CUDA major built with, CMakeLists.txt) has its own
# runtime package: the CUDA 13 build is libflashcore0, the CUDA 12 build the
# variant libflashcore0-cuda12, which provides libflashcore0, and the two
# conflict (they hold the same file). libflashcore-dev is the same from
# either build and takes either runtime.
set(_flashcore_soname_package "libflashcore${PROJECT_VERSION_MAJOR}")
# The flavour whose runtime package has the plain name: the newest.
set(_flashcore_newest_cuda_major 13)
set(_flashcore_deb_version "${PROJECT_VERSION}-${FLASHCORE_PACKAGE_RELEASE}")
if(FLASHCORE_CUDA_MAJOR EQUAL _flashcore_newest_cuda_major)
  set(_flashcore_runtime_package "${_flashcore_soname_package}")
else()
  set(_flashcore_runtime_package "${_flashcore_soname_package}-cuda${FLASHCORE_CUDA_MAJOR}")
endif()
set(_flashcore_dev_package "libflashcore-dev")

# --- Debian documentation: copyright and changelog per package --------------
# Only in the packages (EXCLUDE_FROM_ALL: a component install, as CPack's,
# includes them; a plain `cmake --install` does not).
set(_flashcore_deb_doc_dir "${PROJECT_BINARY_DIR}/debian-doc")
file(READ "${PROJECT_SOURCE_DIR}/LICENSE" _flashcore_license_text)
string(TIMESTAMP _flashcore_changelog_date "%a, %d %b %Y %H:%M:%S +0000" UTC)
file(CONFIGURE OUTPUT "${_flashcore_deb_doc_dir}/copyright" CONTENT
"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: flashcore

Files: *
Copyright: 2026 the flashcore developers
License: Apache-2.0

License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the \"License\");
 you may not use this file except in compliance with the License.
 You may obtain a copy of the License at
 .
     http://www.apache.org/licenses/LICENSE-2.0
 .
 Unless required by applicable law or agreed to in writing, software
 distributed under the License is distributed on an \"AS IS\" BASIS,
 WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 See the License for the specific language governing permissions and
 limitations under the License.
 .
 On Debian systems, the complete text of the Apache License, Version 2.0
 can be found in \"/usr/share/common-licenses/Apache-2.0\".
")
file(CONFIGURE OUTPUT "${_flashcore_deb_doc_dir}/changelog.Debian" CONTENT
"flashcore (${_flashcore_deb_version}) unstable; urgency=medium

  * flashcore ${PROJECT_VERSION}, packaged by CPack from the project's CMake
    build (cmake/FlashcorePackaging.cmake).

 -- ${FLASHCORE_PACKAGE_MAINTAINER}  ${_flashcore_changelog_date}
")
find_program(FLASHCORE_GZIP gzip)
if(FLASHCORE_GZIP)
  # -n: no name or time stamp in the header, so the file is reproducible.
  execute_process(COMMAND "${FLASHCORE_GZIP}" -9nf "${_flashcore_deb_doc_dir}/changelog.Debian"
                  RESULT_VARIABLE _flashcore_gzip_rc)
  if(NOT _flashcore_gzip_rc EQUAL 0)
    message(FATAL_ERROR "gzip -9n ${_flashcore_deb_doc_dir}/changelog.Debian failed (${_flashcore_gzip_rc})")
  endif()
  foreach(_component_and_package "Runtime=${_flashcore_runtime_package}" "Development=${_flashcore_dev_package}")
    string(REPLACE "=" ";" _pair "${_component_and_package}")
    list(GET _pair 0 _component)
    list(GET _pair 1 _package)
    install(FILES "${_flashcore_deb_doc_dir}/copyright" "${_flashcore_deb_doc_dir}/changelog.Debian.gz"
            DESTINATION "${CMAKE_INSTALL_DATAROOTDIR}/doc/${_package}"
            COMPONENT ${_component} EXCLUDE_FROM_ALL)
  endforeach()
else()
  message(STATUS "flashcore: no gzip found; the Debian packages will lack their changelog and copyright")
endif()

# The license with every install tree and the tarball (the Debian packages
# carry it as their copyright file instead).
install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DOCDIR}" COMPONENT Documentation)

# --- CPack ------------------------------------------------------------------
set(CPACK_PACKAGE_NAME "flashcore")
set(CPACK_PACKAGE_VENDOR "the flashcore developers")
set(CPACK_PACKAGE_CONTACT "${FLASHCORE_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_RESOURCE_FILE_LICENSE "${PROJECT_SOURCE_DIR}/LICENSE")
set(CPACK_GENERATOR "DEB;TGZ")
set(CPACK_SOURCE_GENERATOR "")
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGE_CHECKSUM SHA256)

# The tarball: one archive of the whole install tree.
set(CPACK_ARCHIVE_COMPONENT_INSTALL OFF)

# Debian: one package per component, installed under /usr.
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL Runtime Development)
# CPack installs DEB packages under /usr (its default), the TGZ at its root.
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_DEBIAN_PACKAGE_RELEASE "${FLASHCORE_PACKAGE_RELEASE}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${FLASHCORE_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Architecture: left to CPack, which asks `dpkg --print-architecture`.

# Both packages take the project description as their synopsis (CPack puts
# CPACK_PACKAGE_DESCRIPTION_SUMMARY first); each says below what it holds.
set(_flashcore_about
"flashcore computes scaled-dot-product attention
(softmax(scale * Q K^T [+ causal mask]) V) on NVIDIA GPUs of compute
capability 8.0 and newer in one fused, FlashAttention-style kernel, for
fp16 and bf16, grouped-query attention, any strides and head dims up to
256, behind a stable C ABI.

The CUDA runtime is linked into the library statically: at run time only
the NVIDIA driver (libcuda.so.1) is needed, no CUDA toolkit.")
# What each runtime package needs of the driver, and which to pick.
set(_flashcore_driver_note
"This build links the CUDA ${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR} runtime: it needs an NVIDIA driver for
CUDA ${FLASHCORE_CUDA_MAJOR}.0 or newer (driver ${FLASHCORE_MIN_DRIVER} or newer).")
if(FLASHCORE_CUDA_MAJOR EQUAL _flashcore_newest_cuda_major)
  string(APPEND _flashcore_driver_note "
For an older driver (CUDA 12: ${FLASHCORE_MIN_DRIVER_CUDA12} or newer), install
${_flashcore_soname_package}-cuda12 instead, the same library built with CUDA 12.")
else()
  string(APPEND _flashcore_driver_note "
It is the same library as ${_flashcore_soname_package} (built with CUDA ${_flashcore_newest_cuda_major}, for drivers
${FLASHCORE_MIN_DRIVER_CUDA${_flashcore_newest_cuda_major}} and newer), for machines with older drivers, and
replaces it.")
endif()

# ldconfig runs through dpkg's trigger, as Debian policy asks of libraries.
file(CONFIGURE OUTPUT "${_flashcore_deb_doc_dir}/triggers" CONTENT "activate-noawait ldconfig\n")

set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME "${_flashcore_runtime_package}")
# For tests/packages/check_debian_packages.sh and
# tests/symbols/check_cuda_flavour.py (CPack writes every CPACK_* variable
# into CPackConfig.cmake): the flavour and the driver it needs.
set(CPACK_FLASHCORE_CUDA_MAJOR ${FLASHCORE_CUDA_MAJOR})
set(CPACK_FLASHCORE_MIN_DRIVER ${FLASHCORE_MIN_DRIVER})
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_RUNTIME_PACKAGE_SUGGESTS "libcuda1 (>= ${FLASHCORE_MIN_DRIVER})")
if(NOT _flashcore_runtime_package STREQUAL _flashcore_soname_package)
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_PROVIDES "${_flashcore_soname_package} (= ${_flashcore_deb_version})")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONFLICTS "${_flashcore_soname_package}")
  set(CPACK_DEBIAN_RUNTIME_PACKAGE_REPLACES "${_flashcore_soname_package}")
  # The tarball says its flavour too.
  set(CPACK_PACKAGE_FILE_NAME "flashcore-${PROJECT_VERSION}-cuda${FLASHCORE_CUDA_MAJOR}-${CMAKE_SYSTEM_NAME}")
endif()
set(CPACK_DEBIAN_RUNTIME_PACKAGE_CONTROL_EXTRA "${_flashcore_deb_doc_dir}/triggers")
set(CPACK_DEBIAN_RUNTIME_DESCRIPTION
"This package contains the shared library libflashcore.so.${PROJECT_VERSION_MAJOR}.

${_flashcore_driver_note}

${_flashcore_about}")

set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_NAME "${_flashcore_dev_package}")
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEVELOPMENT_PACKAGE_DEPENDS
    "${_flashcore_soname_package} (= ${_flashcore_deb_version}) | ${_flashcore_soname_package}-cuda12 (= ${_flashcore_deb_version})")
set(CPACK_DEBIAN_DEVELOPMENT_DESCRIPTION
"This package contains the development files: the header flashcore.h, the
libflashcore.so link, the pkg-config file (flashcore.pc) and the CMake
package (find_package(flashcore), target flashcore::flashcore).

${_flashcore_about}")

include(CPack)
