# SPDX-License-Identifier: BSL-1.0
# Finds hiredis (Debian: libhiredis-dev) for the optional sluice::redis
# component: through pkg-config when it is available, else with find_path /
# find_library (HIREDIS_ROOT is honoured). On success it defines the imported
# INTERFACE target sluice_hiredis and sets SLUICE_HIREDIS_FOUND in the
# caller's scope. Used by the build and, installed, by sluice-redis.cmake.
include_guard(GLOBAL)

function(sluice_find_hiredis)
  if(TARGET sluice_hiredis)
    set(SLUICE_HIREDIS_FOUND TRUE PARENT_SCOPE)
    return()
  endif()
  find_package(PkgConfig QUIET)
  if(PkgConfig_FOUND)
    pkg_check_modules(SLUICE_PC_HIREDIS QUIET IMPORTED_TARGET GLOBAL hiredis)
  endif()
  if(TARGET PkgConfig::SLUICE_PC_HIREDIS)
    add_library(sluice_hiredis INTERFACE IMPORTED GLOBAL)
    target_link_libraries(sluice_hiredis INTERFACE PkgConfig::SLUICE_PC_HIREDIS)
  else()
    find_path(SLUICE_HIREDIS_INCLUDE_DIR hiredis/hiredis.h HINTS ${HIREDIS_ROOT} ENV HIREDIS_ROOT
      PATH_SUFFIXES include)
    find_library(SLUICE_HIREDIS_LIBRARY hiredis HINTS ${HIREDIS_ROOT} ENV HIREDIS_ROOT
      PATH_SUFFIXES lib)
    if(NOT SLUICE_HIREDIS_INCLUDE_DIR OR NOT SLUICE_HIREDIS_LIBRARY)
      set(SLUICE_HIREDIS_FOUND FALSE PARENT_SCOPE)
      return()
    endif()
    add_library(sluice_hiredis INTERFACE IMPORTED GLOBAL)
    target_include_directories(sluice_hiredis INTERFACE ${SLUICE_HIREDIS_INCLUDE_DIR})
    target_link_libraries(sluice_hiredis INTERFACE ${SLUICE_HIREDIS_LIBRARY})
  endif()
  set(SLUICE_HIREDIS_FOUND TRUE PARENT_SCOPE)
endfunction()
