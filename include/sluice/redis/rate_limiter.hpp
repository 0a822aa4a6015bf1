// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_RATE_LIMITER_HPP
#define SLUICE_REDIS_RATE_LIMITER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/stats_recorder.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/rate_state.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/stats.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {
struct redis_all_access;
}  // namespace sluice::detail

namespace sluice::redis {

/// The sliding-window limiter of `sluice::rate_limiter`, shared by every
/// process that uses the same Redis server and `name`: at most `calls`
/// acquisitions start within any window of length `per`, across the fleet.
///
/// The window is a sorted set of start times (`sluice:rate:{<name>}`, or
/// `sluice:rate:<name>` for a name with its own hash tag), trimmed,
/// counted and appended to in one Lua script run atomically by Redis, with the
/// server's clock (`TIME`, microseconds): the clients' clocks do not matter.
/// When the window is full the script returns how long until the oldest
/// start that blocks the request leaves it; the caller sleeps exactly that
/// long (an Asio timer, no polling) and asks again. Within a process waiters
/// are served FIFO (one at a time asks the server); across processes the
/// order is whoever asks first after a slot frees (no ticket order).
///
/// What resumes where: on the awaiting coroutine's executor (the timer's
/// completion). Per-Operation Cancellation: a waiter cancelled while it
/// sleeps or waits for its turn takes nothing and throws `operation_aborted`;
/// a script already sent is not interrupted: if it recorded the start, the
/// acquisition succeeds (the start counts in the window either way).
///
/// Failures: a lost connection is a `sluice::system_error` at the waiting call
/// (the next call reconnects); a start recorded by a script whose reply was
/// lost counts against the window until it leaves it (under-admission, never
/// over-admission). Redis restarted without persistence forgets the window:
/// up to `calls` more starts may follow at once (say so to your provider's
/// limits, or enable persistence).
///
/// Lifetime: the limiter must outlive its acquire calls. Nothing runs in the
/// background. Loop-affine.
///
/// @code
/// auto conn = co_await sluice::redis::connect(ex, "127.0.0.1", 6379);
/// sluice::redis::rate_limiter rpm{conn, "places-api:rpm", 60, std::chrono::minutes(1)};
/// co_await rpm.acquire();          // at most 60 starts per minute across the fleet
/// co_await call_places_api();
/// @endcode
class rate_limiter {
 public:
  /// A limiter of `calls` starts per `per` named `name` on `conn`'s server.
  /// Throws `std::invalid_argument` if `calls == 0` or above 2^53 (Lua
  /// numbers are doubles), `per` is not positive (microsecond resolution),
  /// `conn` is null, or `name` is empty or has a brace other than one leading
  /// hash tag (the name is the key's `{hash tag}`, or carries its own:
  /// `"{account}:rpm"`, so that limits of one account share a slot for
  /// `redis::acquire_all`).
  template <class Rep, class Period>
  rate_limiter(std::shared_ptr<connection> conn, std::string name, std::size_t calls,
               std::chrono::duration<Rep, Period> per) {
    if (!conn) throw std::invalid_argument("sluice::redis::rate_limiter: null connection");
    if (calls == 0) throw std::invalid_argument("sluice::redis::rate_limiter: calls == 0");
    detail::redis_check_exact(calls, "sluice::redis::rate_limiter");
    detail::redis_check_name(name, "sluice::redis::rate_limiter");
    // Saturated first: hours::max() is a window of the clock's range, never a wrapped one.
    const auto us =
        std::chrono::duration_cast<std::chrono::microseconds>(sluice::detail::saturate(per));
    if (us.count() <= 0) throw std::invalid_argument("sluice::redis::rate_limiter: per <= 0");
    st_ = std::make_shared<detail::redis_rate_state>();
    st_->conn = std::move(conn);
    st_->key = detail::redis_tagged("sluice:rate:", name);
    st_->calls = calls;
    st_->per = us;
  }
  rate_limiter(const rate_limiter&) = delete;
  rate_limiter& operator=(const rate_limiter&) = delete;

  /// Waits until `n` more starts fit in the window, and records them. Throws
  /// `std::invalid_argument` at once if `n == 0` or `n > calls`,
  /// `operation_aborted` when cancelled while waiting, `sluice::system_error`
  /// when the connection fails, `server_error` if Redis rejects the script.
  [[nodiscard]] asio::awaitable<void> acquire(std::size_t n = 1) {
    check(n);
    return detail::redis_without_throw_if_cancelled(acquire_impl(st_, n));
  }

  /// As `acquire(n)`, with any completion token; signature
  /// `void(sluice::error_code)` (`errc::protocol_error` for a script error).
  /// Completes through a post to the handler's executor (else the
  /// connection's).
  template <asio::completion_token_for<void(error_code)> CompletionToken>
  auto async_acquire(std::size_t n, CompletionToken&& token) {
    check(n);
    return asio::async_initiate<CompletionToken, void(error_code)>(
        [st = st_, n](auto handler) {
          auto ex = st->conn->get_executor();
          if (detail::refuse_cancelled(handler, ex)) return;  // cancelled before it called
          auto slot = asio::get_associated_cancellation_slot(handler);
          auto done = [h = std::move(handler), ex](std::exception_ptr, error_code ec) mutable {
            detail::post_completion(std::move(h), ex, ec);
          };
          asio::co_spawn(ex, acquire_ec(st, n),
                         detail::redis_slot_handler<decltype(done)>{slot, std::move(done)});
        },
        token);
  }

