// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_STRAND_BOUND_HPP
#define SLUICE_STRAND_BOUND_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/strand_calls.hpp>
#include <sluice/detail/strand_hop.hpp>
#include <sluice/detail/strand_permit.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

/// Makes a loop-affine limit `L` callable from any thread or strand: the limit
/// lives on a strand of its own, and every call goes there. It is how the
/// sessions of a multi-threaded server (one `io_context` run by N threads,
/// each session on its own strand) share one rate limit, one per-user limit
/// and one single-flight table. Works for `semaphore`, `bounded_semaphore`,
/// `lock`, `keyed_semaphore`, `rate_limiter`, `token_bucket`,
/// `keyed_rate_limiter`, `single_flight`, `adaptive_limit` and any type with
/// the same shapes of members (an adapter over the loop-affine cores, not a
/// second copy of their logic; `shared_semaphore` is the lock-free
/// alternative for a plain count).
///
/// Construction: `strand_bound<L> b{strand, args...}` builds `L{strand,
/// args...}` when `L` takes an executor first, else `L{args...}`. The strand
/// must serialise what it runs: an `asio::strand` (`asio::make_strand(ctx)`),
/// or the executor of an `io_context` that one thread runs.
///
/// Members: those of `L` that exist, with `L`'s arguments.
/// - `acquire(args...)`, `scoped_acquire(args...)`, `run(args...)`: awaitables
///   that hop to the strand, wait there with `L`'s semantics (FIFO, keys,
///   windows), and resume the caller on its own executor.
///   `scoped_acquire` returns a `strand_permit` whose release is posted back.
/// - `try_acquire(args...)`: the same attempt as `L`'s, made on the strand,
///   so it is an awaitable too (it suspends for the hops, never for the limit).
/// - `release(args...)`: posted to the strand; returns at once.
/// - diagnostics (`value`, `waiters`, `max_waiters`, `locked`, `keys`,
///   `in_flight`, `limit`, `stats`): awaitables that read on the strand, so
///   each result is one consistent reading of the limit.
/// - `visit(f)`: runs `f(L&)` on the strand and returns its result: any other
///   member of `L`, or several readings taken at one instant.
/// - `weighted(n)` (rate limiters): n units as a budget of
///   `sluice::acquire_all`, which takes a `strand_bound` of a `semaphore`,
///   `bounded_semaphore`, `adaptive_limit`, `rate_limiter` or `token_bucket`.
///
/// What resumes where, and the cost. A caller already on the limit's strand
/// calls `L` directly (no hop). Any other caller makes two hops per call: the
/// call is posted to the strand, and the caller's completion is posted back to
/// its own executor; the wait in between is `L`'s own (its grant is a post on
/// the strand, as for the bare `L`). The caller's loop counts the call as
/// outstanding work until it resumes. Releases are one post each. The debug
/// affinity check of `L` stays quiet: `L` is only ever touched on the strand.
///
/// Per-Operation Cancellation: the caller's cancellation (terminal, partial,
/// total) is forwarded to the strand and reaches `L`'s wait there, with `L`'s
/// atomicity: the wait is removed (the caller throws `operation_aborted`,
/// holding nothing) or was granted. A grant made on the strand before the
/// cancellation got there is passed on when the caller resumes cancelled: the
/// caller throws `operation_aborted`, a `strand_permit` is released, an
/// `acquire(args...)` of a limit with `release(args...)` is released, and a
/// `try_acquire` that took a permit gives it back. Limits with nothing to give
/// back keep what was taken: a start of a `rate_limiter` / `token_bucket` /
/// `keyed_rate_limiter` granted before the cancellation arrived stays counted
/// (the window never admits more than its quota; at worst one start goes
/// unused), and `run`'s result is dropped. A caller whose cancellation was
/// requested before it called throws at the `co_await` (Asio's
/// `throw_if_cancelled`); with `throw_if_cancelled(false)` every member that
/// waits or takes (`acquire`, `scoped_acquire`, `try_acquire`, `run`) throws
/// `operation_aborted` at once, before any hop, taking nothing; `visit` and
/// the diagnostics still read.
///
/// `single_flight`: `fn()` is called on the limit's strand, by the first
/// caller's call there (while that caller waits), and the shared work runs as
/// a coroutine on the limit's strand; every caller resumes on its own
/// executor. The same holds for `adaptive_limit::run(fn)`: `fn()` and its
/// work run on the limit's strand (its outcome is reported there); a
/// `scoped_acquire()` permit reports through `strand_permit::succeeded()` etc.
/// So the work's own completions (its I/O) are serialised with the limit's
/// other calls: keep CPU-heavy work off it (`sluice::to_thread`), give each
/// `single_flight` a strand of its own (examples/http_gateway.cpp shards one
/// per thread), and take `fn`'s captures by value (the work may outlive the
/// first caller, as `single_flight` says).
///
/// Throws: what `L` throws, at the awaiting caller (`std::invalid_argument`
/// for a bad `n`, `std::logic_error` for a `try_acquire` misuse, ...). A
/// `release(args...)` that `L` rejects (`std::logic_error`: a key not held, an
/// over-release) throws on the strand, out of the `run()` of the thread that
/// runs it, as any Asio handler that throws does: a programming error, loud.
///
/// Lifetimes: the `strand_bound` should outlive every call and every permit;
/// its destruction destroys `L` on the destroying thread (no call may be
/// running then), which ends `L`'s waits with `operation_aborted`. Destroyed
/// first anyway (an `io_context` declared before it, with calls pending),
/// nothing dangles: everything it posted or handed to a call reaches `L`
/// through a weak reference, so a grant handed on afterwards, a `release`
/// posted earlier and a `strand_permit` dropped later do nothing, and a call
/// that reaches the strand afterwards throws `operation_aborted`.
/// Arguments are copied into the call. A caller's loop may die first (an
/// `io_context` of its own, destroyed while its call waits on the limit's
/// strand): the caller's frame is destroyed with that loop, the wait on the
/// strand is cancelled, and a grant made for it meanwhile is passed on as for
/// a cancelled caller; nothing is posted into the dead loop. The limit's loop
/// may die first too, when `L` runs on the executor of an `io_context` of its
/// own (an `asio::strand` must not outlive its context): callers from other
/// loops whose calls were queued or waiting there resume on their own loops
/// with `operation_aborted`, holding nothing.
///
/// @code
/// asio::io_context ctx;                                     // run by 4 threads
/// sluice::strand_bound<sluice::rate_limiter> rps{asio::make_strand(ctx), 1000, 1s};
/// sluice::strand_bound<sluice::keyed_semaphore<std::string>> per_user{asio::make_strand(ctx), 2};
/// // in each session, on the session's own strand:
/// co_await rps.acquire();                                   // the global rate
/// auto p = co_await per_user.scoped_acquire(user);          // 2 per user; released when p dies
/// auto n = co_await per_user.waiters(user);                 // read on the limit's strand
/// @endcode
template <class L>
class strand_bound {
  // L, made dependent on a member template's parameters (a member named in
  // a trailing return type is looked up only when that member is used).
  template <class T, class...>
  struct dependent {
    using type = T;
  };
  template <class T, class... A>
  using dependent_t = typename dependent<T, A...>::type;
  using state = detail::strand_state<L>;

