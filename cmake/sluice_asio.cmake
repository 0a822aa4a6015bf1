# SPDX-License-Identifier: BSL-1.0
# Finds standalone Asio (Debian: libasio-dev) and wraps it in an INTERFACE
# target. Asio is header-only; it needs the platform's thread library.
if(TARGET sluice_asio OR TARGET sluice::sluice_asio)
  return()
endif()
find_package(Threads REQUIRED)
find_path(SLUICE_ASIO_INCLUDE_DIR asio.hpp
  HINTS ${ASIO_ROOT} ENV ASIO_ROOT PATH_SUFFIXES include)
if(NOT SLUICE_ASIO_INCLUDE_DIR)
  message(FATAL_ERROR "sluice: standalone Asio not found. Install it (Debian: apt-get install libasio-dev) or set ASIO_ROOT.")
endif()
add_library(sluice_asio INTERFACE)
if(NOT SLUICE_ASIO_INCLUDE_DIR STREQUAL "/usr/include")
  target_include_directories(sluice_asio SYSTEM INTERFACE
    $<BUILD_INTERFACE:${SLUICE_ASIO_INCLUDE_DIR}>)
endif()
target_compile_definitions(sluice_asio INTERFACE ASIO_NO_DEPRECATED)
target_link_libraries(sluice_asio INTERFACE Threads::Threads)
