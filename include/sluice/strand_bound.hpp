// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_STRAND_BOUND_HPP
#define SLUICE_STRAND_BOUND_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/strand_hop.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

/// A permit of a limit that lives on a strand (`strand_bound<L>::scoped_acquire`):
/// move-only; its release is posted to the limit's strand, so it may be
/// dropped on any thread.
///
/// `P` is the limit's own permit (`semaphore::permit`, `lock::guard`,
/// `keyed_semaphore<K>::permit`, `adaptive_limit::permit`, ...). `get()` gives
/// read access to it for members that only read the permit itself (`key()` of
/// a keyed permit); a member that touches the limit (`adaptive_limit`'s
/// outcome reports) goes through `release_with(f)`, or `succeeded()`,
/// `throttled()`, `dropped()` where `P` has them.
///
/// Lifetimes: the `strand_bound` must outlive its permits, and the strand's
/// loop must still run when the last one is dropped (a release posted to a
/// loop that never runs it again is destroyed with the loop, where it releases
/// as the loop shuts down).
template <class P>
class strand_permit {
 public:
  /// An empty permit that owns nothing.
  strand_permit() noexcept = default;
  /// Takes over `inner`, a permit of the limit that lives on `strand`. Called
  /// on the strand.
  strand_permit(asio::any_io_executor strand, P inner) noexcept
      : strand_(std::move(strand)), inner_(std::move(inner)) {}
  /// Takes over `other`'s ownership; `other` is left empty.
  strand_permit(strand_permit&& other) noexcept
      : strand_(other.strand_), inner_(std::move(other.inner_)) {}
  /// Releases what this owns (posted), then takes over `other`'s ownership.
  strand_permit& operator=(strand_permit&& other) noexcept {
    if (this != &other) {
      reset();
      strand_ = other.strand_;
      inner_ = std::move(other.inner_);
    }
    return *this;
  }
  ~strand_permit() { reset(); }

  /// True while it owns a permit.
  explicit operator bool() const noexcept { return static_cast<bool>(inner_); }

  /// Releases the permit now, from any thread: the release is posted to the
  /// limit's strand (no-op when empty).
  void reset() noexcept {
    if (!inner_) return;
    asio::post(strand_, [p = std::move(inner_)]() mutable { P dropped(std::move(p)); });
  }

  /// Runs `f(P&)` on the limit's strand with the permit, then releases it
  /// there: for the members of `P` that touch the limit. Posted; returns at
  /// once (no-op when empty). What `f` throws is thrown on the strand, out of
  /// the `run()` of the thread that runs it.
  template <class F>
  requires std::invocable<F&, P&>
  void release_with(F f) {
    if (!inner_) return;
    asio::post(strand_, [p = std::move(inner_), f = std::move(f)]() mutable {
      P last(std::move(p));
      f(last);
    });
  }

  /// `adaptive_limit::permit`: reports the call's outcome on the limit's
  /// strand and releases (the latency it feeds the algorithm runs from the
  /// grant on the strand to this report there, so it includes the hop).
  void succeeded() requires requires(P& p) { p.succeeded(); }
  {
    release_with([](P& p) { p.succeeded(); });
  }
  /// As `succeeded()`, for a throttle.
  void throttled() requires requires(P& p) { p.throttled(); }
  {
    release_with([](P& p) { p.throttled(); });
  }
  /// As `succeeded()`, for a timeout or a drop.
  void dropped() requires requires(P& p) { p.dropped(); }
  {
    release_with([](P& p) { p.dropped(); });
  }

  /// The limit's own permit, for reading it (see the class comment).
  [[nodiscard]] const P& get() const noexcept { return inner_; }

