# SPDX-License-Identifier: BSL-1.0
# Builds tests/cmake/consumer (or, with EXAMPLES=<name>,<name>..., those
# examples/<name>.cpp copied out of the tree with examples/support/, through
# tests/cmake/example_consumer; REDIS_EXAMPLES names those that also link
# sluice::redis) against sluice: installed into a temporary prefix
# (KIND=find_package), vendored (KIND=add_subdirectory), or through
# FetchContent with SOURCE_DIR (KIND=fetchcontent). USE_BOOST=ON selects
# Boost.Asio in the consumer (the installed package is built with the default
# backend, so find_package also proves the consumer's choice wins).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}")
  endif()
endfunction()
if(NOT USE_BOOST)
  set(USE_BOOST OFF)
endif()
set(consumer ${SOURCE_DIR}/tests/cmake/consumer)
set(programs consumer)
if(COMPONENT STREQUAL "redis")
  set(consumer ${SOURCE_DIR}/tests/cmake/consumer_redis)  # find_package(sluice COMPONENTS redis)
endif()
set(common -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX} -DSLUICE_USE_BOOST_ASIO=${USE_BOOST})
set(consumer_args)
if(EXAMPLES)  # the examples, copied, against the installed package, run with --virtual
  string(REPLACE "," ";" programs "${EXAMPLES}")
  file(MAKE_DIRECTORY ${WORK_DIR}/example)
  file(COPY ${SOURCE_DIR}/examples/support DESTINATION ${WORK_DIR}/example)
  foreach(example IN LISTS programs)
    file(COPY ${SOURCE_DIR}/examples/${example}.cpp DESTINATION ${WORK_DIR}/example)
  endforeach()
  set(consumer ${SOURCE_DIR}/tests/cmake/example_consumer)
  list(APPEND common -DEXAMPLE_DIR=${WORK_DIR}/example -DEXAMPLES=${EXAMPLES}
       -DREDIS_EXAMPLES=${REDIS_EXAMPLES})
  set(consumer_args --virtual)
endif()
if(KIND STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/sluice -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF
      -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_INSTALL=ON)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/sluice --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/consumer ${common}
      -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DHOW=find_package)
else()
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/consumer ${common}
      -DSLUICE_SOURCE_DIR=${SOURCE_DIR} -DHOW=${KIND})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
foreach(program IN LISTS programs)
  if(EXAMPLES)  # an example that needs a server it cannot start exits 77: skipped
    execute_process(COMMAND ${WORK_DIR}/consumer/${program} ${consumer_args}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(rc EQUAL 77)
      message(STATUS "${program}: skipped (${out})")
    elseif(NOT rc EQUAL 0)
      message(FATAL_ERROR "failed (${rc}): ${program} ${consumer_args}\n${out}")
    endif()
  else()
    run(${WORK_DIR}/consumer/${program} ${consumer_args})
  endif()
endforeach()
if(COMPONENT STREQUAL "redis" AND EXISTS ${WORK_DIR}/consumer/consumer_tls)
  run(${WORK_DIR}/consumer/consumer_tls)  # sluice::redis_tls (OpenSSL found)
endif()
message(STATUS "${KIND} consumer ${EXAMPLES} (Boost.Asio: ${USE_BOOST}) built and ran")
