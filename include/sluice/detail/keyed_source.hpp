// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEYED_SOURCE_HPP
#define SLUICE_DETAIL_KEYED_SOURCE_HPP

// The machinery of sluice::by_key (by_key.hpp): an async source that a
// map_unordered pulls like any other, yielding its input's elements in the
// order "the next input whose key has room" (detail/key_queues.hpp), each
// with a ticket that holds its key's room until the task that got it ends.
// The input is pulled into the key queues only while fewer than `buffer`
// inputs wait there (backpressure on the input). At most one pull of the
// input at a time; for an async input it runs as a coroutine of its own
// (pulling), so a key that frees meanwhile is served at once, not after the
// pull. A pull or a ticket's release that makes an input ready wakes the
// parked next() (one at most: map_unordered never calls next()
// concurrently).
//
// With a keyed limit the user owns (Limit: keyed_semaphore,
// keyed_rate_limiter) instead of a number, the limit decides which key's
// head input may start (detail/key_asks.hpp): next(), called only by the
// worker holding the fan-out's free slot, takes an input whose grant is in
// hand or free, else asks the limit for every ready key and parks until a
// wait ends. The grant is the task's ticket.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/key_asks.hpp>
#include <sluice/detail/key_queues.hpp>
#include <sluice/detail/keyed_limit.hpp>
#include <sluice/detail/map_core.hpp>
#include <sluice/detail/range_holder.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// What the source hands the worker: the input and its ticket.
template <class U, class Ticket>
struct keyed_input {
  Ticket ticket;
  U value;
};

// For a number per key (Limit = void): the key function's key and std::hash;
// for a keyed limit, the limit's.
template <class KeyFn, class V, class Limit>
struct source_keys {
  using key_type = std::remove_cvref_t<std::invoke_result_t<KeyFn&, const V&>>;
  using hash = std::hash<key_type>;
};
template <class KeyFn, class V, class K, class H, class E, template <class, class, class> class L>
requires keyed_limit_traits<L<K, H, E>>::valid struct source_keys<KeyFn, V, L<K, H, E>> {
  using key_type = K;
  using hash = H;
};

// The async source over `In` (a range or an async source), each key limited
// by a number (Limit = void) or by the user's keyed limit.
template <class In, class KeyFn, class Executor, class Limit = void>
class keyed_source {
  static constexpr bool is_async = fan_out_input_traits<In>::is_async;
  static constexpr bool limited = !std::is_void_v<Limit>;
  using value_type = typename fan_out_input_traits<In>::value_type;
  using keys = source_keys<KeyFn, value_type, Limit>;
  using key_type = typename keys::key_type;
  using state = key_state<value_type, key_type, typename keys::hash>;
  using input_type = std::conditional_t<is_async, range_holder<In>, range_cursor<In>>;
  struct no_limit {};
  using limit_type = std::conditional_t<limited, Limit, no_limit>;
  using asks_type = key_asks<state, limit_type>;
  using asks_ptr = std::conditional_t<limited, std::shared_ptr<asks_type>, no_limit>;

  // The input and the key function: shared with a pull in progress.
  struct shared {
    shared(In&& in, KeyFn k) : input(std::forward<In>(in)), key(std::move(k)) {}
    input_type input;
    KeyFn key;
    std::shared_ptr<child_set> pulls = child_set::make();  // the pull in progress
  };

 public:
  using ticket = typename std::conditional_t<limited, asks_type, state>::ticket;
  using item = keyed_input<value_type, ticket>;

  // A number per key.
  keyed_source(In&& in, KeyFn key, std::size_t per_key, std::size_t buffer,
               bool most_waiting) requires(!limited)
      : state_(std::make_shared<state>(per_key, buffer, most_waiting)),
        shared_(std::make_shared<shared>(std::forward<In>(in), std::move(key))) {}

  // The user's keyed limit, which must outlive the source's close().
  keyed_source(In&& in, KeyFn key, limit_type& limit, std::size_t buffer,
               bool most_waiting) requires limited
      : state_(std::make_shared<state>(static_cast<std::size_t>(-1), buffer, most_waiting)),
        shared_(std::make_shared<shared>(std::forward<In>(in), std::move(key))),
        asks_(std::make_shared<asks_type>(state_, limit, [st = state_](std::exception_ptr e) {
          if (e && !st->error) st->error = std::move(e);  // the limit refused a wait
          st->wake();
        })) {}

