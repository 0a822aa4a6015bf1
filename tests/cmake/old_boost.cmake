# SPDX-License-Identifier: BSL-1.0
# Configuring sluice with SLUICE_USE_BOOST_ASIO against Boost 1.74 (no
# per-operation cancellation) must stop with a message naming the package to
# install, not fail later with template errors. Packages are searched only
# under tests/cmake/old_boost, where a Boost 1.74 config stands.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR} -G ${GENERATOR}
    -DCMAKE_CXX_COMPILER=${CXX} -DSLUICE_USE_BOOST_ASIO=ON
    -DCMAKE_FIND_ROOT_PATH=${SOURCE_DIR}/tests/cmake/old_boost -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY
    -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF -DSLUICE_BUILD_BENCHMARKS=OFF
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "configuring against Boost 1.74 succeeded; it must stop:\n${out}")
endif()
string(REPLACE "\n" " " flat "${out}")
string(REGEX REPLACE " +" " " flat "${flat}")
foreach(needle "found Boost 1.74.0" "libboost1.81-dev")
  string(FIND "${flat}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the error does not say \"${needle}\":\n${out}")
  endif()
endforeach()
message(STATUS "Boost 1.74 refused with a clear message")
