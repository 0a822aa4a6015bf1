// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_EXAMPLES_SUPPORT_REDIS_RUN_HPP
#define SLUICE_EXAMPLES_SUPPORT_REDIS_RUN_HPP

// Running coroutines against a real redis-server in real time: a watchdog turns
// a hang into an error, and a few helpers shared by examples/fleet.cpp and the
// Redis tests. It ships beside the examples and includes installed headers
// only: copy it with the example that includes it.

#include <sluice/asio.hpp>
#include <sluice/redis/connection.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace sluice_examples {

// Runs `a` on `ctx` until it finishes; throws std::runtime_error("hung") if it
// has not finished after `limit`, and rethrows its exception.
template <class T>
T run_for(asio::io_context& ctx, asio::awaitable<T> a,
          std::chrono::steady_clock::duration limit = std::chrono::seconds(20)) {
  bool done = false;
  std::exception_ptr error;
  std::optional<std::conditional_t<std::is_void_v<T>, int, T>> result;
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e) {
      done = true;
      error = e;
    });
  } else {
    asio::co_spawn(ctx, std::move(a), [&](std::exception_ptr e, T v) {
      done = true;
      error = e;
      if (!e) result.emplace(std::move(v));
    });
  }
  ctx.restart();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    ctx.run_one_for(std::chrono::milliseconds(50));
  }
  if (!done) throw std::runtime_error("hung: the coroutine did not finish in time");
  ctx.poll();  // let completed I/O handlers release what they hold
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) return std::move(*result);
}

inline asio::awaitable<std::shared_ptr<sluice::redis::connection>> connect_to(int port) {
  co_return co_await sluice::redis::connect(co_await asio::this_coro::executor, "127.0.0.1",
                                            static_cast<std::uint16_t>(port));
}

inline asio::awaitable<void> sleep_ms(long ms) {
  asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(ms));
  co_await t.async_wait(asio::use_awaitable);
}

}  // namespace sluice_examples

#endif  // SLUICE_EXAMPLES_SUPPORT_REDIS_RUN_HPP
