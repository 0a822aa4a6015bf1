// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SHED_HPP
#define SLUICE_SHED_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/linger.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/retry.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace sluice {

/// What a `sluice::shed` layer has done, counted since its construction.
struct shed_stats {
  std::uint64_t admitted = 0;      ///< calls that got the limit
  std::uint64_t shed = 0;          ///< calls refused at once, past `max_waiting`
  std::uint64_t shed_waiting = 0;  ///< calls given up after waiting `max_wait`
  std::size_t waiting = 0;         ///< callers waiting for the limit now
};

namespace detail {

// What the layer holds while the inner call runs: the limit's permit, or a
// permit taken by try_acquire() that it gives back by release(), or nothing
// (a rate start is not held).
template <class L, class Permit>
struct shed_hold {
  std::optional<Permit> permit;
  L* manual = nullptr;
  shed_hold() = default;
  shed_hold(shed_hold&& o) noexcept
      : permit(std::move(o.permit)), manual(std::exchange(o.manual, nullptr)) {}
  shed_hold& operator=(shed_hold&&) = delete;
  ~shed_hold() {
    if constexpr (requires(L & l) { l.release(); }) {
      if (manual) manual->release();
    }
  }
};

struct no_permit {};

template <class L>
auto shed_permit_type() {
  if constexpr (requires(L & l) {
                  { l.scoped_acquire() } -> task;
                }) {
    return std::type_identity<task_result_t<decltype(std::declval<L&>().scoped_acquire())>>{};
  } else {
    return std::type_identity<no_permit>{};
  }
}

}  // namespace detail

/// A policy layer that takes one limit for the inner call, with a bound on
/// how many callers may wait for it and for how long (resilience4j's
/// Bulkhead with a max wait, tower's load-shed, Envoy's pending-request
/// breaker). Past the bound a call fails at once with
/// `sluice::overloaded_error`: it is not queued and takes nothing.
///
/// - Any limit kind: one with `scoped_acquire()` (`semaphore`,
///   `shared_semaphore`, `adaptive_limit`, `strand_bound<L>`, the Redis
///   semaphore) is held, as its permit, until the inner call returns; one with
///   only `acquire()` (`rate_limiter`, `token_bucket`, the Redis rate limiter)
///   records its start. A call first tries the limit without waiting
///   (`try_acquire()`, awaited for `strand_bound`): a call the limit grants at
///   once never counts as waiting, so `max_waiting = 0` passes exactly the
///   calls that need no wait. A rate limiter in virtual time must then be
///   built with the executor (its `try_acquire()` reads that clock). A
///   permit taken that way is given back by `release()`: the limit's stats
///   count it as acquired, without a hold time.
/// - The count is the layer's own (an atomic: exact, never a read of the
///   limit's `waiters()`), of the callers that wait through this layer; the
///   limit's other users are not counted. Thread-safe when the limit is.
/// - `max_wait`: a wait that lasts it is cancelled (the limit's own
///   cancellation: nothing taken) and the call fails with `overloaded_error`.
/// - Per-Operation Cancellation: as the limit's wait; a cancelled wait leaves
///   the count. A caller whose cancellation was requested before it called
///   (`throw_if_cancelled(false)`) throws `operation_aborted` at once, taking
///   nothing, even when the limit is free.
/// - `linger`: a call abandoned by a timeout or a cancellation keeps its
///   permit that long after it ended, held by a timer the layer owns
///   (`join()` awaits it); see `sluice::limits_layer` for why, and why the
///   default is zero.
/// - Lifetimes: the limit must outlive the layer.
///
/// @code
/// sluice::shared_semaphore cap{8};
/// auto p = sluice::policy(sluice::shed(cap, {.max_waiting = 64, .retry_after = 2s}));
/// try {
///   co_await p([&] { return call_backend(req); });
/// } catch (const sluice::overloaded_error& e) {
///   reply_429(e.after);
/// }
/// @endcode
template <class L>
class shed_layer {
 public:
  /// The layer over `limit` with bounds `o`.
  shed_layer(L& limit, shed_options o) : limit_(&limit), opt_(o) {}
  /// Copies the limit's address and the options.
  shed_layer(shed_layer&& o) noexcept : limit_(o.limit_), opt_(o.opt_) {}

