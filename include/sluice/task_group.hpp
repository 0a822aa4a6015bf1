// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TASK_GROUP_HPP
#define SLUICE_TASK_GROUP_HPP

#include <sluice/config.hpp>
#include <sluice/detail/aborted.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/grace_period.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/detail/nursery.hpp>
#include <sluice/detail/slot_queue.hpp>
#include <sluice/detail/throw_error.hpp>
#include <sluice/progress.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

class task_group;

/// A body for `task_group::run`: called once with the group, it returns the
/// `asio::awaitable<void>` that spawns the children.
template <class F>
concept task_group_body = std::invocable<F&, task_group&> &&
    std::same_as<std::invoke_result_t<F&, task_group&>, asio::awaitable<void>>;

/// A nursery (Trio's): a scope that owns every task spawned into it. No child
/// outlives `run`.
///
/// `task_group::run(body)` calls `body(group)` and runs the awaitable it
/// returns; the body (and any child, through a captured reference to the
/// group) spawns `asio::awaitable<void>` children with `spawn`. Work may be
/// discovered while running: children may spawn more children, also after the
/// body returned. `run` completes only when the body and every child have
/// finished.
///
/// - What runs where: the body and every child run as coroutines of their own
///   on the executor of the coroutine that awaits `run`; no thread, no
///   io_context. A child with a free slot starts at once: Asio's `co_spawn`
///   dispatches, so it runs inside `spawn` up to its first suspension.
/// - `run(limit, body)`: at most `limit` children run at once (the body does not
///   count). Children beyond it wait in FIFO order and are not started (no
///   frame of theirs runs) until a slot frees; the instant a child finishes, the
///   oldest waiting one starts.
/// - Fail fast: the first failure in time (an exception out of the body or of a
///   child) stops the group: waiting children are dropped unstarted, the body
///   and every running child get terminal cancellation, `run` waits until all
///   of them have finished, then rethrows that first exception.
/// - Per-Operation Cancellation: cancelling the caller (terminal, partial or
///   total) stops the group the same way, waits for everything, and throws
///   `system_error(operation_aborted)`. A caller whose cancellation was
///   requested before it called `run` starts nothing (the body is not called)
///   and throws `operation_aborted`. A request made while the body or a child
///   runs inline inside `run` or `spawn` (a child that cancels its caller before
///   its first suspension) stops the group the same way, at once. If the caller
///   is cancelled and a child then fails with an error of its own,
///   `operation_aborted` is reported.
/// - `spawn` after the group began to stop (a failure or a cancellation) does
///   not start the task: its awaitable is destroyed unstarted and `spawn`
///   returns false.
/// - `limit == 0` throws `std::invalid_argument` before anything starts.
///
/// Shutdown from outside: `run(limit, body, stop)` with a `sluice::stop_source`.
/// `stop.request(grace)` makes the group
/// 1. stop accepting: `spawn` and `spawn_when_ready` return false from then
///    on (the task is destroyed unstarted), and producers waiting in
///    `spawn_when_ready` resume with false;
/// 2. drop the children waiting for a slot: they never start;
/// 3. cancel the body at once (terminal): it is the producer, and whatever it
///    would spawn is refused anyway;
/// 4. let the running children finish for `grace` on the executor's clock,
///    then cancel those still running (terminal); `run` returns as soon as
///    all have finished, without an exception. A child failing with an error
///    of its own during the grace fails the group as usual; the
///    `operation_aborted` of what the stop cancelled is not an error.
///
/// Backpressure: `co_await g.spawn_when_ready(task)` waits for a free slot
/// instead of queueing the task, so a producer reading a queue holds at most
/// `limit` jobs in the group, and what it has not taken stays in the queue.
///
/// Progress: `run(limit, body, sluice::progress(report))` (also after `stop`)
/// reports the children (not the body): started, done, failed, in flight,
/// waiting (spawned, not started); `total` is empty. See `sluice::progress`.
///
/// Lifetimes: the group lives until `run` completes. The body object (a
/// lambda and its captures) is kept alive until then too, so children may
/// borrow from its captures and from the caller's frame. The body coroutine's
/// own locals, however, end when the body returns, which may be long before
/// its children finish: children must not borrow them. Do not keep the
/// `task_group&` beyond `run`.
///
/// Loop-affine: call `spawn` from the coroutines of the group (its executor's
/// thread); debug builds check it (`SLUICE_AFFINITY_CHECKS`).
///
/// @code
/// std::set<std::string> seen{root};
/// std::function<asio::awaitable<void>(sluice::task_group&, std::string)> crawl;
/// crawl = [&](sluice::task_group& g, std::string url) -> asio::awaitable<void> {
///   for (auto& link : co_await fetch_links(url))
///     if (seen.insert(link).second) g.spawn(crawl(g, link));   // discovered while running
/// };
/// co_await sluice::task_group::run(8, [&](sluice::task_group& g) -> asio::awaitable<void> {
///   g.spawn(crawl(g, root));
///   co_return;
/// });   // every page crawled, or the first error after everything stopped
/// @endcode
class task_group final : public std::enable_shared_from_this<task_group>,
                         private detail::nursery<task_group>,
                         private detail::stop_listener {
  friend class detail::nursery<task_group>;
  struct key {};
  using hooks_ptr = std::unique_ptr<detail::progress_hooks>;

 public:
  /// Runs `body(group)` and every child it spawns with no bound on how many
  /// run at once; completes when all have finished. See the class comment for
  /// failure and cancellation.
  template <task_group_body Body>
  [[nodiscard]] static asio::awaitable<void> run(Body body) {
    return run_impl(std::numeric_limits<std::size_t>::max(), std::move(body), nullptr, nullptr);
  }

  /// As `run(body)`, with at most `limit` children running at once; the others
  /// wait in FIFO order, unstarted. Throws `std::invalid_argument` at once when
  /// `limit == 0`.
  template <task_group_body Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Body body) {
    detail::check_limit(limit, "sluice::task_group::run");
    return run_impl(limit, std::move(body), nullptr, nullptr);
  }

  /// As `run(limit, body)`, stopped gracefully by `stop.request(grace)` (see
  /// the class comment): no new children, waiting ones dropped, the body
  /// cancelled, running children given `grace`, then cancelled; `run` then
  /// returns normally. If the stop was requested before the call, the body is
  /// not called and `run` returns at once. `stop` must outlive the call.
  template <task_group_body Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Body body, stop_source& stop) {
    detail::check_limit(limit, "sluice::task_group::run");
    return run_impl(limit, std::move(body), &stop, nullptr);
  }

  /// As `run(limit, body)`, with progress reports on the children (see
  /// `sluice::progress`).
  template <task_group_body Body, class F>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Body body, progress<F> report) {
    detail::check_limit(limit, "sluice::task_group::run");
    return run_impl(limit, std::move(body), nullptr,
                    std::make_unique<detail::progress_hooks_for<F>>(std::move(report)));
  }

  /// As `run(limit, body, stop)`, with progress reports on the children.
  template <task_group_body Body, class F>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Body body, stop_source& stop,
                                                 progress<F> report) {
    detail::check_limit(limit, "sluice::task_group::run");
    return run_impl(limit, std::move(body), &stop,
                    std::make_unique<detail::progress_hooks_for<F>>(std::move(report)));
  }

  /// Adds a child. It starts at once (it runs up to its first suspension
  /// before `spawn` returns), or, when `limit` children already run, waits
  /// unstarted in FIFO order for a slot. Returns
  /// true if the child was accepted; false if the group has begun to stop (a
  /// failure or a cancellation), in which case `child` is destroyed unstarted.
  /// After a stop request (`sluice::stop_source`) it returns false too.
  bool spawn(asio::awaitable<void> child) {
    affinity_.check("sluice::task_group");
    if (!accepting()) return false;  // `child` is destroyed unstarted on return
    if (running_ < limit_) {
      start(std::move(child));
    } else {
      waiting_.push(std::move(child));
      if (progress_) progress_->waiting(waiting_.size());
    }
    return true;
  }

  /// Adds a child once a slot is free, instead of queueing it: the producer's
  /// backpressure. Resumes (on the awaiting coroutine's executor) with true
  /// once `child` has started (it ran up to its first suspension), at once if
  /// a slot is free and nobody waits for one; producers waiting here and
  /// children queued by `spawn` are served in FIFO order, queued children
  /// first. Resumes with false, `child` destroyed unstarted, when the group
  /// stops accepting (a stop request, a failure, a cancellation) before
  /// the child started.
  ///
  /// Per-Operation Cancellation (terminal, partial, total): a waiting call is
  /// removed, `child` is destroyed unstarted and `system_error`
  /// (`operation_aborted`) is thrown; a slot that freed meanwhile goes to the
  /// next waiter, nothing is lost. A call whose slot was already granted
  /// returns true (the child runs). A caller whose cancellation was requested
  /// before the call starts nothing and throws `operation_aborted`.
  ///
  /// @code
  /// for (;;) {
  ///   job j = co_await jobs.get();                               // a sluice::queue<job>
  ///   if (!co_await g.spawn_when_ready(run_job(j))) co_return;  // at most `limit` jobs taken
  /// }
  /// @endcode
  template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
  [[nodiscard]] asio::awaitable<bool> spawn_when_ready(asio::awaitable<void> child) {
    affinity_.check("sluice::task_group");
    const auto state = co_await asio::this_coro::cancellation_state;
    if (state.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted, "sluice::task_group::spawn_when_ready");
    if (!accepting()) co_return false;
    if (running_ < limit_ && waiting_.empty()) {
      start(std::move(child));
      co_return true;
    }
    co_return co_await waiting_.producers().template wait<Lazy>(ex_, std::move(child));
  }

  /// Children accepted and not yet finished: running plus waiting for a slot.
  [[nodiscard]] std::size_t size() const noexcept { return running_ + waiting_.size(); }
  /// Children started and not yet finished (at most the limit).
  [[nodiscard]] std::size_t running() const noexcept { return running_; }
  /// The bound on running children (`SIZE_MAX` when unbounded).
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// True once the group has begun to stop (a failure, a cancellation, a
  /// stop request): `spawn` then starts nothing.
  [[nodiscard]] bool stopping() const noexcept { return stopping_ || draining_; }
  /// Producers waiting in `spawn_when_ready`.
  [[nodiscard]] std::size_t producers_waiting() const noexcept {
    return waiting_.producers().size();
  }

  /// Made only by `run`.
  task_group(key, asio::any_io_executor ex, std::size_t limit)
      : nursery(std::move(ex)), limit_(limit) {
    affinity_.bind(ex_);
  }
  task_group(const task_group&) = delete;
  task_group& operator=(const task_group&) = delete;

 private:
  // Detaches the group from its stop_source on every way out of run_impl.
  struct stop_registration {
    task_group& g;
    ~stop_registration() { g.detach(); }
  };

  template <class Body>
  static asio::awaitable<void> run_impl(std::size_t limit, Body body, stop_source* stop,
                                        hooks_ptr progress) {
    // A caller cancelled before the call starts nothing.
    auto caller = co_await asio::this_coro::cancellation_state;
    if (caller.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted,
                         "sluice::task_group: cancelled before start");
    // Stopped before it started: nothing to do.
    if (stop != nullptr && stop->stop_requested()) co_return;
    auto g = std::make_shared<task_group>(key{}, co_await asio::this_coro::executor, limit);
    g->template arm<detail::lazy_void<Body>>();
    g->progress_ = std::move(progress);
    if (g->progress_) g->progress_->begin(g->ex_);
    stop_registration registration{*g};
    if (stop != nullptr) g->attach(*stop);
    try {
      g->launch(body(*g), true);
    } catch (...) {
      g->fail(std::current_exception());
    }
    // The body and the children it started ran inline up to their first
    // suspension; one of them may have cancelled the caller meanwhile, when no
    // cancellation handler of the join existed yet to see it: pass it on here.
    if (caller.cancelled() != asio::cancellation_type::none) g->cancel_from_parent();
    // The join always waits for everything, even for a caller whose
    // cancellation is already requested. The switch belongs to the caller's
    // whole coroutine stack: put it back as it was.
    const bool throw_if_cancelled = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    error_code ec;
    auto join_token = asio::redirect_error(asio::use_awaitable, ec);
    co_await g->async_join(join_token);
    g->detach();                        // no stop request reaches a group that has finished
    co_await g->grace_.finish(g->ex_);  // a grace timer may still wait: end it, wait for it
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    if (g->progress_) g->progress_->finish();
    if (g->first_error_) std::rethrow_exception(g->first_error_);
    if (ec) throw system_error(ec, "sluice::task_group");
    if (g->progress_)
      if (auto e = g->progress_->error()) std::rethrow_exception(e);
  }

  [[nodiscard]] bool accepting() const noexcept { return !stopping_ && !draining_; }

  // Fills free slots: queued children first, then waiting producers.
  void fill_slots() {
    while (accepting() && running_ < limit_)
      if (auto next = waiting_.next()) {
        start(std::move(*next));
      } else {
        break;
      }
  }

  // stop_source::request: stop accepting, drop what waits, cancel the body,
  // give the running children `grace`.
  void on_stop_requested(clock::duration grace) override {
    affinity_.check("sluice::stop_source (stopping a task_group)");
    if (stopping_) return;  // already cancelling everything
    if (!draining_) {
      draining_ = true;
      quiet_abort_ = true;
      waiting_.drop_all();  // never started
      if (progress_) progress_->waiting(0);
      cancel_body();
    }
    if (running_ == 0) return;
    if (grace <= clock::duration::zero()) {
      stop();
      return;
    }
    const auto deadline = detail::add_saturating(sluice::now(ex_), grace);  // max(): forever
    if (grace_.shorten(deadline)) start_grace_(*this, deadline);
  }

  // What starts coroutines is compiled only where run() is (detail/lazy.hpp).
  template <class Lazy>
  void arm() noexcept {
    nursery::arm<Lazy>();
    start_grace_ = [](task_group& g, clock::time_point deadline) {
      g.grace_.start(detail::lazy<Lazy>(g.ex_), grace_timer<Lazy>(g.shared_from_this(), deadline));
    };
  }

  template <class Lazy>
  static asio::awaitable<void> grace_timer(std::shared_ptr<task_group> g,
                                           clock::time_point deadline) {
    try {
      co_await detail::wait_until(detail::lazy<Lazy>(g->ex_), detail::find_virtual_clock(g->ex_),
                                  deadline);
    } catch (...) {
      co_return;  // the group finished first, or a shorter grace replaced it
    }
    g->stop();
  }

  // Counted before it runs: a child that ends without suspending ends inside launch().
  void start(asio::awaitable<void> child) {
    if (progress_) progress_->started(waiting_.size());
    ++running_;
    launch(std::move(child), false);
  }

  // Begins to stop: drops the waiting children unstarted and cancels every
  // running coroutine. Idempotent.
  void stop() {
    if (stopping_) return;
    stopping_ = true;
    waiting_.drop_all();  // destroyed unstarted
    cancel_running();
  }

  // The caller was cancelled: stop, and report operation_aborted after the join.
  void cancel_from_parent() {
    parent_cancelled();
    stop();
  }

  void fail(std::exception_ptr e) {
    // What a stop request cancelled ends with operation_aborted: not an error.
    if (quiet_abort_ && detail::is_operation_aborted(e)) return;
    if (!first_error_ && !was_parent_cancelled()) first_error_ = std::move(e);
    stop();
  }

  // A child or the body finished (its node is gone already).
  void on_finished(bool child, std::exception_ptr e) {
    if (child) --running_;
    if (child && progress_) progress_->ended(e != nullptr, waiting_.size(), false);
    if (e) fail(std::move(e));
    fill_slots();
    if (child && progress_) progress_->tick();  // after the freed slot was refilled
  }

  std::size_t limit_;
  detail::slot_queue waiting_;  // accepted, not started; producers in spawn_when_ready
  std::size_t running_ = 0;     // running children (not the body)
  bool stopping_ = false;       // cancelling everything
  bool draining_ = false;       // a stop request: no new children
  bool quiet_abort_ = false;    // operation_aborted is not a failure
  detail::grace_period grace_;  // after a stop request: the running children's grace
  void (*start_grace_)(task_group&, clock::time_point) = nullptr;  // set by arm()
  hooks_ptr progress_;
  std::exception_ptr first_error_;
  [[no_unique_address]] detail::affinity affinity_;
};

}  // namespace sluice

#endif  // SLUICE_TASK_GROUP_HPP