  // The next input to start: the oldest whose key has room (most_waiting:
  // of the key with the most buffered inputs, after pulling as far as the
  // buffer or what the input has now). Waits (holding nothing) while every
  // buffered input's key is full and the buffer is full or the input has
  // nothing more now. Empty at the end of the input once everything buffered
  // was handed out.
  asio::awaitable<std::optional<item>, Executor> next() {
    const Executor ex = co_await asio::this_coro::executor;
    if constexpr (limited) asks_->bind(ex);
    bool scanned = false;  // limited: every ready key was tried since the last park
    for (;;) {
      if (auto e = std::exchange(state_->error, nullptr)) std::rethrow_exception(e);
      const bool can_pull = !state_->input_done && !state_->pulling && state_->has_room();
      if (!(can_pull && state_->most_waiting()) && !std::exchange(scanned, false))
        if (auto t = take()) co_return t;
      if (state_->input_done && !state_->pulling && state_->buffered() == 0) co_return std::nullopt;
      if (can_pull) {
        if constexpr (is_async) {
          state_->pulling = true;
          shared_->pulls->spawn(ex, pull(state_, shared_));
          if (!state_->pulling) continue;  // it finished inside spawn (co_spawn dispatches)
          if (auto t = take()) co_return t;
        } else {
          if (shared_->input.done()) {
            state_->input_done = true;
          } else {
            auto v = shared_->input.take();
            [[maybe_unused]] auto* n =
                state_->push(std::invoke(shared_->key, std::as_const(v)), std::move(v));
            if constexpr (limited) {
              // The keys before it were tried already: only the new one may
              // be free (oldest first; most_waiting chooses after the pulls).
              if (!state_->most_waiting()) {
                scanned = true;
                if (auto t = asks_->take_pushed(n))
                  co_return item{std::move(t->first), std::move(t->second)};
              }
            }
          }
          continue;
        }
      }
      if constexpr (limited)
        if (asks_->ask_ready(ex)) continue;  // a wait ended already: no wake-up to park for
      co_await state_->park(ex);
    }
  }

  // Cancels a pull in progress and the waits on the keyed limit and waits
  // for them, then closes an owned input that has close() (map_unordered
  // calls it when the stream stops).
  asio::awaitable<void, Executor> close() {
    shared_->pulls->cancel_all();
    error_code ec;
    const Executor ex = co_await asio::this_coro::executor;
    co_await shared_->pulls->join(ex, ec);
    if constexpr (limited) co_await asks_->join(ex);
    if constexpr (is_async && !std::is_reference_v<In>) {
      if constexpr (requires(std::remove_reference_t<In> & s) {
                      { s.close() } -> std::same_as<asio::awaitable<void, Executor>>;
                    }) {
        co_await shared_->input.get().close();
      }
    }
  }

 private:
  // The input that may start now, with its ticket; empty if none.
  std::optional<item> take() {
    if constexpr (limited) {
      if (auto t = asks_->take()) return item{std::move(t->first), std::move(t->second)};
    } else {
      if (auto t = state_->take()) return item{std::move(t->first), std::move(t->second)};
    }
    return std::nullopt;
  }

  static asio::awaitable<void, Executor> pull(std::shared_ptr<state> st,
                                              std::shared_ptr<shared> sh) {
    try {
      auto v = co_await sh->input.get().next();
      if (v) {
        auto k = std::invoke(sh->key, std::as_const(*v));
        st->push(std::move(k), std::move(*v));
      } else {
        st->input_done = true;
      }
    } catch (...) {
      st->error = std::current_exception();
      st->input_done = true;
    }
    st->pulling = false;
    st->wake();
  }

  std::shared_ptr<state> state_;
  std::shared_ptr<shared> shared_;
  [[no_unique_address]] asks_ptr asks_;
};

// The function the map applies: runs fn on the input while its ticket holds
// the key's room.
template <class F>
struct keyed_call {
  F fn;
  template <class Item,
            class Task = std::invoke_result_t<F&, decltype(std::declval<Item&>().value)>>
  Task operator()(Item item) {
    // Released when this task ends; a rate start is spent as it starts (a
    // ticket dropped unstarted gives it back).
    [[maybe_unused]] auto held = std::move(item.ticket);
    if constexpr (requires { held.spend(); }) held.spend();
    if constexpr (std::is_void_v<task_result_t<Task>>) {
      co_await std::invoke(fn, std::move(item.value));
    } else {
      co_return co_await std::invoke(fn, std::move(item.value));
    }
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEYED_SOURCE_HPP
