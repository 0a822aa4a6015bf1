// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_FRESH_LOOP_HPP
#define SLUICE_TESTS_SUPPORT_FRESH_LOOP_HPP

// Loops that come and go: runs a coroutine on an io_context (the steady clock)
// made for it and destroyed before the call returns, as services make loops
// per batch, per test, per worker thread while a limit outlives them.

#include <support/asio.hpp>

#include <exception>

namespace sluice_test {

// Runs `body()` to completion on a fresh io_context; true if it finished
// without an exception.
template <class F>
bool run_on_fresh_loop(F body) {
  asio::io_context ctx;
  bool done = false;
  asio::co_spawn(ctx, body(), [&](std::exception_ptr e) { done = !e; });
  ctx.run();
  return done;
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_FRESH_LOOP_HPP
