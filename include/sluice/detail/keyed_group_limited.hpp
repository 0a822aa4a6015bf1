// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEYED_GROUP_LIMITED_HPP
#define SLUICE_DETAIL_KEYED_GROUP_LIMITED_HPP

// keyed_task_group's form with an existing keyed limit
// (`run(limit, keyed, body, ...)`): the run that puts the limit's waits
// (a key_gate) in front of the group, and the asker, the child that keeps a
// free slot while children wait for their key's grant. A friend of
// keyed_task_group<Key, Hash> (Group), whose state it works on.

#include <sluice/config.hpp>
#include <sluice/detail/key_asks.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

namespace sluice::detail {

template <class Group>
struct keyed_group_limited {
  template <class Limit, class Body, class Options, class Stop, class Hooks>
  static asio::awaitable<void> run(std::size_t limit, Limit& keyed, Body body, Options o, Stop stop,
                                   Hooks progress) {
    // Before the limit is bound to the caller's clock (key_gate_for).
    if (!Group::may_start(co_await asio::this_coro::cancellation_state, stop)) co_return;
    // No per-key number: the limit bounds each key.
    Group self(typename Group::tag{}, static_cast<std::size_t>(-1), o);
    self.ex_ = co_await asio::this_coro::executor;
    self.gate_ = std::make_unique<key_gate_for<typename Group::state, Limit>>(
        self.keys_, keyed,
        [&self](std::exception_ptr e) {
          if (e && !self.wait_error_) self.wait_error_ = std::move(e);
          self.keys_->wake();
        },
        self.ex_);
    self.progress_ = std::move(progress);
    std::exception_ptr error;
    try {
      co_await Group::run_impl(limit, std::move(body), self, stop);
    } catch (...) {
      error = std::current_exception();
    }
    // Every wait on the limit ends before run does, even for a cancelled caller.
    const bool was = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await self.gate_->join(self.ex_);
    co_await asio::this_coro::throw_if_cancelled(was);
    if (error) std::rethrow_exception(error);
  }

  // With a gate: the child that keeps a free slot while children wait for
  // their key's grant. It asks the limit and parks until a wait ends or a
  // child is queued, then runs the first child granted in its own slot; it
  // leaves when nothing waits any more or the group stops (withdrawing its
  // waits either way).
  static asio::awaitable<void> asker(Group* self) {
    std::optional<asio::awaitable<void>> child;
    std::exception_ptr error;
    while (!self->stopping() && self->keys_->buffered() != 0) {
      if ((error = std::exchange(self->wait_error_, nullptr))) break;
      if ((child = self->gate_->take())) break;
      if (self->gate_->ask(self->ex_)) continue;  // a wait ended already: try again
      try {
        co_await self->keys_->park(self->ex_);
      } catch (const system_error&) {
        break;  // cancelled: the group stops
      }
    }
    self->asking_ = false;
    self->gate_->withdraw();
    if (error) std::rethrow_exception(error);  // the limit refused a wait: the group fails
    if (!child) co_return;
    self->pump(0);  // other free slots take what may start now
    co_await Group::run_child(self, typename Group::ticket(), std::move(*child));
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEYED_GROUP_LIMITED_HPP
