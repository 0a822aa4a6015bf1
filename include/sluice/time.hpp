// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TIME_HPP
#define SLUICE_TIME_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/virtual_clock.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <chrono>

namespace sluice {

/// The clock of every sluice wait on time. In production this is
/// `std::chrono::steady_clock`; under `sluice::testing::virtual_loop` the same
/// type carries virtual time.
using clock = detail::clock;  // std::chrono::steady_clock

/// A `clock::duration` (derived from it) constructible from any
/// `std::chrono::duration`, saturated to the clock's range instead of
/// overflowing: the type of the duration fields of sluice's option structs
/// (`backoff`, `retry_after`, ...), so `.max = std::chrono::hours::max()`
/// means "forever". Functions taking a duration are templates that saturate
/// in the same way.
using saturating_duration = detail::saturating_duration;

namespace detail {

// One virtual sleep: a node in the virtual clock's heap that owns the handler.
template <class Handler, class Executor>
struct virtual_sleep_op final : virtual_timer_node {
  virtual_sleep_op(Handler&& h, const Executor& e, virtual_clock_service& s)
      : handler(std::move(h)), ex(e), svc(s) {
    fire = &do_fire;
  }

  static void do_fire(virtual_timer_node* n, bool invoke, error_code ec) {
    auto* op = static_cast<virtual_sleep_op*>(n);
    Handler h = std::move(op->handler);
    Executor ex = op->ex;
    delete op;
    if (invoke) {
      post_completion(std::move(h), ex, ec);
    } else if (auto slot = asio::get_associated_cancellation_slot(h); slot.is_connected()) {
      slot.clear();
    }
  }

  struct fire_aborted {
    void operator()(virtual_sleep_op* o) const { do_fire(o, true, asio::error::operation_aborted); }
  };
  struct fire_dropped {
    void operator()(virtual_sleep_op* o) const noexcept { do_fire(o, false, error_code{}); }
  };

  // Installed in the handler's cancellation slot. It must not clear the slot
  // it runs from, so it unschedules the timer and completes it from a post.
  // The post owns the operation: if the loop is destroyed before it runs, the
  // operation and its handler (the coroutine frames) are destroyed with it.
  struct cancel_handler {
    explicit cancel_handler(virtual_sleep_op* o) noexcept : op(o) {}
    virtual_sleep_op* op;
    void operator()(asio::cancellation_type type) const {
      if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                   asio::cancellation_type::total)) == asio::cancellation_type::none)
        return;
      if (!op->svc.cancel(op)) return;  // already fired or already cancelled
      asio::post(op->ex, owning_post<virtual_sleep_op, fire_aborted, fire_dropped>(op));
    }
  };

  Handler handler;
  Executor ex;
  virtual_clock_service& svc;
};

template <class Executor>
struct initiate_virtual_sleep {
  Executor ex;
  virtual_clock_service* svc;
  template <class Handler>
  void operator()(Handler&& handler, clock::time_point deadline) const {
    auto* op = new virtual_sleep_op<std::decay_t<Handler>, Executor>(std::forward<Handler>(handler),
                                                                     ex, *svc);
    op->deadline = deadline;
    svc->schedule(op);
    auto slot = asio::get_associated_cancellation_slot(op->handler);
    if (slot.is_connected())
      slot.template emplace<typename std::remove_pointer_t<decltype(op)>::cancel_handler>(op);
  }
};

}  // namespace detail

/// The current time on `ex`'s execution context: virtual under
/// `sluice::testing::virtual_loop`, `std::chrono::steady_clock::now()` otherwise.
template <class Executor>
[[nodiscard]] clock::time_point now(const Executor& ex) {
  if (auto* v = detail::find_virtual_clock(ex)) return v->now();
  return clock::now();
}