  /// Records `n` starts if they fit now and no local call waits; one round
  /// trip, never sleeps. Throws as `acquire()`.
  [[nodiscard]] asio::awaitable<bool> try_acquire(std::size_t n = 1) {
    check(n);
    auto st = st_;
    const auto asked = detail::clock::now();
    if (st->order.locked()) {
      ++st->stats.throttled;
      co_return false;
    }
    std::vector<std::string> keys{st->key};
    reply r = co_await detail::redis_eval(*st->conn, st->acquire, std::move(keys),
                                          args(*st, n, "try"), detail::redis_cancel::follow);
    if (r.integer != 0) {
      ++st->stats.throttled;
      co_return false;
    }
    st->granted(n, asked);
    co_return true;
  }

  /// Starts that still fit in the window across the fleet now: `calls` minus
  /// the starts every process recorded within the last `per` by the server's
  /// clock (starts that left the window are not counted, trimmed or not).
  /// One round trip; throws as `try_acquire()`; cancellable like it.
  [[nodiscard]] asio::awaitable<std::size_t> value() {
    auto st = st_;
    std::vector<std::string> keys{st->key};
    std::vector<std::string> a{std::to_string(st->calls), std::to_string(st->per.count())};
    reply r = co_await detail::redis_eval(*st->conn, st->status, std::move(keys), std::move(a),
                                          detail::redis_cancel::follow);
    co_return static_cast<std::size_t>(r.integer);
  }

  /// `n` units of this limiter as one budget of `redis::acquire_all`
  /// (`tpm.weighted(tokens)`); the limiter must outlive the call. Throws
  /// `std::invalid_argument` at once if `n == 0` or `n > calls` (it would
  /// never fit in the window).
  struct weighted_budget {
    rate_limiter& limiter;  ///< the limiter
    std::size_t n;          ///< the units asked for
  };
  /// See `weighted_budget`.
  [[nodiscard]] weighted_budget weighted(std::size_t n) {
    check(n);
    return {*this, n};
  }

  /// acquire() calls of this process waiting now.
  [[nodiscard]] std::size_t waiters() const noexcept { return st_->waiting; }
  /// What this client has done and is doing (see `sluice::stats`), with no
  /// round trip: this limiter object's view, not the fleet's. `acquired`
  /// counts its grants (`acquire(n)` once; `try_acquire()` when it grants);
  /// `throttled` the requests that had to wait (for the window, or behind
  /// another local waiter) and `try_acquire()` refusals; `cancelled` the
  /// waits that ended in `operation_aborted`; `wait` times every grant from
  /// the call, its round trips included; `waiting` is `waiters()`; `in_use`
  /// the units this client started within the last `per` by its own clock
  /// (the fleet's window is on the server: `co_await value()`); `limit` is
  /// `calls`; no hold time. A request that failed with the connection counts
  /// only in `throttled`, if it had to wait. O(buckets + this client's starts
  /// in the window); read it on the connection's executor.
  [[nodiscard]] sluice::stats stats() const {
    return st_->stats.read(st_->waiting, st_->in_window(), st_->calls);
  }
  /// The Redis key of the window.
  [[nodiscard]] const std::string& key() const noexcept { return st_->key; }

 private:
  friend struct detail::redis_all_access;
  using state = detail::redis_rate_state;

  void check(std::size_t n) const {
    if (n == 0 || n > st_->calls)
      throw std::invalid_argument(
          "sluice::redis::rate_limiter::acquire: n must be between 1 and calls (a larger n "
          "would never fit in the window)");
  }

  static std::vector<std::string> args(const state& st, std::size_t n, const char* mode) {
    return {std::to_string(st.calls), std::to_string(st.per.count()), std::to_string(n),
            detail::redis_unique_id(), mode};
  }

  static asio::awaitable<error_code> acquire_ec(std::shared_ptr<state> st, std::size_t n) {
    try {
      co_await detail::redis_without_throw_if_cancelled(acquire_impl(st, n));
    } catch (const system_error& e) {
      co_return e.code();
    } catch (const server_error&) {
      co_return make_error_code(errc::protocol_error);
    }
    co_return error_code{};
  }

  static asio::awaitable<void> acquire_impl(std::shared_ptr<state> st, std::size_t n) {
    const auto asked = detail::clock::now();
    bool throttled = false;
    auto throttle = [&] {
      if (!std::exchange(throttled, true)) ++st->stats.throttled;
    };
    try {
      auto cs = co_await asio::this_coro::cancellation_state;
      if (cs.cancelled() != asio::cancellation_type::none)
        throw system_error(asio::error::operation_aborted);
      ++st->waiting;
      struct count_guard {
        state& s;
        ~count_guard() { --s.waiting; }
      } counted{*st};
      if (st->order.locked()) throttle();
      auto turn = co_await st->order.scoped_acquire();  // throws when cancelled
      asio::steady_timer timer(st->conn->get_executor());
      std::vector<std::string> keys{st->key};
      for (;;) {
        // Cancelled in flight: the starts may have been recorded; counting a
        // start that never happens is the safe direction.
        reply r = co_await detail::redis_eval(*st->conn, st->acquire, keys, args(*st, n, "wait"),
                                              detail::redis_cancel::follow);
        if (r.integer == 0) {
          st->granted(n, asked);
          co_return;
        }
        throttle();
        if (cs.cancelled() != asio::cancellation_type::none)
          throw system_error(asio::error::operation_aborted);
        timer.expires_after(std::chrono::microseconds(r.integer));
        auto token = asio::use_awaitable;
        co_await timer.async_wait(token);  // throws operation_aborted when cancelled
      }
    } catch (const system_error& e) {
      if (e.code() == asio::error::operation_aborted) ++st->stats.cancelled;
      throw;
    }
  }

  std::shared_ptr<state> st_;
};

}  // namespace sluice::redis

#endif  // SLUICE_REDIS_RATE_LIMITER_HPP
