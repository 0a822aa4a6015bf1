// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_STREAM_HPP
#define SLUICE_STREAM_HPP

#include <sluice/config.hpp>
#include <sluice/detail/stream_core.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

/// `SLUICE_STREAM_CHECKS`: 1 to have `~stream` write one line to stderr when a
/// stream is destroyed while its tasks still run (see `sluice::stream`).
/// Defaults to 1 when `NDEBUG` is not defined, 0 otherwise.
#if !defined(SLUICE_STREAM_CHECKS)
#if defined(NDEBUG)
#define SLUICE_STREAM_CHECKS 0
#else
#define SLUICE_STREAM_CHECKS 1
#endif
#endif

namespace sluice {

template <class T, class Executor = asio::any_io_executor>
class stream;

namespace detail {
// Lets the fan-out functions make a stream from its shared state.
struct stream_access {
  template <class T, class Executor>
  static stream<T, Executor> make(std::shared_ptr<stream_core<T, Executor>> core) {
    return stream<T, Executor>(std::move(core));
  }
  // A result already waiting, without suspending (sluice::for_each).
  template <class T, class Executor>
  [[gnu::always_inline]] static bool try_take(stream<T, Executor>& s, std::optional<T>& out) {
    return s.core_ && s.core_->try_take(out);
  }
  // The consumer that takes results from the workers while next() waits
  // (sluice::for_each's synchronous body); null: none.
  template <class T, class Executor>
  using sink = typename stream_core<T, Executor>::sink;
  template <class T, class Executor>
  static void set_sink(stream<T, Executor>& s, sink<T, Executor>* k) noexcept {
    if (s.core_) s.core_->set_sink(k);
  }
  // Stops the stream, waits for every task, closes an owned input, puts the
  // caller's throw_if_cancelled back to `was`, then throws `error` or the
  // close's own (sluice::for_each's way out).
  template <class T, class Executor>
  static asio::awaitable<void, Executor> close_then_rethrow(stream<T, Executor>& s,
                                                            std::exception_ptr error, bool was) {
    return stream_core<T, Executor>::close_then_rethrow(s.core_, std::move(error), was);
  }
};
}  // namespace detail

/// The results of a running fan-out (`sluice::map_unordered`,
/// `sluice::as_completed`), read one at a time, in completion order.
///
/// A stream is lazy and bounded: nothing starts before the first `next()`,
/// and at most `limit` inputs are taken and not yet read, counting tasks that
/// run and results that finished but were not handed out yet. A result is read
/// when `next()` returns it: its slot goes to the next input at once, so the
/// next task runs while the consumer works on the result. Tasks keep running
/// while the consumer is busy, but no new input is pulled while `limit`
/// results wait unread. It is itself an asynchronous source, so stages chain.
///
/// Move-only; one consumer at a time. Loop-affine: use it from the thread (or
/// strand) that runs its consumer; its tasks run on the executor of the
/// coroutine that first calls `next()`.
///
/// Lifetimes — the hazard: a destructor cannot wait. Destroying a stream whose
/// tasks still run requests their cancellation (terminal), drops unread
/// results and returns at once; the tasks wind down later on the loop. If the
/// mapping function uses anything of the consumer's frame (a `[&]` lambda, a
/// local `sluice::semaphore`), those tasks resume after it was destroyed: a
/// use-after-free. Leaving a `while (co_await s.next())` loop by `break`, by an
/// exception or by a cancellation does exactly that. Consume a stream with
/// `sluice::for_each(std::move(s), body)`, which closes the stream and waits
/// for every task on every way out, or `co_await s.close()` before the stream
/// goes out of scope. Debug builds (`SLUICE_STREAM_CHECKS`) write one line to
/// stderr when a stream is destroyed with tasks still running. The stream's
/// own state is shared with its tasks, so sluice itself never dangles.
///
/// @code
/// co_await sluice::for_each(sluice::map_unordered(fetch, urls, 8), [&](page p) {
///   index(p);  // in completion order; at most 8 fetches in flight
/// });          // every fetch has finished here, on every way out
/// @endcode
template <class T, class Executor>
class stream {
  static_assert(!std::is_reference_v<T> && !std::is_void_v<T>,
                "sluice::stream<T>: T must be an object type (void tasks yield std::monostate)");

 public:
  /// The element type: the tasks' result (`std::monostate` for void tasks).
  using value_type = T;
  /// The executor the stream's tasks run on.
  using executor_type = Executor;