 public:
  /// The limit's type.
  using limit_type = L;

  /// Builds the limit on `strand`: `L{strand, args...}` if `L` takes an
  /// executor first, else `L{args...}`.
  template <class Executor, class... Args>
  requires(asio::execution::is_executor<Executor>::value ||
           asio::is_executor<Executor>::value) explicit strand_bound(const Executor& strand,
                                                                     Args&&... args)
      : s_(std::make_shared<state>(asio::any_io_executor(strand), std::forward<Args>(args)...)) {}

  strand_bound(const strand_bound&) = delete;
  strand_bound& operator=(const strand_bound&) = delete;

  /// The strand the limit lives on.
  [[nodiscard]] const asio::any_io_executor& get_executor() const noexcept { return s_->strand; }

  /// `L::acquire(args...)` on the strand. Throws what it throws, and
  /// `system_error(operation_aborted)` when cancelled (see the class comment).
  template <class... Args>
  requires requires(L& l, Args... a) {
    { l.acquire(a...) } -> std::same_as<asio::awaitable<void>>;
  }
  [[nodiscard]] asio::awaitable<void> acquire(Args... args) {
    auto make = [w = weak(), args...] {
      return detail::lock_state(w)->limit.acquire(args...);
    };
    auto pass_on = [w = weak(), args...] {
      give_back(w, args...);
    };
    if constexpr (requires(L & l) {
                    { l.try_acquire(args...) } -> std::same_as<bool>;
                  }) {
      // The free case costs no coroutine on the strand: L's own acquire()
      // takes that path first too (no barging: it fails while others wait).
      auto fast = [w = weak(), args...] {
        return detail::lock_state(w)->limit.try_acquire(args...);
      };
      return call<void>(std::move(make), std::move(pass_on), std::move(fast));
    } else {
      return call<void>(std::move(make), std::move(pass_on));
    }
  }

