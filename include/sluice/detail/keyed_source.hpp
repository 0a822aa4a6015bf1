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
// keyed_rate_limiter; detail/keyed_limit.hpp) instead of a number, every key
// with queued inputs is "ready" to key_state, and next() (called only by the
// worker holding the fan-out's free slot) asks the limit: the first ready key
// in take()'s order whose grant is in hand or free now (try_take) gets the
// slot, its grant becoming the task's ticket. If none, next() starts one wait
// on the limit per ready key (asks_, at most one per key) and parks; the
// first grant wakes it. When next() hands out an input, the other waits are
// withdrawn: cancelled (a grant racing the cancellation is handed on by the
// limit) and grants already in hand dropped, which gives them back. So a key
// is asked for only while a slot is free and a grant is never kept without
// its task. asks_: per key, the wait's child index in the set, live (the wait
// runs), withdrawn, and its grant once it resumed with one. An entry is
// erased when its wait ended withdrawn or failed, or its grant was taken or
// dropped; a key with an entry gets no second wait.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
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
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::detail {

// What the source hands the worker: the input and its ticket.
template <class U, class Ticket>
struct keyed_input {
  Ticket ticket;
  U value;
};

// For a number per key (Limit = void): the key function's key and std::hash.
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
  struct no_limit {
    using grant = int;
  };
  using traits = std::conditional_t<limited, keyed_limit_traits<Limit>, no_limit>;

  // The input and the key function: shared with a pull in progress.
  struct shared {
    shared(In&& in, KeyFn k) : input(std::forward<In>(in)), key(std::move(k)) {}
    input_type input;
    KeyFn key;
    std::shared_ptr<child_set> pulls = std::make_shared<child_set>();  // the pull in progress
  };

  struct ask {
    std::size_t child = 0;
    bool live = true;
    bool withdrawn = false;
    std::optional<typename traits::grant> granted;
  };
  // The waits on the keyed limit (see the file comment): shared with them.
  struct asks {
    std::unordered_map<key_type, ask, typename keys::hash> by_key;
    std::shared_ptr<child_set> set = std::make_shared<child_set>();
  };
  struct no_asks {};
  using asks_type = std::conditional_t<limited, asks, no_asks>;

 public:
  using ticket = std::conditional_t<limited, typename traits::grant, typename state::ticket>;
  using item = keyed_input<value_type, ticket>;

  // A number per key.
  keyed_source(In&& in, KeyFn key, std::size_t per_key, std::size_t buffer,
               bool most_waiting) requires(!limited)
      : state_(std::make_shared<state>(per_key, buffer, most_waiting)),
        shared_(std::make_shared<shared>(std::forward<In>(in), std::move(key))) {}

  // The user's keyed limit, which must outlive the source's close().
  using limit_type = std::conditional_t<limited, Limit, no_limit>;
  keyed_source(In&& in, KeyFn key, limit_type& limit, std::size_t buffer,
               bool most_waiting) requires limited
      : state_(std::make_shared<state>(static_cast<std::size_t>(-1), buffer, most_waiting)),
        shared_(std::make_shared<shared>(std::forward<In>(in), std::move(key))),
        limit_(&limit),
        asks_(std::make_shared<asks_type>()) {}

  // The next input to start: the oldest whose key has room (most_waiting:
  // of the key with the most buffered inputs, after pulling as far as the
  // buffer or what the input has now). Waits (holding nothing) while every
  // buffered input's key is full and the buffer is full or the input has
  // nothing more now. Empty at the end of the input once everything buffered
  // was handed out.
  asio::awaitable<std::optional<item>, Executor> next() {
    const Executor ex = co_await asio::this_coro::executor;
    bool scanned = false;  // limited: every ready key was asked since the last park
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
              // The keys before it were asked already: only the new one may
              // be free (oldest first; most_waiting chooses after the pulls).
              if (!state_->most_waiting()) {
                scanned = true;
                if (n->second.queue.size() == 1)
                  if (auto g = grab(n->first)) co_return hand_out(n, std::move(*g));
              }
            }
          }
          continue;
        }
      }
      if constexpr (limited) ask_ready(ex);
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
    co_await shared_->pulls->async_join(
        ex, asio::redirect_error(asio::use_awaitable_t<Executor>{}, ec));
    if constexpr (limited) {
      withdraw();
      co_await asks_->set->async_join(ex,
                                      asio::redirect_error(asio::use_awaitable_t<Executor>{}, ec));
    }
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
    if constexpr (!limited) {
      if (auto t = state_->take()) return item{std::move(t->first), std::move(t->second)};
      return std::nullopt;
    } else {
      std::optional<typename traits::grant> g;
      auto* n = state_->find_ready([&](const key_type& k) {
        g = grab(k);
        return g.has_value();
      });
      if (n == nullptr) return std::nullopt;
      return hand_out(n, std::move(*g));
    }
  }

  // limited: key k's grant if it is in hand or free now.
  std::optional<typename traits::grant> grab(const key_type& k) {
    std::optional<typename traits::grant> g;
    if (auto a = asks_->by_key.find(k); a != asks_->by_key.end() && !a->second.withdrawn) {
      if (!a->second.granted) return g;  // our wait for it is queued
      g = std::move(a->second.granted);
      asks_->by_key.erase(a);
      return g;
    }
    return traits::try_take(*limit_, k);
  }

  // limited: the head input of n's key with its grant; the other waits are
  // withdrawn.
  item hand_out(typename state::node* n, typename traits::grant g) {
    auto t = state_->take(n);
    t.first.reset();  // the limit holds the key's room
    withdraw();
    return item{std::move(g), std::move(t.second)};
  }

  // limited: one wait on the limit for every ready key that has none.
  void ask_ready(const Executor& ex) {
    if (asks_->set->running() == 0 && asks_->set->size() >= 64)
      asks_->set = std::make_shared<child_set>();  // finished slots go
    state_->find_ready([&](const key_type& k) {
      auto [a, made] = asks_->by_key.try_emplace(k);
      if (made) {
        a->second.child = asks_->set->size();  // (the wait may end inside spawn)
        asks_->set->spawn(ex, wait_for(asks_, state_, limit_, k));
      }
      return false;
    });
  }

  // limited: cancels every live wait and drops the grants in hand.
  void withdraw() {
    std::vector<std::size_t> cancel;
    for (auto a = asks_->by_key.begin(); a != asks_->by_key.end();) {
      if (!a->second.live) {
        a = asks_->by_key.erase(a);  // its grant goes back to the limit
        continue;
      }
      if (!std::exchange(a->second.withdrawn, true)) cancel.push_back(a->second.child);
      ++a;
    }
    auto set = asks_->set;
    for (std::size_t i : cancel) set->cancel(i);
  }

  static asio::awaitable<void, Executor> wait_for(std::shared_ptr<asks_type> as,
                                                  std::shared_ptr<state> st, Limit* l, key_type k) {
    std::optional<typename traits::grant> g;
    std::exception_ptr error;
    try {
      g.emplace(co_await traits::wait(*l, k));
    } catch (...) {
      error = std::current_exception();
    }
    auto a = as->by_key.find(k);  // there: a live wait's entry is kept
    a->second.live = false;
    if (!a->second.withdrawn && g) {
      a->second.granted = std::move(g);
    } else {
      if (!a->second.withdrawn && !st->error) st->error = error;  // the limit refused
      as->by_key.erase(a);  // (g, if any, goes back to the limit)
    }
    st->wake();
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
  [[no_unique_address]] std::conditional_t<limited, Limit*, no_asks> limit_{};
  std::shared_ptr<asks_type> asks_;
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
