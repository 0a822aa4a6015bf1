# SPDX-License-Identifier: BSL-1.0
# find_package(sluice COMPONENTS redis): defines sluice::redis (header-only
# sluice code under sluice/redis/ plus hiredis, found on this machine), and,
# when OpenSSL is found too, sluice::redis_tls (the same with TLS:
# SLUICE_REDIS_TLS defined, OpenSSL linked). sluice::redis alone never needs
# OpenSSL. find_package(sluice COMPONENTS redis_tls) requires the TLS target.
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

if(NOT TARGET sluice::redis_tls)
  find_package(OpenSSL 1.1.1 QUIET COMPONENTS SSL Crypto)
  if(OpenSSL_FOUND)
    add_library(sluice::redis_tls INTERFACE IMPORTED)
    target_link_libraries(sluice::redis_tls INTERFACE sluice::redis OpenSSL::SSL OpenSSL::Crypto)
    target_compile_definitions(sluice::redis_tls INTERFACE SLUICE_REDIS_TLS)
  endif()
endif()
