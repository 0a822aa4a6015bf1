// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TASK_GROUP_HPP
#define SLUICE_TASK_GROUP_HPP

#include <sluice/config.hpp>
#include <sluice/detail/affinity.hpp>
#include <sluice/detail/completion.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <limits>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
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
class task_group : public std::enable_shared_from_this<task_group> {
  struct key {};

 public:
  /// Runs `body(group)` and every child it spawns with no bound on how many
  /// run at once; completes when all have finished. See the class comment for
  /// failure and cancellation.
  template <task_group_body Body>
  [[nodiscard]] static asio::awaitable<void> run(Body body) {
    return run_impl(std::numeric_limits<std::size_t>::max(), std::move(body));
  }

  /// As `run(body)`, with at most `limit` children running at once; the others
  /// wait in FIFO order, unstarted. Throws `std::invalid_argument` at once when
  /// `limit == 0`.
  template <task_group_body Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Body body) {
    if (limit == 0)
      throw std::invalid_argument("sluice::task_group::run: limit must be at least 1 (got 0)");
    return run_impl(limit, std::move(body));
  }

  /// Adds a child. It starts at once (it runs up to its first suspension
  /// before `spawn` returns), or, when `limit` children already run, waits
  /// unstarted in FIFO order for a slot. Returns
  /// true if the child was accepted; false if the group has begun to stop (a
  /// failure or a cancellation), in which case `child` is destroyed unstarted.
  bool spawn(asio::awaitable<void> child) {
    affinity_.check("sluice::task_group");
    if (stopping_) return false;  // `child` is destroyed unstarted on return
    if (running_ < limit_) {
      start(std::move(child));
    } else {
      waiting_.push_back(std::move(child));
    }
    return true;
  }

  /// Children accepted and not yet finished: running plus waiting for a slot.
  [[nodiscard]] std::size_t size() const noexcept { return running_ + waiting_.size(); }
  /// Children started and not yet finished (at most the limit).
  [[nodiscard]] std::size_t running() const noexcept { return running_; }
  /// The bound on running children (`SIZE_MAX` when unbounded).
  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// True once the group has begun to stop: `spawn` then starts nothing.
  [[nodiscard]] bool stopping() const noexcept { return stopping_; }

  /// Made only by `run`.
  task_group(key, asio::any_io_executor ex, std::size_t limit) : ex_(std::move(ex)), limit_(limit) {
    affinity_.bind(ex_);
  }
  task_group(const task_group&) = delete;
  task_group& operator=(const task_group&) = delete;

 private:
  // One running coroutine (the body or a child) and its cancellation signal.
  // Nodes live in a std::list: signals never move, erasure is O(1).
  struct node {
    asio::cancellation_signal signal;
    bool is_body = false;
  };
  using node_iter = std::list<node>::iterator;

  struct done_handler {
    std::shared_ptr<task_group> self;
    node_iter it;
    void operator()(std::exception_ptr e) const { self->on_done(it, e); }
  };

  template <class Body>
  static asio::awaitable<void> run_impl(std::size_t limit, Body body) {
    // A caller cancelled before the call starts nothing.
    auto caller = co_await asio::this_coro::cancellation_state;
    if (caller.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted,
                         "sluice::task_group: cancelled before start");
    auto g = std::make_shared<task_group>(key{}, co_await asio::this_coro::executor, limit);
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
    co_await asio::this_coro::throw_if_cancelled(throw_if_cancelled);
    if (g->first_error_) std::rethrow_exception(g->first_error_);
    if (ec) throw system_error(ec, "sluice::task_group");
  }

  void start(asio::awaitable<void> child) { launch(std::move(child), false); }

  void launch(asio::awaitable<void> a, bool is_body) {
    nodes_.emplace_back();
    auto it = std::prev(nodes_.end());
    it->is_body = is_body;
    if (!is_body) ++running_;
    asio::co_spawn(
        ex_, std::move(a),
        asio::bind_cancellation_slot(it->signal.slot(), done_handler{shared_from_this(), it}));
  }

  // Begins to stop: drops the waiting children unstarted and cancels every
  // running coroutine. Idempotent.
  void stop() {
    if (stopping_) return;
    stopping_ = true;
    auto dropped = std::move(waiting_);  // destroyed unstarted at scope exit
    waiting_.clear();
    for (auto it = nodes_.begin(); it != nodes_.end();) {
      auto next = std::next(it);
      it->signal.emit(asio::cancellation_type::terminal);
      it = next;
    }
  }

  // The caller was cancelled: stop, and report operation_aborted after the join.
  void cancel_from_parent() {
    parent_cancelled_ = true;
    stop();
  }

  void fail(std::exception_ptr e) {
    if (!first_error_ && !parent_cancelled_) first_error_ = std::move(e);
    stop();
  }

  void on_done(node_iter it, std::exception_ptr e) {
    it->signal.slot().clear();
    if (!it->is_body) --running_;
    nodes_.erase(it);
    if (e) fail(std::move(e));
    while (!stopping_ && running_ < limit_ && !waiting_.empty()) {
      auto next = std::move(waiting_.front());
      waiting_.pop_front();
      start(std::move(next));
    }
    if (nodes_.empty() && joiner_) {
      joiner_.complete(parent_cancelled_ ? error_code(asio::error::operation_aborted)
                                         : error_code());
    }
  }

  // Waits until the body and every child have finished: void(error_code). A
  // cancelled waiter stops the group and still waits for all of it, then
  // completes with operation_aborted.
  template <class Token>
  auto async_join(Token&& token) {
    return asio::async_initiate<Token, void(error_code)>(
        [this](auto handler) {
          if (nodes_.empty()) {
            detail::post_completion(
                std::move(handler), ex_,
                parent_cancelled_ ? error_code(asio::error::operation_aborted) : error_code());
            return;
          }
          auto slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected()) {
            slot.assign([this](asio::cancellation_type type) {
              if (type != asio::cancellation_type::none) cancel_from_parent();
            });
          }
          joiner_ = detail::erased_handler<error_code>(std::move(handler), ex_);
        },
        token);
  }

  asio::any_io_executor ex_;
  std::size_t limit_;
  std::list<node> nodes_;                      // the body and the running children
  std::deque<asio::awaitable<void>> waiting_;  // accepted, not started (FIFO)
  std::size_t running_ = 0;                    // running children (not the body)
  bool stopping_ = false;
  bool parent_cancelled_ = false;
  std::exception_ptr first_error_;
  detail::erased_handler<error_code> joiner_;
  [[no_unique_address]] detail::affinity affinity_;
};

}  // namespace sluice

#endif  // SLUICE_TASK_GROUP_HPP
