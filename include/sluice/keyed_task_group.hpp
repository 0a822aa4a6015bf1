// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_KEYED_TASK_GROUP_HPP
#define SLUICE_KEYED_TASK_GROUP_HPP

#include <sluice/by_key_options.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/key_asks.hpp>
#include <sluice/detail/key_queues.hpp>
#include <sluice/detail/keyed_group_limited.hpp>
#include <sluice/detail/keyed_limit.hpp>
#include <sluice/detail/producer_queue.hpp>
#include <sluice/progress.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/task_group.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice {

template <class Key, class Hash>
class keyed_task_group;

/// A body for `keyed_task_group<Key, Hash>::run`: called once with the group,
/// it returns the `asio::awaitable<void>` that spawns the children.
template <class F, class Key, class Hash>
concept keyed_task_group_body = std::invocable < F&,
        keyed_task_group<Key, Hash>
& > &&std::same_as<std::invoke_result_t<F&, keyed_task_group<Key, Hash>&>, asio::awaitable<void>>;

/// A `task_group` whose children have keys (hosts, tenants, accounts): at
/// most `limit` children run at once, at most `per_key` of one key, and a
/// slot goes to the oldest child whose key has room, never to a child that
/// would then wait for its key.
///
/// - `g.spawn(key, child)` queues the child in its key's FIFO queue; it
///   starts, unstarted until then, once its key has room and a slot is free
///   (children of a busy key wait outside the slots: a burst of one key never
///   blocks the others). With `.order = key_order::most_waiting` a free slot
///   goes to the key with the most children waiting instead (the oldest key
///   first among equals); order within a key is always spawn order.
/// - Backpressure: at most `buffer` children wait for their key's room;
///   `co_await g.spawn_when_ready(key, child)` waits (FIFO among producers)
///   while that many wait. `spawn` never waits: it queues past the bound (a
///   child spawning its discoveries must not block), so a producer that can
///   outrun the group uses `spawn_when_ready`.
/// - Everything else is `task_group::run(limit, body)`'s: the body and every
///   child run on the caller's executor; the first failure cancels every
///   running child (terminal), drops the waiting ones unstarted, waits for
///   all and is rethrown; cancelling the caller does the same and throws
///   `operation_aborted`; a caller cancelled before the call starts nothing;
///   nothing spawned outlives `run`.
/// - Why a type of its own and not `task_group::spawn(key, child)`: the key
///   type is a template parameter here (any key `Hash` and `==` accept),
///   and `task_group` stays what it was for everyone who spawns without keys.
///   It is built on a `task_group`: the children it starts are that group's.
/// - After a failure, nothing more starts: children waiting for their key are
///   destroyed unstarted, and producers still waiting in `spawn_when_ready`
///   resume with false, at the latest when `run` ends (the body and the
///   children, the usual producers, are cancelled at once anyway).
/// - The per-key limit may be a `keyed_semaphore<Key>` or
///   `keyed_rate_limiter<Key>` the caller owns and shares with other code:
///   `run(limit, keyed, body, o)`, as `sluice::by_key(key, limit)` does for
///   `map_unordered`.
/// - `task_group`'s extras, after `body` in either form: a `stop_source&`
///   (`stop.request(grace)` stops the group as `task_group`'s: spawning
///   refused, children waiting for their key or a slot dropped unstarted,
///   producers resumed with false, waits on a keyed limit withdrawn, the
///   body cancelled, the running children given `grace`, then cancelled;
///   `run` then returns normally) and a `sluice::progress` (reports on the
///   children, not the body; `waiting` counts those waiting for their key),
///   or both in that order. `stop` must outlive the call.
///
/// Lifetimes: as `task_group`'s (the body object and the caller's frame
/// outlive every child; the body coroutine's own locals do not). Loop-affine:
/// call `spawn` and `spawn_when_ready` from the group's body and children.
///
/// @code
/// co_await sluice::keyed_task_group<std::string>::run(
///     8, 2, [&](sluice::keyed_task_group<std::string>& g) -> asio::awaitable<void> {
///       for (auto& url : urls) g.spawn(host_of(url), fetch(url));  // 8 at once, 2 per host
///       co_return;
///     });
/// @endcode
template <class Key, class Hash = std::hash<Key>>
class keyed_task_group : private detail::stop_listener {
  using state = detail::key_state<asio::awaitable<void>, Key, Hash>;
  using ticket = typename state::ticket;
  using hooks_ptr = std::unique_ptr<detail::progress_hooks>;
  struct tag {};
  using limited = detail::keyed_group_limited<keyed_task_group>;
  friend limited;

