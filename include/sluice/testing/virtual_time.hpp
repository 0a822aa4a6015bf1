// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTING_VIRTUAL_TIME_HPP
#define SLUICE_TESTING_VIRTUAL_TIME_HPP

#include <sluice/config.hpp>
#include <sluice/detail/virtual_clock.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <chrono>
#include <concepts>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice::testing {

/// Thrown by `virtual_loop::run` when the main coroutine waits, nothing is
/// ready to run and no timer is pending: the program would hang forever.
class deadlock_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

/// A single-threaded loop whose time is virtual: whenever every coroutine is
/// blocked, the clock jumps to the next deadline (as Trio's MockClock with
/// autojump, or tokio's paused time). Hours of simulated latency run in
/// milliseconds, and timings are exact and the same on every run.
///
/// Everything in sluice that waits on time (`sluice::sleep`, the
/// `slow_service`, ...) reads its clock from the executor's context, so code
/// under test runs unchanged. Virtual time starts at 0. Only sluice's waits are
/// virtual: a raw `asio::steady_timer` still waits in real time, and work done
/// on other threads is invisible to the autojump.
///
/// @code
/// sluice::testing::virtual_loop loop;
/// loop.run([]() -> asio::awaitable<void> { co_await sluice::sleep(5s); });
/// assert(loop.now() == 5s);
/// @endcode
class virtual_loop {
 public:
  /// The loop's executor type.
  using executor_type = asio::io_context::executor_type;

  virtual_loop() : clock_(asio::make_service<sluice::detail::virtual_clock_service>(ctx_)) {}
  virtual_loop(const virtual_loop&) = delete;
  virtual_loop& operator=(const virtual_loop&) = delete;

  /// The executor of the loop (timers on it run on virtual time).
  [[nodiscard]] executor_type get_executor() noexcept { return ctx_.get_executor(); }
  /// The underlying io_context.
  [[nodiscard]] asio::io_context& context() noexcept { return ctx_; }

  /// Virtual time elapsed since the loop was made.
  [[nodiscard]] std::chrono::nanoseconds now() const noexcept {
    return clock_.now().time_since_epoch();
  }

  /// Runs `main` to completion and returns its result or rethrows its
  /// exception. Throws `deadlock_error` if it can never finish. Other
  /// coroutines still pending afterwards are left as they are (they are
  /// destroyed with the loop).
  template <class T>
  T run(asio::awaitable<T, asio::any_io_executor> main) {
    // The result is stored by a wrapper, so T need not be default
    // constructible (asio::co_spawn would require it).
    std::optional<std::conditional_t<std::is_void_v<T>, char, T>> value;
    std::exception_ptr error;
    bool done = false;
    asio::co_spawn(ctx_, store(std::move(main), value), [&](std::exception_ptr e) {
      error = e;
      done = true;
    });
    drive([&] { return done; }, clock::time_point::max(), true);
    if (error) std::rethrow_exception(error);
    if constexpr (!std::is_void_v<T>) return std::move(*value);
  }

  /// Calls `f()` (which returns an awaitable) and runs the result; `f` stays
  /// alive meanwhile, so a lambda's captures are safe to use.
  template <class F>
  requires std::invocable<F&>
  auto run(F&& f) { return run(f()); }

  /// Runs everything that is ready and advances virtual time by `d`, firing
  /// the timers that fall due on the way.
  void run_for(std::chrono::nanoseconds d) {
    drive([] { return false; }, sluice::detail::add_saturating(clock_.now(), d), false);
  }

  /// Runs everything that is ready, without advancing time.
  void poll() { drain(); }

 private:
  template <class T, class Slot>
  static asio::awaitable<void> store(asio::awaitable<T, asio::any_io_executor> main, Slot& slot) {
    if constexpr (std::is_void_v<T>) {
      co_await std::move(main);
      slot.emplace('\0');
    } else {
      slot.emplace(co_await std::move(main));
    }
  }

  void drain() {
    for (;;) {
      ctx_.restart();
      if (ctx_.poll() == 0) return;
    }
  }

  template <class Done>
  void drive(Done done, clock::time_point until, bool to_completion) {
    for (;;) {
      drain();
      if (done()) return;
      if (!clock_.has_due() || clock_.next_deadline() > until) {
        if (!to_completion) {
          clock_.advance_to(until);
          drain();
          return;
        }
        throw deadlock_error(
            "sluice::testing::virtual_loop: deadlock at t=" +
            std::to_string(std::chrono::duration<double>(now()).count()) +
            "s: the main coroutine waits, nothing is ready to run and no timer is pending");
      }
      clock_.advance_to(clock_.next_deadline());
    }
  }

  asio::io_context ctx_{1};
  sluice::detail::virtual_clock_service& clock_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTING_VIRTUAL_TIME_HPP