 private:
  asio::any_io_executor strand_;
  P inner_;
};

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
/// `throw_if_cancelled`) and takes nothing; with `throw_if_cancelled(false)`
/// it calls, and that call ignores the earlier cancellation, as for `L`.
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
/// Lifetimes: the `strand_bound` must outlive every call and every permit; its
/// destruction destroys `L` on the destroying thread (no call may be running).
/// Arguments are copied into the call. A caller's loop may die first (an
/// `io_context` of its own, destroyed while its call waits on the limit's
/// strand): the caller's frame is destroyed with that loop, the wait on the
/// strand is cancelled, and a grant made for it meanwhile is passed on as for
/// a cancelled caller; nothing is posted into the dead loop.
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

 public:
  /// The limit's type.
  using limit_type = L;

  /// Builds the limit on `strand`: `L{strand, args...}` if `L` takes an
  /// executor first, else `L{args...}`.
  template <class Executor, class... Args>
  requires(asio::execution::is_executor<Executor>::value ||
           asio::is_executor<Executor>::value) explicit strand_bound(const Executor& strand,
                                                                     Args&&... args)
      : strand_(strand), limit_(make_limit(strand_, std::forward<Args>(args)...)) {}

  strand_bound(const strand_bound&) = delete;
  strand_bound& operator=(const strand_bound&) = delete;

  /// The strand the limit lives on.
  [[nodiscard]] const asio::any_io_executor& get_executor() const noexcept { return strand_; }

  /// `L::acquire(args...)` on the strand. Throws what it throws, and
  /// `system_error(operation_aborted)` when cancelled (see the class comment).
  template <class... Args>
  requires requires(L& l, Args... a) {
    { l.acquire(a...) } -> std::same_as<asio::awaitable<void>>;
  }
  [[nodiscard]] asio::awaitable<void> acquire(Args... args) {
    auto make = [this, args...] {
      return limit_.acquire(args...);
    };
    auto pass_on = [this, args...] {
      give_back(args...);
    };
    if constexpr (requires(L & l) {
                    { l.try_acquire(args...) } -> std::same_as<bool>;
                  }) {
      // The free case costs no coroutine on the strand: L's own acquire()
      // takes that path first too (no barging: it fails while others wait).
      auto fast = [this, args...] {
        return limit_.try_acquire(args...);
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
    using permit = strand_permit<task_result_t<decltype(limit_.scoped_acquire(args...))>>;
    auto make = [this, args...] {
      return wrap_permit(strand_, limit_.scoped_acquire(args...));
    };
    return call<permit>(std::move(make), [](permit) {});
  }

  /// `L::try_acquire(args...)` made on the strand: `bool`, or an optional
  /// `strand_permit` when `L` returns an optional permit (keyed_semaphore).
  template <class... Args>
  requires requires(L& l, Args... a) { l.try_acquire(a...); }
  [[nodiscard]] auto try_acquire(Args... args) {
    using inner = decltype(limit_.try_acquire(args...));
    if constexpr (std::is_same_v<inner, bool>) {
      auto make = [this, args...] {
        return try_on_strand(limit_, args...);
      };
      auto pass_on = [this, args...](bool took) {
        if (took) give_back(args...);
      };
      return call<bool>(std::move(make), std::move(pass_on));
    } else if constexpr (is_optional<inner>::value) {
      using result = std::optional<strand_permit<typename inner::value_type>>;
      auto make = [this, args...] {
        return try_permit_on_strand<result>(strand_, limit_, args...);
      };
      return call<result>(std::move(make), [](result) {});
    } else {  // a permit that is empty when nothing was taken (adaptive_limit)
      using result = strand_permit<inner>;
      auto make = [this, args...] {
        return try_permit_on_strand<result>(strand_, limit_, args...);
      };
      return call<result>(std::move(make), [](result) {});
    }
  }

  /// `L::release(args...)`, posted to the strand; returns at once. What `L`
  /// throws is thrown there (see the class comment).
  template <class... Args>
  requires requires(L& l, Args... a) { l.release(a...); }
  void release(Args... args) {
    asio::post(strand_, [this, args...] { limit_.release(args...); });
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
    using result = task_result_t<decltype(limit_.run(args...))>;
    auto make = [this, ... a = std::move(args)]() mutable {
      return limit_.run(std::move(a)...);
    };
    if constexpr (std::is_void_v<result>) {
      return call<void>(std::move(make), [] {});
    } else {
      return call<result>(std::move(make), [](result) {});
    }
  }

  /// Runs `f(L&)` on the strand and returns its result on the caller's
  /// executor: a consistent reading of several diagnostics, or any member of
  /// `L` that does not wait. `f` is copied into the call.
  template <class F>
  requires std::invocable<F&, L&>
  [[nodiscard]] asio::awaitable<std::invoke_result_t<F&, L&>> visit(F f) {
    using result = std::invoke_result_t<F&, L&>;
    auto make = [this, f = std::move(f)]() mutable {
      return invoke_on_strand<result>(limit_, f);
    };
    if constexpr (std::is_void_v<result>) {
      return call<void>(std::move(make), [] {});
    } else {
      return call<result>(std::move(make), [](result) {});
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
  [[nodiscard]] L& underlying() noexcept { return limit_; }
  /// As above, read-only.
  [[nodiscard]] const L& underlying() const noexcept { return limit_; }

 private:
  // Passes on what acquire(args...) took: release(args...) where L has it;
  // a limit without one (a rate limiter's start) keeps it.
  template <class... Args>
  void give_back(const Args&... args) {
    if constexpr (requires(L & l) { l.release(args...); }) {
      release(args...);
    } else {
      (static_cast<void>(args), ...);
    }
  }

  template <class... Args>
  static L make_limit(const asio::any_io_executor& strand, Args&&... args) {
    if constexpr (std::is_constructible_v<L, const asio::any_io_executor&, Args&&...>) {
      return L(strand, std::forward<Args>(args)...);
    } else {
      return L(std::forward<Args>(args)...);
    }
  }

  template <class P, class A>
  static asio::awaitable<strand_permit<P>> wrap_permit_impl(asio::any_io_executor strand, A a) {
    co_return strand_permit<P>(std::move(strand), co_await std::move(a));
  }
  template <class A>
  static auto wrap_permit(asio::any_io_executor strand, A a) {
    return wrap_permit_impl<task_result_t<A>>(std::move(strand), std::move(a));
  }

  template <class... Args>
  static asio::awaitable<bool> try_on_strand(L& l, Args... args) {
    co_return l.try_acquire(args...);
  }

  template <class T>
  struct is_optional : std::false_type {};
  template <class T>
  struct is_optional<std::optional<T>> : std::true_type {};

  template <class Result, class... Args>
  static asio::awaitable<Result> try_permit_on_strand(asio::any_io_executor strand, L& l,
                                                      Args... args) {
    auto p = l.try_acquire(args...);
    if constexpr (is_optional<Result>::value) {
      if (!p) co_return std::nullopt;
      co_return Result(std::in_place, std::move(strand), std::move(*p));
    } else {
      if (!p) co_return Result{};
      co_return Result(std::move(strand), std::move(p));
    }
  }

  template <class R, class F>
  static asio::awaitable<R> invoke_on_strand(L& l, F& f) {
    if constexpr (std::is_void_v<R>) {
      f(l);
      co_return;
    } else {
      co_return f(l);
    }
  }

  // Runs make() (an awaitable of L's, made on the strand) for the caller:
  // directly when the caller is on the strand, else through detail::hop. A
  // result granted before a cancellation reached the strand is handed to
  // pass_on() (posted back to the strand) and operation_aborted is thrown.
  template <class R, class Make, class PassOn, class Fast = detail::no_fast_path>
  asio::awaitable<R> call(Make make, PassOn pass_on, Fast fast = {}) {
    const asio::any_io_executor ex = co_await asio::this_coro::executor;
    if (ex == strand_) {
      if constexpr (std::is_void_v<R>) {
        co_await make();
        co_return;
      } else {
        co_return co_await make();
      }
    }
    const auto state = co_await asio::this_coro::cancellation_state;
    const bool cancelled_before = state.cancelled() != asio::cancellation_type::none;
    // Named, not a temporary of the co_await expression (g++ 12). A copy of
    // pass_on hands on a grant whose caller's loop died meanwhile.
    auto hop = detail::hop<R>(strand_, std::move(make), pass_on, std::move(fast));
    if constexpr (std::is_void_v<R>) {
      co_await std::move(hop);
      if (!cancelled_before && state.cancelled() != asio::cancellation_type::none) {
        pass_on();
        throw system_error(asio::error::operation_aborted, "sluice::strand_bound");
      }
    } else {
      R r = co_await std::move(hop);
      if (!cancelled_before && state.cancelled() != asio::cancellation_type::none) {
        pass_on(std::move(r));
        throw system_error(asio::error::operation_aborted, "sluice::strand_bound");
      }
      co_return std::move(r);
    }
  }

  asio::any_io_executor strand_;
  L limit_;
};

}  // namespace sluice

#endif  // SLUICE_STRAND_BOUND_HPP