  /// An empty stream: `next()` yields nothing.
  stream() noexcept = default;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  /// The moved-from stream is empty.
  stream(stream&& other) noexcept : core_(std::move(other.core_)) {}
  /// Abandons this stream's own fan-out (as the destructor does), then takes
  /// over `other`'s.
  stream& operator=(stream&& other) noexcept {
    if (this != &other) {
      abandon();
      core_ = std::move(other.core_);
    }
    return *this;
  }
  /// Requests cancellation of the running tasks and drops unread results,
  /// without waiting for them (see the class comment: use `sluice::for_each`
  /// or `co_await close()` first). With `SLUICE_STREAM_CHECKS`, writes one
  /// line to stderr if tasks were still running.
  ~stream() {
#if SLUICE_STREAM_CHECKS
    if (core_ && core_->busy())
      std::fputs(
          "sluice: a stream was destroyed while its tasks still run; they are cancelled but "
          "not awaited and may use freed locals: consume it with sluice::for_each(std::move(s), "
          "body) or co_await s.close() before it goes out of scope\n",
          stderr);
#endif
    abandon();
  }

  /// The next result, in completion order, or an empty optional once every
  /// input was processed (or the stream was closed or has failed).
  ///
  /// Resumes on the awaiting coroutine's executor; when a result is already
  /// waiting it returns without suspending.
  ///
  /// Throws: the first failure (first in time) of a task or of the input,
  /// once; see `sluice::map_unordered` for which results come before it.
  /// Then `next()` yields nothing. `std::logic_error` if another `next()` on
  /// this stream is still waiting.
  ///
  /// Per-Operation Cancellation: terminal cancellation of the awaiting
  /// coroutine while it waits closes the stream: the running tasks are
  /// cancelled, `next()` waits until all of them have finished and then throws
  /// `system_error` with `asio::error::operation_aborted`. Later calls
  /// yield nothing (or a task's failure that came first). A caller whose
  /// cancellation was requested before the call (with `throw_if_cancelled`
  /// on, Asio throws at the `co_await` itself) gets a result already waiting;
  /// with none ready, the stream is closed the same way before it throws; a
  /// stream that has already ended gives it the end (or a failure not yet
  /// reported) instead: there is nothing left to abort.
  ///
  /// Before `next()` reports a failure or a cancellation, an owned
  /// asynchronous source that has `close()` (an upstream stage) is closed and
  /// waited for, so nothing of the pipeline runs on after it.
  ///
  /// Lifetimes: the call keeps the stream's state alive by itself; one made
  /// before the stream was destroyed and awaited after yields nothing.
  [[nodiscard]] asio::awaitable<std::optional<T>, Executor> next() {
    // Without a core (moved from): a call that yields nothing.
    return core_type::next(typename core_type::next_ref(core_.get()));
  }

  /// Stops the stream and waits: no more input is pulled, running tasks are
  /// cancelled (terminal), unread results and a failure not yet reported are
  /// dropped, and the call returns once every task has finished. An owned
  /// asynchronous source that has `close()` is closed too. Afterwards `next()`
  /// yields nothing.
  ///
  /// The stop happens when `close()` is called; the wait when it is awaited.
  ///
  /// Per-Operation Cancellation: cancelling the caller while it waits still
  /// waits for every task, then throws `operation_aborted`. A caller whose
  /// cancellation was requested earlier and that turned `throw_if_cancelled`
  /// off gets the full wait and a normal return. (With `throw_if_cancelled`
  /// on, Asio throws at the `co_await` before anything can wait: the tasks are
  /// cancelled but not awaited. `sluice::for_each` turns it off for you.)
  [[nodiscard]] asio::awaitable<void, Executor> close() {
    if (core_) core_->abandon();
    return core_type::close(core_);  // without a core: returns at once
  }

  /// Tasks running now (diagnostics).
  [[nodiscard]] std::size_t running() const noexcept {
    return core_ ? core_->running() : 0;
  }
  /// Results finished and not read yet (diagnostics).
  [[nodiscard]] std::size_t ready() const noexcept {
    return core_ ? core_->ready() : 0;
  }

 private:
  friend struct detail::stream_access;
  using core_type = detail::stream_core<T, Executor>;

  explicit stream(std::shared_ptr<core_type> core) noexcept : core_(std::move(core)) {}

  void abandon() noexcept {
    if (core_) core_type::release(std::exchange(core_, nullptr));
  }

  std::shared_ptr<core_type> core_;
};

}  // namespace sluice

#endif  // SLUICE_STREAM_HPP
