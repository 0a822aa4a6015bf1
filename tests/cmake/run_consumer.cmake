# SPDX-License-Identifier: BSL-1.0
# Builds tests/cmake/consumer against sluice, either installed into a
# temporary prefix (KIND=find_package) or vendored (KIND=add_subdirectory).
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}\n${out}")
  endif()
endfunction()
set(consumer ${SOURCE_DIR}/tests/cmake/consumer)
if(KIND STREQUAL "find_package")
  run(${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${WORK_DIR}/sluice -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DSLUICE_BUILD_TESTS=OFF -DSLUICE_BUILD_EXAMPLES=OFF
      -DSLUICE_BUILD_BENCHMARKS=OFF -DSLUICE_INSTALL=ON)
  run(${CMAKE_COMMAND} --install ${WORK_DIR}/sluice --prefix ${WORK_DIR}/prefix)
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/consumer -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DUSE_FIND_PACKAGE=ON)
else()
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK_DIR}/consumer -G ${GENERATOR}
      -DCMAKE_CXX_COMPILER=${CXX} -DSLUICE_SOURCE_DIR=${SOURCE_DIR})
endif()
run(${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
run(${WORK_DIR}/consumer/consumer)
message(STATUS "${KIND} consumer built and ran")
