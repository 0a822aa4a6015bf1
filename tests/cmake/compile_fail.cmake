# SPDX-License-Identifier: BSL-1.0
# Compiles SOURCE, which must fail with a diagnostic matching its
# "// expect: <text>" line.
file(STRINGS ${SOURCE} expect_line REGEX "^// expect: ")
string(REGEX REPLACE "^// expect: " "" expected "${expect_line}")
separate_arguments(flags UNIX_COMMAND "${FLAGS}")
execute_process(
  COMMAND ${CXX} -std=c++20 -fsyntax-only ${flags} -I${INCLUDE_DIR} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
string(FIND "${out}" "${expected}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${SOURCE} failed without the expected message '${expected}':\n${out}")
endif()
message(STATUS "failed as expected: ${expected}")
