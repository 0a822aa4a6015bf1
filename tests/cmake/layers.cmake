# SPDX-License-Identifier: BSL-1.0
# The headers' layers point one way (issue 18, section 7): detail/ never
# includes time.hpp (built on detail/virtual_clock.hpp) or anything of redis/;
# redis/detail/ includes no public Redis header built on it (semaphore.hpp,
# rate_limiter.hpp, cluster.hpp, sentinel.hpp; the connection, its options and
# replies, and the permit type are below it). Fails naming each include that
# points up (it failed on the tree before the fix: detail/redis_io.hpp and
# detail/redis_script.hpp included redis/).
set(bad)
file(GLOB detail_headers ${SOURCE_DIR}/include/sluice/detail/*.hpp)
foreach(h IN LISTS detail_headers)
  file(STRINGS ${h} includes REGEX "^#include <sluice/")
  foreach(line IN LISTS includes)
    if(line MATCHES "^#include <sluice/(time|redis/[a-z_/]+)\\.hpp>")
      list(APPEND bad "${h}: ${line}")
    endif()
  endforeach()
endforeach()
file(GLOB redis_detail_headers ${SOURCE_DIR}/include/sluice/redis/detail/*.hpp)
foreach(h IN LISTS redis_detail_headers)
  file(STRINGS ${h} includes REGEX "^#include <sluice/")
  foreach(line IN LISTS includes)
    if(line MATCHES "^#include <sluice/(time|redis/(semaphore|rate_limiter|cluster|sentinel))\\.hpp>")
      list(APPEND bad "${h}: ${line}")
    endif()
  endforeach()
endforeach()
# Vocabulary headers (what the others name: config, concepts, outcome, stats,
# progress, adaptive_algorithms) sit below the machinery: they include detail/ and each other, no
# other public header (progress.hpp included time.hpp, so detail/gather_core.hpp
# reached time.hpp through it; issue 32).
set(vocabulary config concepts outcome stats progress adaptive_algorithms)
string(REPLACE ";" "|" vocabulary_re "${vocabulary}")
foreach(name IN LISTS vocabulary)
  set(h ${SOURCE_DIR}/include/sluice/${name}.hpp)
  file(STRINGS ${h} includes REGEX "^#include <sluice/")
  foreach(line IN LISTS includes)
    if(NOT line MATCHES "^#include <sluice/(detail/[a-z_]+|${vocabulary_re})\\.hpp>")
      list(APPEND bad "${h}: ${line}")
    endif()
  endforeach()
endforeach()
if(bad)
  string(REPLACE ";" "\n" bad "${bad}")
  message(FATAL_ERROR "includes that point up a layer:\n${bad}")
endif()
message(STATUS "detail/, redis/detail/ and the vocabulary headers include nothing above them")