  /// `L::scoped_acquire(args...)` on the strand; the permit's release is
  /// posted back to the strand.
  template <class... Args>
  requires requires(L& l, Args... a) {
    { l.scoped_acquire(a...) } -> task;
  }
  [[nodiscard]] auto scoped_acquire(Args... args) -> asio::awaitable<strand_permit<
      task_result_t<decltype(std::declval<dependent_t<L, Args...>&>().scoped_acquire(args...))>>> {
    using permit = strand_permit<task_result_t<decltype(s_->limit.scoped_acquire(args...))>>;
    auto make = [w = weak(), args...] {
      auto s = detail::lock_state(w);
      return detail::wrap_permit(s->strand, w, s->limit.scoped_acquire(args...));
    };
    return call<permit>(std::move(make), [](permit) {});
  }

  /// `L::try_acquire(args...)` made on the strand: `bool`, or an optional
  /// `strand_permit` when `L` returns an optional permit (keyed_semaphore).
  template <class... Args>
  requires requires(L& l, Args... a) { l.try_acquire(a...); }
  [[nodiscard]] auto try_acquire(Args... args) {
    using inner = decltype(s_->limit.try_acquire(args...));
    if constexpr (std::is_same_v<inner, bool>) {
      auto make = [w = weak(), args...] {
        return detail::try_on_strand(detail::lock_state(w)->limit, args...);
      };
      auto pass_on = [w = weak(), args...](bool took) {
        if (took) give_back(w, args...);
      };
      return call<bool>(std::move(make), std::move(pass_on));
    } else {
      // an optional permit, or a permit that is empty when nothing was taken
      using result = typename detail::strand_try_result<inner>::type;
      auto make = [w = weak(), args...] {
        auto s = detail::lock_state(w);
        return detail::try_permit_on_strand<result>(s->strand, w, s->limit, args...);
      };
      return call<result>(std::move(make), [](result) {});
    }
  }

  /// `L::release(args...)`, posted to the strand; returns at once. What `L`
  /// throws is thrown there (see the class comment).
  template <class... Args>
  requires requires(L& l, Args... a) { l.release(a...); }
  void release(Args... args) { post_release(weak(), args...); }

  /// `n` units of a `strand_bound<rate_limiter>` / `<token_bucket>` as a
  /// budget of `sluice::acquire_all` (`tpm.weighted(tokens)`). Throws
  /// `std::invalid_argument` for an `n` the limiter could never grant.
  template <class T = L>
  requires requires(T& l, std::size_t n) { l.weighted(n); }
  [[nodiscard]] detail::strand_units<T> weighted(std::size_t n) {
    static_cast<void>(s_->limit.weighted(n));  // checks n against the quota only
    return {this, n};
  }

  /// `L::run(args...)` on the strand (`single_flight::run(key, fn)`: see the
  /// class comment for where `fn` runs); returns its result on the caller's
  /// executor.
  template <class... Args>
  requires requires(L& l, Args... a) {
    { l.run(a...) } -> task;
  }
  [[nodiscard]] auto run(Args... args) -> asio::awaitable<
      task_result_t<decltype(std::declval<dependent_t<L, Args...>&>().run(args...))>> {
    using result = task_result_t<decltype(s_->limit.run(args...))>;
    auto make = [w = weak(), ... a = std::move(args)]() mutable {
      return detail::lock_state(w)->limit.run(std::move(a)...);
    };
    if constexpr (std::is_void_v<result>) {
      return call<void>(std::move(make), [] {});
    } else {
      return call<result>(std::move(make), [](result) {});
    }
  }

  /// Runs `f(L&)` on the strand and returns its result on the caller's
  /// executor: a consistent reading of several diagnostics, or any member of
  /// `L` that does not wait. `f` is copied into the call. Unlike the waits,
  /// it runs for a caller whose cancellation was requested before it called.
  template <class F>
  requires std::invocable<F&, L&>
  [[nodiscard]] asio::awaitable<std::invoke_result_t<F&, L&>> visit(F f) {
    using result = std::invoke_result_t<F&, L&>;
    auto make = [w = weak(), f = std::move(f)]() mutable {
      return detail::invoke_on_strand<result>(detail::lock_state(w)->limit, f);
    };
    if constexpr (std::is_void_v<result>) {
      return call<void>(
          std::move(make), [] {}, detail::no_fast_path{}, false);
    } else {
      return call<result>(
          std::move(make), [](result) {}, detail::no_fast_path{}, false);
    }
  }

