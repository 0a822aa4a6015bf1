# SPDX-License-Identifier: BSL-1.0
# Selects the Asio sluice is built on and wraps it in an INTERFACE target,
# sluice_asio: standalone Asio (Debian: libasio-dev) by default, Boost.Asio
# (Debian: libboost1.81-dev) when SLUICE_USE_BOOST_ASIO is ON. Used by the
# build and, installed, by sluice-config.cmake, so a consumer of the installed
# package picks the backend with the same variable.
#
# It never changes how the user's Asio is configured: no ASIO_NO_DEPRECATED or
# similar here. Only the backend switch SLUICE_USE_BOOST_ASIO is defined.
include_guard(GLOBAL)

# sluice_asio_configure(<target> [BUILD_ONLY]): attaches the selected Asio to
# <target>. BUILD_ONLY wraps everything in $<BUILD_INTERFACE:...>, so that an
# exported target carries none of this machine's paths (sluice-config.cmake
# attaches them again on the consumer's machine).
function(sluice_asio_configure target)
  set(defs)
  set(libs Threads::Threads)
  set(incs)
  find_package(Threads REQUIRED)
  if(SLUICE_USE_BOOST_ASIO)
    # Boost 1.74 (Asio 1.18) has no per-operation cancellation slots: stop here
    # with the package to install, not a page of template errors later.
    find_package(Boost 1.80 QUIET CONFIG)
    if(NOT Boost_FOUND)
      find_package(Boost QUIET CONFIG)
      if(Boost_FOUND)
        set(found " (found Boost ${Boost_VERSION}, which is too old: sluice needs Asio 1.24+ for per-operation cancellation)")
      endif()
      message(FATAL_ERROR "sluice: SLUICE_USE_BOOST_ASIO needs Boost 1.80 or newer${found}. "
        "Install it (Debian: apt-get install libboost1.81-dev) or set Boost_DIR.")
    endif()
    list(APPEND libs Boost::headers)
    # Asio (1.22..1.26) detects coroutines on clang only through libc++.
    list(APPEND defs SLUICE_USE_BOOST_ASIO
      $<$<CXX_COMPILER_ID:Clang>:BOOST_ASIO_HAS_CO_AWAIT=1> $<$<CXX_COMPILER_ID:Clang>:BOOST_ASIO_HAS_STD_COROUTINE=1>)
  else()
    find_path(SLUICE_ASIO_INCLUDE_DIR asio.hpp HINTS ${ASIO_ROOT} ENV ASIO_ROOT PATH_SUFFIXES include)
    if(NOT SLUICE_ASIO_INCLUDE_DIR)
      message(FATAL_ERROR "sluice: standalone Asio not found. Install it "
        "(Debian: apt-get install libasio-dev), set ASIO_ROOT, or use Boost.Asio with -DSLUICE_USE_BOOST_ASIO=ON.")
    endif()
    if(NOT SLUICE_ASIO_INCLUDE_DIR STREQUAL "/usr/include")
      list(APPEND incs ${SLUICE_ASIO_INCLUDE_DIR})
    endif()
    # Asio 1.22 detects coroutines on clang only through libc++; sluice/config.hpp
    # enables them too, this covers users who include Asio before sluice.
    list(APPEND defs $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_CO_AWAIT=1> $<$<CXX_COMPILER_ID:Clang>:ASIO_HAS_STD_COROUTINE=1>)
  endif()
  foreach(kind defs libs incs)
    set(wrapped)
    foreach(item IN LISTS ${kind})
      if(ARGV1 STREQUAL "BUILD_ONLY")
        list(APPEND wrapped "$<BUILD_INTERFACE:${item}>")
      else()
        list(APPEND wrapped "${item}")
      endif()
    endforeach()
    set(${kind} ${wrapped})
  endforeach()
  target_compile_definitions(${target} INTERFACE ${defs})
  target_link_libraries(${target} INTERFACE ${libs})
  if(incs)
    target_include_directories(${target} SYSTEM INTERFACE ${incs})
  endif()
endfunction()