  /// Takes the limit (or sheds), then awaits `next()` holding it.
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    auto held = co_await enter();
    if (opt_.linger <= clock::duration::zero()) co_return co_await next();
    co_return co_await detail::call_holding(lingering_, opt_.linger, std::move(held), next);
  }

  /// Abandoned calls whose permits linger now.
  [[nodiscard]] std::size_t lingering() const { return lingering_.lingering(); }
  /// Completes when no permit lingers; await it before destroying the layer
  /// or its limit.
  [[nodiscard]] asio::awaitable<void> join() {
    const auto ex = co_await asio::this_coro::executor;  // named: see linger_set::join
    co_await lingering_.join(ex);
  }

  /// The limit this layer takes.
  [[nodiscard]] L& limit() noexcept { return *limit_; }
  /// The bounds.
  [[nodiscard]] const shed_options& options() const noexcept { return opt_; }
  /// Counts since construction (each field read atomically).
  [[nodiscard]] shed_stats stats() const noexcept {
    return {admitted_.load(std::memory_order_relaxed), shed_.load(std::memory_order_relaxed),
            shed_waiting_.load(std::memory_order_relaxed),
            waiting_.load(std::memory_order_relaxed)};
  }

 private:
  using permit_type = typename decltype(detail::shed_permit_type<L>())::type;
  using hold = detail::shed_hold<L, permit_type>;

  // Granted at once, without a wait: true when try_acquire() took it.
  asio::awaitable<bool> try_now() {
    if constexpr (requires(L & l) {
                    { l.try_acquire() } -> std::same_as<bool>;
                  }) {
      co_return limit_->try_acquire();
    } else if constexpr (requires(L & l) {
                           { l.try_acquire() } -> std::same_as<asio::awaitable<bool>>;
                         }) {
      co_return co_await limit_->try_acquire();
    } else {
      co_return false;
    }
  }

  asio::awaitable<hold> wait() {
    hold h;
    if constexpr (std::is_same_v<permit_type, detail::no_permit>) {
      co_await limit_->acquire();
    } else {
      h.permit.emplace(co_await limit_->scoped_acquire());
    }
    co_return h;
  }

  asio::awaitable<hold> enter() {
    // A caller cancelled before it called takes nothing, not even a free
    // permit or rate start (the limit's try_acquire() would not refuse it).
    detail::refuse_if_cancelled(co_await asio::this_coro::cancellation_state, "sluice::shed");
    if (co_await try_now()) {
      admitted_.fetch_add(1, std::memory_order_relaxed);
      hold h;
      if constexpr (!std::is_same_v<permit_type, detail::no_permit> &&
                    requires(L & l) { l.release(); })
        h.manual = limit_;
      co_return h;
    }
    if (waiting_.fetch_add(1, std::memory_order_relaxed) >= opt_.max_waiting) {
      waiting_.fetch_sub(1, std::memory_order_relaxed);
      shed_.fetch_add(1, std::memory_order_relaxed);
      throw overloaded_error(opt_.retry_after);
    }
    struct leave {
      std::atomic<std::size_t>& n;
      ~leave() { n.fetch_sub(1, std::memory_order_relaxed); }
    } guard{waiting_};
    std::optional<hold> h;
    if (opt_.max_wait == clock::duration::max()) {
      h.emplace(co_await wait());
    } else {
      bool timed_out = false;
      try {
        h.emplace(co_await with_timeout(opt_.max_wait, wait()));
      } catch (const timeout_error&) {
        timed_out = true;
      }
      if (timed_out) {
        shed_waiting_.fetch_add(1, std::memory_order_relaxed);
        throw overloaded_error(opt_.retry_after, "waited max_wait");
      }
    }
    admitted_.fetch_add(1, std::memory_order_relaxed);
    co_return std::move(*h);
  }

  L* limit_;
  shed_options opt_;
  std::atomic<std::size_t> waiting_{0};
  std::atomic<std::uint64_t> admitted_{0}, shed_{0}, shed_waiting_{0};
  detail::linger_set lingering_;
};

/// A `shed_layer` over `limit` (see there): `sluice::shed(cap, {.max_waiting = 64})`.
template <class L>
[[nodiscard]] shed_layer<L> shed(L& limit, shed_options o = {}) {
  return shed_layer<L>(limit, o);
}

}  // namespace sluice

#endif  // SLUICE_SHED_HPP
