// SPDX-License-Identifier: BSL-1.0
// The sluice::separate CMake target's one translation unit: sluice's
// type-independent machinery, compiled once (SLUICE_SEPARATE_COMPILATION).
#include <sluice/src.hpp>
