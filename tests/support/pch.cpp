// SPDX-License-Identifier: BSL-1.0
// Compiled only to build the tests' precompiled header (tests/CMakeLists.txt).