namespace detail {

// Waits until `deadline` on `ex`, in virtual time when `v` is the context's
// virtual clock, on an asio::steady_timer otherwise. Every sluice wait on time
// starts here: a caller whose cancellation was already requested is refused
// at once. A deadline of time_point::max() (a saturated "forever") never
// fires: only a cancellation ends the wait.
template <class Executor>
asio::awaitable<void, Executor> wait_until(const Executor& ex, virtual_clock_service* v,
                                           clock::time_point deadline) {
  refuse_if_cancelled(co_await asio::this_coro::cancellation_state, "sluice::sleep");
  if (v) {
    // Named, not a temporary of the co_await expression: g++ 12 destroys such
    // temporaries twice, which over-releases a ref-counted executor (a strand).
    initiate_virtual_sleep<Executor> initiation{ex, v};
    co_await asio::async_initiate<const asio::use_awaitable_t<Executor>&, void(error_code)>(
        std::move(initiation), asio::use_awaitable_t<Executor>{}, deadline);
  } else {
    asio::basic_waitable_timer<clock, asio::wait_traits<clock>, Executor> timer(ex, deadline);
    co_await timer.async_wait(asio::use_awaitable_t<Executor>{});
  }
}

}  // namespace detail

/// Waits until `deadline` on the clock of the awaiting coroutine's executor.
///
/// Resumes on the coroutine's executor. Throws `system_error` with
/// `asio::error::operation_aborted` when cancelled.
///
/// Per-Operation Cancellation: the wait itself ends at once on terminal,
/// partial or total cancellation, but it only sees what the awaiting
/// coroutine's cancellation state lets through, and the state of a coroutine
/// started with `asio::co_spawn` passes terminal cancellation only (Asio's
/// default filter). So by default only terminal cancellation ends a sleep; a
/// partial or total request leaves it running. To let them through, widen
/// the filter in the coroutine:
/// `co_await asio::this_coro::reset_cancellation_state(asio::enable_partial_cancellation());`
/// (or `enable_total_cancellation()`).
///
/// Why sluice does not widen it itself: the filter belongs to the whole
/// coroutine, not to one wait; resetting it from inside `sleep` would change
/// how every other operation of the caller reacts, and Asio keeps partial and
/// total off by default because most coroutines cannot honour their "nothing
/// happened" guarantees.
template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
[[nodiscard]] inline asio::awaitable<void> sleep_until(clock::time_point deadline) {
  auto ex = co_await asio::this_coro::executor;
  co_await detail::wait_until(detail::lazy<Lazy>(ex), detail::find_virtual_clock(ex), deadline);
}

namespace detail {

template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
inline asio::awaitable<void> sleep_for(clock::duration duration) {
  auto ex = co_await asio::this_coro::executor;
  auto* v = detail::find_virtual_clock(ex);
  // Computed outside the co_await: g++ 12 miscompiles a ?: in a co_await operand.
  // Saturated: sleep(clock::duration::max()) sleeps forever, it does not wrap.
  const clock::time_point deadline = detail::add_saturating(v ? v->now() : clock::now(), duration);
  co_await detail::wait_until(detail::lazy<Lazy>(ex), v, deadline);
}

}  // namespace detail

/// Waits for `duration` on the clock of the awaiting coroutine's executor (see
/// `sleep_until`). A zero or negative duration still yields once to the loop.
/// Any `std::chrono::duration` is taken and saturates instead of overflowing:
/// `std::chrono::hours::max()`, like `clock::duration::max()` or a deadline
/// past the clock's range, sleeps until cancelled (under
/// `sluice::testing::virtual_loop` such a wait never fires: with nothing else
/// to run, the loop reports the deadlock). A caller whose cancellation was
/// already requested is refused at once with `operation_aborted`.
///
/// @code
/// co_await sluice::sleep(std::chrono::milliseconds(200));
/// @endcode
template <class Rep, class Period>
[[nodiscard]] asio::awaitable<void> sleep(std::chrono::duration<Rep, Period> duration) {
  return detail::sleep_for(detail::saturate(duration));
}

}  // namespace sluice

#endif  // SLUICE_TIME_HPP
