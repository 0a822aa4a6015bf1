// SPDX-License-Identifier: BSL-1.0
// make compile-bench: what SLUICE_SEPARATE_COMPILATION compiles once per program
// (the sluice::separate CMake target's source).
#include <sluice/src.hpp>
