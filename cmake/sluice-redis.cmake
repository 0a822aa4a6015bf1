# SPDX-License-Identifier: BSL-1.0
# find_package(sluice COMPONENTS redis): defines sluice::redis (header-only
# sluice code under sluice/redis/ plus hiredis, found on this machine).
include("${CMAKE_CURRENT_LIST_DIR}/sluice_hiredis.cmake")
sluice_find_hiredis()
if(NOT SLUICE_HIREDIS_FOUND)
  set(sluice_redis_FOUND FALSE)
  set(sluice_NOT_FOUND_MESSAGE "sluice::redis needs hiredis (Debian: apt-get install libhiredis-dev)")
  return()
endif()
if(NOT TARGET sluice::redis)
  include("${CMAKE_CURRENT_LIST_DIR}/sluice-redis-targets.cmake")
  target_link_libraries(sluice::redis INTERFACE sluice_hiredis)
endif()
