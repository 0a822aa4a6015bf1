// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_REDIS_SENTINEL_HPP
#define SLUICE_TESTS_SUPPORT_REDIS_SENTINEL_HPP

// examples/support/redis_sentinel.hpp (shared with examples/fleet.cpp), its names in
// sluice_test for the tests.

#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <examples/support/redis_sentinel.hpp>

namespace sluice_test {
using namespace sluice_examples;
}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_REDIS_SENTINEL_HPP
