# SPDX-License-Identifier: BSL-1.0
# No header compiles a coroutine into a TU that does not call one (issue 32):
# g++ 12 emits every coroutine a TU instantiates, called or not, with all it
# reaches, so the object of an empty main that includes every public header
# (redis/ aside) must define no coroutine (`.actor`) function. Fails naming
# them (it failed on the tree before the fix: 11 coroutines, task_group's
# grace timer and co_spawn among them; see sluice/detail/lazy.hpp). clang++
# compiles only what is called: there it always passes.
file(GLOB headers RELATIVE ${SOURCE_DIR}/include
  ${SOURCE_DIR}/include/sluice/*.hpp ${SOURCE_DIR}/include/sluice/testing/*.hpp)
list(REMOVE_ITEM headers sluice/src.hpp)  # a source (SLUICE_SEPARATE_COMPILATION)
list(SORT headers)
set(tu_text "")
foreach(h IN LISTS headers)
  string(APPEND tu_text "#include <${h}>\n")
endforeach()
string(APPEND tu_text "int main() {}\n")
file(MAKE_DIRECTORY ${WORK_DIR})
file(WRITE ${WORK_DIR}/lazy_coroutines.cpp "${tu_text}")
set(defs)
if(USE_BOOST)
  set(defs -DSLUICE_USE_BOOST_ASIO)
endif()
execute_process(
  COMMAND ${CXX} -std=c++20 -O0 ${defs} -I${SOURCE_DIR}/include -c
    ${WORK_DIR}/lazy_coroutines.cpp -o ${WORK_DIR}/lazy_coroutines.o
  RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "every public header in one TU failed to compile:\n${err}")
endif()
execute_process(COMMAND ${NM} -C --defined-only ${WORK_DIR}/lazy_coroutines.o
  RESULT_VARIABLE rc OUTPUT_VARIABLE symbols ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed:\n${err}")
endif()
string(REGEX MATCHALL "[^\n]*\\[clone \\.actor\\]" actors "${symbols}")
if(actors)
  list(LENGTH actors n)
  string(REPLACE ";" "\n" actors "${actors}")
  message(FATAL_ERROR "${n} coroutines compiled into a TU that calls none:\n${actors}")
endif()
list(LENGTH headers n)
message(STATUS "${n} headers in one TU: no coroutine compiled")
