// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SINGLE_FLIGHT_HPP
#define SLUICE_SINGLE_FLIGHT_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/waiter_list.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace sluice {

/// Concurrent callers with one key share one execution (Go's
/// `x/sync/singleflight`; pynenc's registration concurrency): the first
/// `run(key, fn)` of a key starts `fn()`, every `run` of that key made while it
/// runs joins it, and each of them gets a copy of its result, or its
/// exception. Nothing is cached: a `run` after the execution ended starts a
/// new one.
///
/// Who runs and who awaits the shared work. `fn()` is called once, by the
/// first caller, at once; the awaitable it returns runs as a coroutine of its
/// own on the first caller's executor, owned by the flight (the shared state
/// of the key) rather than by any one caller, because any caller, the first
/// included, may leave early. Every caller waits on the flight, and the
/// callers together await the work:
/// - when the work ends, every caller still waiting is resumed (through a
///   post to its own executor) with the outcome;
/// - a caller that is cancelled while others still wait leaves at once with
///   `operation_aborted`; the work goes on for the others, untouched, even
///   when the caller that left is the one that started it;
/// - the last caller to leave by cancellation cancels the work (terminal
///   cancellation) and then waits, ignoring further cancellation, until it
///   has finished; only then does it throw `operation_aborted`.
/// So the work is always awaited by some caller: it never outlives the last
/// `run` call that joined it, and once every `run` has returned nothing of it
/// is left running. A caller whose cancellation was requested before it
/// called starts nothing and joins nothing.
///
/// Lifetimes: the work may outlive the caller that started it (when that
/// caller is cancelled while others wait). The first caller's `fn` is moved
/// into the flight before it is called and kept until the work has finished,
/// so a capturing coroutine lambda (`[id]() -> asio::awaitable<profile> {...}`)
/// may use its captures throughout. What `fn` or its awaitable borrows by
/// reference must outlive every caller of the key: capture and take coroutine
/// parameters by value (as `fetch_profile(std::string id)` does), not by
/// reference into the first caller's frame. The `single_flight` must outlive
/// every `run` call.
///
/// After the last caller left by cancellation, the cancelled work is no
/// longer joinable: a new `run` of the key starts a new execution, which may
/// overlap the cancelled one while it winds down. `in_flight()` counts the
/// joinable executions only.
///
/// g++ 12 miscompiles a closure that owns a non-trivial member (a captured
/// `std::string`) when it is passed as a temporary inside a `co_await`
/// expression (`co_await f.run(k, [id] {...})`): name the closure first, or
/// capture by reference.
///
/// Requirements: `fn()` returns `asio::awaitable<T>`; `T` is `void` or copy
/// constructible. Loop-affine, not thread-safe: every caller of one
/// `single_flight` runs on one loop (debug builds abort otherwise, as for the
/// primitives).
///
/// @code
/// sluice::single_flight<std::string, profile> profiles;
/// asio::awaitable<profile> get_profile(std::string id) {
///   // 50 concurrent requests for one id make one call to the backend.
///   auto fetch = [id] { return fetch_profile(id); };   // named: see the g++ 12 note
///   co_return co_await profiles.run(id, fetch);
/// }
/// @endcode
template <class Key, class T, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class single_flight {
  static_assert(std::is_void_v<T> || std::copy_constructible<T>,
                "sluice::single_flight<Key, T>: every caller gets a copy of the result, so T must "
                "be void or copy constructible (share a move-only result through a shared_ptr)");

 public:
  /// A `single_flight` with no execution running.
  single_flight() = default;
  single_flight(const single_flight&) = delete;
  single_flight& operator=(const single_flight&) = delete;

  /// Runs `fn()` for `key`, or joins the execution of `key` already running,
  /// and returns a copy of its result (rethrows its exception).
  ///
  /// Resumes on the caller's executor, through a post, when the shared work
  /// ends. Cancellation: the caller leaves with `operation_aborted`; the work
  /// is cancelled only when its last caller leaves, and that caller returns
  /// only after the work finished. Throws what `fn()` or its work throws, and
  /// `system_error(operation_aborted)` when cancelled.
  template <class Fn>
  requires std::invocable<Fn&> && std::same_as<std::invoke_result_t<Fn&>, asio::awaitable<T>>
  [[nodiscard]] asio::awaitable<T> run(Key key, Fn fn) {
    auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted);
    std::shared_ptr<flight> f = join(key, fn, co_await asio::this_coro::executor);
    ++f->callers;
    std::exception_ptr aborted;
    try {
      // The work ran inline up to its first suspension when this call started
      // it, and may have cancelled this caller there, before the wait below
      // could see it.
      if (state.cancelled() != asio::cancellation_type::none)
        throw system_error(asio::error::operation_aborted, "sluice::single_flight::run");
      co_await wait(*f, true);
    } catch (...) {
      aborted = std::current_exception();
    }
    if (aborted) {
      if (--f->callers == 0 && !f->done) {
        // The last caller leaves: cancel the work and await it, whatever
        // further cancellation arrives meanwhile.
        abandon(*f);
        const bool throwing = co_await asio::this_coro::throw_if_cancelled();
        co_await asio::this_coro::throw_if_cancelled(false);
        co_await wait(*f, false);
        co_await asio::this_coro::throw_if_cancelled(throwing);
      }
      std::rethrow_exception(aborted);
    }
    if (f->error) std::rethrow_exception(f->error);
    if constexpr (!std::is_void_v<T>) co_return *f->value;
  }

  /// Keys whose shared execution is running and can be joined now.
  [[nodiscard]] std::size_t in_flight() const noexcept { return flights_.size(); }

 private:
  static constexpr const char* name = "sluice::single_flight";

  // The shared state of one execution. Held by the running work and by every
  // caller that joined it. Invariants: `owner` is non-null exactly while the
  // flight is the joinable one of its key in owner->flights_; `done` is set
  // once, when the work's coroutine has finished, and then `waiters` is empty
  // for good (a later wait completes at once).
  struct flight {
    flight(single_flight* o, const Key& k) : owner(o), key(k) {}
    ~flight() { detail::abort_all(waiters); }
    single_flight* owner;
    Key key;
    detail::waiter_list waiters;
    std::size_t callers = 0;  // joined and not left by cancellation
    bool started = false, done = false, abandoned = false;
    asio::cancellation_signal cancel;
    std::conditional_t<std::is_void_v<T>, char, std::optional<T>> value{};
    std::exception_ptr error;
  };

  // The completion handler of the work's coroutine: exposes the flight's
  // cancellation slot itself (no associated executor of its own, so every
  // Asio version emits a cancellation at once rather than through a post).
  struct work_done {
    std::shared_ptr<flight> f;
    using cancellation_slot_type = asio::cancellation_slot;
    cancellation_slot_type get_cancellation_slot() const noexcept { return f->cancel.slot(); }
    void operator()(std::exception_ptr e) const {
      if (e && !f->error) f->error = e;  // the machinery failed; work exceptions are caught
      f->done = true;
      if (f->owner) f->owner->unregister(*f);
      while (detail::waiter_node* n = f->waiters.pop_front())
        static_cast<detail::wait_op*>(n)->complete(error_code{});
    }
  };

  template <class Fn>
  std::shared_ptr<flight> join(const Key& key, Fn& fn, const asio::any_io_executor& ex) {
    // (fn is moved from only when this call starts the work.)
    affinity_.bind(ex);
    affinity_.check(name);
    if (auto it = flights_.find(key); it != flights_.end()) return it->second;
    // fn moves into the work's own coroutine frame before it is called: the
    // awaitable it returns may point into it (a capturing coroutine lambda),
    // and the work may outlive the caller that started it.
    auto kept = std::make_unique<Fn>(std::move(fn));
    asio::awaitable<T> work = (*kept)();  // if it throws, nothing was registered
    auto f = std::make_shared<flight>(this, key);
    auto it = flights_.emplace(key, f).first;
    try {
      asio::co_spawn(ex, execute(std::move(kept), f, std::move(work)), work_done{f});
    } catch (...) {
      flights_.erase(it);
      f->owner = nullptr;
      throw;
    }
    return f;
  }

  // `kept` is the fn whose call made `work`; declared first, it is destroyed
  // after `work` (its frame may point into it).
  template <class Fn>
  static asio::awaitable<void> execute([[maybe_unused]] std::unique_ptr<Fn> kept,
                                       std::shared_ptr<flight> f, asio::awaitable<T> work) {
    f->started = true;
    if (f->abandoned) {  // every caller left before it began
      auto never_started = std::move(work);
      co_return;
    }
    try {
      if constexpr (std::is_void_v<T>) {
        co_await std::move(work);
      } else {
        f->value.emplace(co_await std::move(work));
      }
    } catch (...) {
      f->error = std::current_exception();
    }
  }

  // Waits for the work to end: void(error_code); operation_aborted only if
  // `cancellable` and the caller is cancelled first.
  static asio::awaitable<void> wait(flight& f, bool cancellable) {
    // Named, not a temporary of the co_await expression (g++ 12).
    auto initiation = [&f, cancellable](auto&& handler) {
      detail::start_wait<detail::wait_op, detail::deliver_nothing>(
          std::forward<decltype(handler)>(handler), asio::any_io_executor{}, name, f.waiters,
          f.done, cancellable);
    };
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(error_code)>(
        std::move(initiation), asio::use_awaitable);
  }

  // The last caller left: the flight stops being joinable and its work is
  // cancelled (at its start, if it has not begun yet).
  void abandon(flight& f) {
    f.abandoned = true;
    if (f.owner) unregister(f);
    if (f.started) f.cancel.emit(asio::cancellation_type::terminal);
  }

  void unregister(flight& f) {
    flights_.erase(f.key);
    f.owner = nullptr;
  }

  std::unordered_map<Key, std::shared_ptr<flight>, Hash, KeyEqual> flights_;
  [[no_unique_address]] detail::affinity affinity_;
};

}  // namespace sluice

#endif  // SLUICE_SINGLE_FLIGHT_HPP
