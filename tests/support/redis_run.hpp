// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_REDIS_RUN_HPP
#define SLUICE_TESTS_SUPPORT_REDIS_RUN_HPP

// Running coroutines against a real redis-server in real time: run_for (a
// watchdog turns a hang into a test failure), connect_to and sleep_ms are
// examples/support/redis_run.hpp's (shared with examples/fleet.cpp); here, the
// helpers only the Redis tests use.

#include <sluice/redis/connection.hpp>

#include <support/asio.hpp>

#include <examples/support/redis_run.hpp>

namespace sluice_test {

using sluice_examples::connect_to;
using sluice_examples::run_for;
using sluice_examples::sleep_ms;

// The Redis server's clock (TIME), in microseconds.
inline asio::awaitable<long long> server_time_us(sluice::redis::connection& c) {
  sluice::redis::reply t = co_await c.execute("TIME");
  co_return std::stoll(t.elements.at(0).str) * 1000000 + std::stoll(t.elements.at(1).str);
}

// The error code of a sluice::system_error thrown by `a`, or an empty code.
template <class A>
asio::awaitable<sluice::error_code> error_of(A a) {
  try {
    co_await std::move(a);
  } catch (const sluice::system_error& e) {
    co_return e.code();
  }
  co_return sluice::error_code{};
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_REDIS_RUN_HPP
