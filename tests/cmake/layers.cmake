# SPDX-License-Identifier: BSL-1.0
# The headers' layers point one way (issue 18, section 7): detail/ includes
# only detail/, config.hpp and the leaf value type stats.hpp (never time.hpp,
# redis/ or another public header); redis/detail/ includes no public Redis
# header built on it (semaphore.hpp, rate_limiter.hpp, cluster.hpp; the connection,
# its options and replies, and the permit type are below it). Fails naming
# each include that points up.
set(bad)
file(GLOB detail_headers ${SOURCE_DIR}/include/sluice/detail/*.hpp)
foreach(h IN LISTS detail_headers)
  file(STRINGS ${h} includes REGEX "^#include <sluice/")
  foreach(line IN LISTS includes)
    if(NOT line MATCHES "^#include <sluice/(detail/[a-z_]+|config|stats)\\.hpp>")
      list(APPEND bad "${h}: ${line}")
    endif()
  endforeach()
endforeach()
file(GLOB redis_detail_headers ${SOURCE_DIR}/include/sluice/redis/detail/*.hpp)
foreach(h IN LISTS redis_detail_headers)
  file(STRINGS ${h} includes REGEX "^#include <sluice/")
  foreach(line IN LISTS includes)
    if(line MATCHES "^#include <sluice/redis/(semaphore|rate_limiter)\\.hpp>"
       OR NOT line MATCHES "^#include <sluice/(detail/[a-z_]+|config|stats|redis/detail/[a-z_]+|redis/(connection|options|reply|semaphore_permit))\\.hpp>")
      list(APPEND bad "${h}: ${line}")
    endif()
  endforeach()
endforeach()
if(bad)
  string(REPLACE ";" "\n" bad "${bad}")
  message(FATAL_ERROR "includes that point up a layer:\n${bad}")
endif()
message(STATUS "detail/ and redis/detail/ include only their own layer and below")