  /// `L::value(args...)`, read on the strand.
  template <class... Args>
  requires requires(const L& l, Args... a) { l.value(a...); }
  [[nodiscard]] auto value(Args... args) {
    return visit([args...](const L& l) { return l.value(args...); });
  }
  /// `L::waiters(args...)`, read on the strand.
  template <class... Args>
  requires requires(const L& l, Args... a) { l.waiters(a...); }
  [[nodiscard]] auto waiters(Args... args) {
    return visit([args...](const L& l) { return l.waiters(args...); });
  }
  /// `L::max_waiters()`, read on the strand.
  [[nodiscard]] auto max_waiters() requires requires(const L& l) { l.max_waiters(); }
  {
    return visit([](const L& l) { return l.max_waiters(); });
  }
  /// `L::locked()`, read on the strand.
  [[nodiscard]] auto locked() requires requires(const L& l) { l.locked(); }
  {
    return visit([](const L& l) { return l.locked(); });
  }
  /// `L::keys()`, read on the strand.
  [[nodiscard]] auto keys() requires requires(L& l) { l.keys(); }
  {
    return visit([](L& l) { return l.keys(); });
  }
  /// `L::in_flight()`, read on the strand.
  [[nodiscard]] auto in_flight() requires requires(const L& l) { l.in_flight(); }
  {
    return visit([](const L& l) { return l.in_flight(); });
  }
  /// `L::limit()` (`adaptive_limit`), read on the strand.
  [[nodiscard]] auto limit() requires requires(const L& l) { l.limit(); }
  {
    return visit([](const L& l) { return l.limit(); });
  }
  /// `L::stats()`, read on the strand.
  [[nodiscard]] auto stats() requires requires(const L& l) { l.stats(); }
  {
    return visit([](const L& l) { return l.stats(); });
  }

  /// The limit itself, unsynchronised: only on the strand, before any call,
  /// or after every thread left the loop (reading the counts in a test).
  [[nodiscard]] L& underlying() noexcept { return s_->limit; }
  /// As above, read-only.
  [[nodiscard]] const L& underlying() const noexcept { return s_->limit; }

 private:
  friend struct detail::strand_access;

  std::weak_ptr<state> weak() const noexcept { return s_; }

  template <class... Args>
  static void post_release(std::weak_ptr<state> w, const Args&... args) {
    auto s = w.lock();
    if (!s) return;  // the limit is gone, and what it granted with it
    asio::post(s->strand, [w = std::move(w), args...] {
      if (auto l = w.lock()) l->limit.release(args...);
    });
  }

  // Passes on what acquire(args...) took: release(args...) where L has it;
  // a limit without one (a rate limiter's start) keeps it.
  template <class... Args>
  static void give_back(const std::weak_ptr<state>& w, const Args&... args) {
    if constexpr (requires(L & l) { l.release(args...); }) {
      post_release(w, args...);
    } else {
      (static_cast<void>(args), ...);
    }
  }

  // Runs make() (an awaitable of L's, made on the strand) for the caller:
  // directly when the caller is on the strand, else through detail::hop. A
  // result granted before a cancellation reached the strand is handed to
  // pass_on() (posted back to the strand) and operation_aborted is thrown. A
  // wait (`refuse`) refuses a caller cancelled before it called, at once.
  template <class R, class Make, class PassOn, class Fast = detail::no_fast_path>
  asio::awaitable<R> call(Make make, PassOn pass_on, Fast fast = {}, bool refuse = true) {
    const auto cs = co_await asio::this_coro::cancellation_state;
    if (refuse && cs.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted, "sluice::strand_bound");
    const asio::any_io_executor ex = co_await asio::this_coro::executor;
    if (ex == s_->strand) {
      if constexpr (std::is_void_v<R>) {
        co_await make();
        co_return;
      } else {
        co_return co_await make();
      }
    }
    const bool cancelled_before = cs.cancelled() != asio::cancellation_type::none;
    // Named, not a temporary of the co_await expression (g++ 12). A copy of
    // pass_on hands on a grant whose caller's loop died meanwhile.
    auto hop = detail::hop<R>(s_->strand, std::move(make), pass_on, std::move(fast));
    if constexpr (std::is_void_v<R>) {
      co_await std::move(hop);
      if (!cancelled_before && cs.cancelled() != asio::cancellation_type::none) {
        pass_on();
        throw system_error(asio::error::operation_aborted, "sluice::strand_bound");
      }
    } else {
      R r = co_await std::move(hop);
      if (!cancelled_before && cs.cancelled() != asio::cancellation_type::none) {
        pass_on(std::move(r));
        throw system_error(asio::error::operation_aborted, "sluice::strand_bound");
      }
      co_return std::move(r);
    }
  }

  std::shared_ptr<state> s_;
};

}  // namespace sluice

#endif  // SLUICE_STRAND_BOUND_HPP
