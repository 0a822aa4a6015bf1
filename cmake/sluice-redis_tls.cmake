# SPDX-License-Identifier: BSL-1.0
# find_package(sluice COMPONENTS redis_tls): sluice::redis plus sluice::redis_tls
# (TLS through OpenSSL; Debian: libssl-dev). See sluice-redis.cmake.
include("${CMAKE_CURRENT_LIST_DIR}/sluice-redis.cmake")
if(NOT TARGET sluice::redis_tls)
  set(sluice_redis_tls_FOUND FALSE)
  if(TARGET sluice::redis)
    set(sluice_NOT_FOUND_MESSAGE "sluice::redis_tls needs OpenSSL (Debian: apt-get install libssl-dev)")
  endif()
endif()