 public:
  /// Runs `body(group)` and every child it spawns, at most `limit` at once and
  /// `per_key` of one key, with the default options (`buffer` 1024, oldest
  /// first); completes when all have finished. Throws `std::invalid_argument`
  /// at once when `limit`, `per_key` or `o.buffer` is 0.
  template <keyed_task_group_body<Key, Hash> Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, std::size_t per_key, Body body,
                                                 by_key_options o = {}) {
    check(limit == 0 || per_key == 0 || o.buffer == 0, "limit, per_key and buffer");
    return run_impl(limit, per_key, std::move(body), o, nullptr, nullptr);
  }
  /// As above, stopped gracefully by `stop` (see the class comment).
  template <keyed_task_group_body<Key, Hash> Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, std::size_t per_key, Body body,
                                                 stop_source& stop, by_key_options o = {}) {
    check(limit == 0 || per_key == 0 || o.buffer == 0, "limit, per_key and buffer");
    return run_impl(limit, per_key, std::move(body), o, &stop, nullptr);
  }
  /// As above, with progress reports on the children (see the class comment).
  template <keyed_task_group_body<Key, Hash> Body, class F>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, std::size_t per_key, Body body,
                                                 progress<F> report, by_key_options o = {}) {
    check(limit == 0 || per_key == 0 || o.buffer == 0, "limit, per_key and buffer");
    return run_impl(limit, per_key, std::move(body), o, nullptr, hooks(std::move(report)));
  }
  /// As above, stopped by `stop`, with progress reports.
  template <keyed_task_group_body<Key, Hash> Body, class F>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, std::size_t per_key, Body body,
                                                 stop_source& stop, progress<F> report,
                                                 by_key_options o = {}) {
    check(limit == 0 || per_key == 0 || o.buffer == 0, "limit, per_key and buffer");
    return run_impl(limit, per_key, std::move(body), o, &stop, hooks(std::move(report)));
  }

  /// As above, each key limited by `keyed`, a `keyed_semaphore<Key>` or
  /// `keyed_rate_limiter<Key>` the caller owns (used by reference: it must
  /// outlive `run`): a child takes a slot only once its key's grant is in
  /// hand, a permit held for exactly its run or a rate start spent as it
  /// starts; the others wait outside the slots, per key in spawn order.
  /// While children wait and a slot is free, one slot is kept by the group
  /// to ask the limit for every waiting key (`try_acquire` first, then one
  /// wait per key); the first grant starts its child in that slot and the
  /// other waits are withdrawn (grants that came with them given back), so
  /// no grant is kept without its running child. An error of the limit's
  /// wait (its shed bound) fails the group. A `keyed_rate_limiter` built
  /// without an executor is bound to the caller's clock as `run` starts (as
  /// with `sluice::by_key`). Cancellation and failure
  /// withdraw every wait and await it before `run` returns: nothing is left
  /// on the limit. Throws `std::invalid_argument` at once when `limit` or
  /// `o.buffer` is 0.
  ///
  /// @code
  /// sluice::keyed_semaphore<std::string> per_host{2};   // shared with the rest of the service
  /// co_await sluice::keyed_task_group<std::string>::run(
  ///     8, per_host, [&](sluice::keyed_task_group<std::string>& g) -> asio::awaitable<void> {
  ///       for (auto& url : urls) g.spawn(host_of(url), fetch(url));
  ///       co_return;
  ///     });
  /// @endcode
  template <detail::keyed_limit_of<Key> Limit, keyed_task_group_body<Key, Hash> Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Limit& keyed, Body body,
                                                 by_key_options o = {}) {
    check(limit == 0 || o.buffer == 0, "limit and buffer");
    return limited::run(limit, keyed, std::move(body), o, nullptr, nullptr);
  }
  /// As above, stopped gracefully by `stop` (see the class comment).
  template <detail::keyed_limit_of<Key> Limit, keyed_task_group_body<Key, Hash> Body>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Limit& keyed, Body body,
                                                 stop_source& stop, by_key_options o = {}) {
    check(limit == 0 || o.buffer == 0, "limit and buffer");
    return limited::run(limit, keyed, std::move(body), o, &stop, nullptr);
  }
  /// As above, with progress reports on the children (see the class comment).
  template <detail::keyed_limit_of<Key> Limit, keyed_task_group_body<Key, Hash> Body, class F>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Limit& keyed, Body body,
                                                 progress<F> report, by_key_options o = {}) {
    check(limit == 0 || o.buffer == 0, "limit and buffer");
    return limited::run(limit, keyed, std::move(body), o, nullptr, hooks(std::move(report)));
  }
  /// As above, stopped by `stop`, with progress reports.
  template <detail::keyed_limit_of<Key> Limit, keyed_task_group_body<Key, Hash> Body, class F>
  [[nodiscard]] static asio::awaitable<void> run(std::size_t limit, Limit& keyed, Body body,
                                                 stop_source& stop, progress<F> report,
                                                 by_key_options o = {}) {
    check(limit == 0 || o.buffer == 0, "limit and buffer");
    return limited::run(limit, keyed, std::move(body), o, &stop, hooks(std::move(report)));
  }

  /// Queues `child` under `key`; it starts once its key has room and a slot
  /// is free (see the class comment). Returns true if accepted; false, with
  /// `child` destroyed unstarted, once the group has begun to stop.
  bool spawn(Key key, asio::awaitable<void> child) {
    if (stopping()) return false;
    keys_->push(std::move(key), std::move(child));
    pump(0);
    if (progress_) progress_->waiting(keys_->buffered());
    return true;
  }

  /// As `spawn`, but waits while `buffer` children wait for their key's room
  /// (producers in FIFO order). Resumes (on the awaiting coroutine's
  /// executor) with true once `child` is accepted (started or queued for its
  /// key), at once when there is room and no producer waits; with false,
  /// `child` destroyed unstarted, when the group stops first.
  ///
  /// Per-Operation Cancellation (terminal, partial, total): a waiting call is
  /// removed, `child` is destroyed unstarted and `system_error`
  /// (`operation_aborted`) is thrown; a place that freed meanwhile goes to
  /// the next producer. A caller whose cancellation was requested before the
  /// call starts nothing and throws `operation_aborted`.
  [[nodiscard]] asio::awaitable<bool> spawn_when_ready(Key key, asio::awaitable<void> child) {
    const auto cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted,
                         "sluice::keyed_task_group::spawn_when_ready");
    if (stopping()) co_return false;
    if (producers_.empty() && keys_->buffered() < buffer_)
      co_return spawn(std::move(key), std::move(child));
    co_return co_await producers_.wait(co_await asio::this_coro::executor,
                                       {std::move(key), std::move(child)});
  }

  /// Children accepted and not yet finished: running, about to start, and
  /// waiting for their key.
  [[nodiscard]] std::size_t size() const noexcept { return g_->size() + keys_->buffered(); }
  /// Children started and not yet finished (at most the limit).
  [[nodiscard]] std::size_t running() const noexcept { return g_->running(); }
  /// Children waiting for their key's room.
  [[nodiscard]] std::size_t waiting() const noexcept { return keys_->buffered(); }
  /// Keys with a child running or waiting.
  [[nodiscard]] std::size_t keys() const noexcept { return keys_->keys(); }
  /// Producers waiting in `spawn_when_ready`.
  [[nodiscard]] std::size_t producers_waiting() const noexcept { return producers_.size(); }
  /// True once the group has begun to stop (a failure, a cancellation, a
  /// stop request).
  [[nodiscard]] bool stopping() const noexcept { return stopped_ || g_->stopping(); }

  /// Made only by `run`.
  keyed_task_group(tag, std::size_t per_key, by_key_options o)
      : keys_(std::make_shared<state>(per_key, o.buffer, o.order == key_order::most_waiting)),
        buffer_(o.buffer) {}
  keyed_task_group(const keyed_task_group&) = delete;
  keyed_task_group& operator=(const keyed_task_group&) = delete;

 private:
  static void check(bool bad, const char* what) {
    if (bad)
      throw std::invalid_argument(std::string("sluice::keyed_task_group::run: ") + what +
                                  " must be at least 1");
  }
  // As task_group::run: a caller cancelled before the call starts nothing
  // (operation_aborted), nor does a stop requested before it (false); no
  // report either.
  static bool may_start(const asio::cancellation_state& caller, const stop_source* stop) {
    if (caller.cancelled() != asio::cancellation_type::none)
      throw system_error(asio::error::operation_aborted,
                         "sluice::keyed_task_group: cancelled before start");
    return stop == nullptr || !stop->stop_requested();
  }
  template <class F>
  static hooks_ptr hooks(progress<F>&& report) {
    return std::make_unique<detail::progress_hooks_for<F>>(std::move(report));
  }

  template <class Body>
  static asio::awaitable<void> run_impl(std::size_t limit, std::size_t per_key, Body body,
                                        by_key_options o, stop_source* stop, hooks_ptr progress) {
    keyed_task_group self(tag{}, per_key, o);  // outlives every child: run awaits them
    self.progress_ = std::move(progress);
    co_await run_impl(limit, std::move(body), self, stop);
  }
  template <class Body>
  static asio::awaitable<void> run_impl(std::size_t limit, Body body, keyed_task_group& self,
                                        stop_source* stop) {
    struct on_exit {
      keyed_task_group& self;
      ~on_exit() {
        self.detach();
        self.producers_.refuse_all();
      }
    } exit{self};
    auto inner = [&](task_group& g) {
      self.g_ = &g;
      return body(self);
    };
    if (!may_start(co_await asio::this_coro::cancellation_state, stop)) co_return;
    if (self.progress_) self.progress_->begin(co_await asio::this_coro::executor);
    std::exception_ptr error;
    try {
      if (stop) {
        self.attach(*stop);  // before the group's listener: called after it
        co_await task_group::run(limit, std::move(inner), *stop);
      } else {
        co_await task_group::run(limit, std::move(inner));
      }
    } catch (...) {
      error = std::current_exception();
    }
    if (self.progress_) {
      self.progress_->finish();
      if (!error) error = self.progress_->error();
    }
    if (error) std::rethrow_exception(error);
  }

  // stop_source::request (task_group stops the body and the running
  // children): nothing waiting for its key starts, producers are refused,
  // the asker leaves.
  void on_stop_requested(clock::duration) override {
    stopped_ = true;
    keys_->drop_queued();
    producers_.refuse_all();
    if (progress_) progress_->waiting(0);
    if (asking_) keys_->wake();
  }

  // Moves the children that may start into the group: while it has a free
  // slot (counting `leaving`, the child calling from its end), the next
  // child whose key has room; then lets waiting producers into the freed
  // places. Once the group stops, drops what waits instead. True if it
  // started a child.
  bool pump(std::size_t leaving) {
    if (stopping()) {
      keys_->drop_queued();
      producers_.refuse_all();
      if (progress_) progress_->waiting(0);
      if (asking_) keys_->wake();  // the asker leaves
      return false;
    }
    bool started = false;
    for (;;) {
      while (!producers_.empty() && keys_->buffered() < buffer_) {
        auto [key, child] = producers_.grant_front();
        keys_->push(std::move(key), std::move(child));
      }
      if (asking_) {  // it holds a slot, perhaps the last free one: it tries again
        keys_->wake();
        return started;
      }
      if (g_->size() - leaving >= g_->limit()) return started;
      if (gate_) {
        auto child = gate_->take();
        if (!child) {
          if (keys_->buffered() == 0) return started;
          asking_ = true;
          g_->spawn(limited::asker(this));
          return started;
        }
        g_->spawn(run_child(this, ticket(), std::move(*child)));
        started = true;
        continue;
      }
      auto next = keys_->take();
      if (!next) return started;
      g_->spawn(run_child(this, std::move(next->first), std::move(next->second)));
      started = true;
    }
  }

  // A child holding its key's room; at its end (a normal one) the room and
  // the slot go on.
  static asio::awaitable<void> run_child(keyed_task_group* self, ticket t,
                                         asio::awaitable<void> child) {
    auto* p = self->progress_.get();
    if (p) p->started(self->keys_->buffered());
    std::exception_ptr error;
    try {
      co_await std::move(child);
    } catch (...) {
      error = std::current_exception();
    }
    t.reset();
    if (p) p->ended(error != nullptr, self->keys_->buffered(), false);
    // A failure stops the group (task_group::run): nothing more starts, not
    // even in the instant before the group learns of it.
    const bool refilled = !error && self->pump(1);
    if (p && !refilled) {  // else the child taking the slot reports as it starts
      p->waiting(self->keys_->buffered());
      p->tick();
    }
    if (error) std::rethrow_exception(error);
  }

  task_group* g_ = nullptr;
  std::shared_ptr<state> keys_;             // children waiting for their key; the keys' room
  std::unique_ptr<detail::key_gate> gate_;  // with a keyed limit: its waits
  asio::any_io_executor ex_;                // with a keyed limit: run's
  bool asking_ = false;                     // the asker runs
  bool stopped_ = false;                    // a stop request came
  hooks_ptr progress_;                      // progress reports on the children, or null
  std::exception_ptr wait_error_;           // the limit refused a wait
  std::size_t buffer_;
  detail::producer_queue<std::pair<Key, asio::awaitable<void>>> producers_;
};

}  // namespace sluice

#endif  // SLUICE_KEYED_TASK_GROUP_HPP
