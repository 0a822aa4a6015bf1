// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TIMEOUT_LAYER_HPP
#define SLUICE_TIMEOUT_LAYER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/timeout.hpp>

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace sluice {

/// A policy layer that runs the layers inside it under `sluice::with_timeout`:
/// `sluice::timeout(2s)`. On the deadline the inner call is cancelled,
/// awaited until it has ended, and `sluice::timeout_error` is thrown (see
/// `with_timeout`). A limit layer outside it with `linger_for(d)` keeps the
/// abandoned call's permit for `d` more (provider-side accounting).
/// `timeouts()` counts the calls that timed out (thread-safe).
class timeout_layer {
 public:
  /// The layer with time limit `limit`.
  explicit timeout_layer(clock::duration limit) : limit_(limit) {}
  /// Moves the time limit and the timeout count.
  timeout_layer(timeout_layer&& o) noexcept : limit_(o.limit_), timeouts_(o.timeouts_.load()) {}

  /// `with_timeout(limit, next())`.
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    try {
      co_return co_await with_timeout(limit_, next());
    } catch (const timeout_error&) {
      timeouts_.fetch_add(1, std::memory_order_relaxed);
      throw;
    }
  }

  /// Calls that timed out so far.
  [[nodiscard]] std::uint64_t timeouts() const noexcept {
    return timeouts_.load(std::memory_order_relaxed);
  }
  /// The time limit.
  [[nodiscard]] clock::duration limit() const noexcept { return limit_; }

 private:
  clock::duration limit_;
  std::atomic<std::uint64_t> timeouts_{0};
};

/// A `timeout_layer` with time limit `limit`.
[[nodiscard]] inline timeout_layer timeout(clock::duration limit) {
  return timeout_layer(limit);
}

}  // namespace sluice

#endif  // SLUICE_TIMEOUT_LAYER_HPP
