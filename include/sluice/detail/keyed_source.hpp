// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEYED_SOURCE_HPP
#define SLUICE_DETAIL_KEYED_SOURCE_HPP

// The machinery of sluice::by_key (by_key.hpp): an async source that a
// map_unordered pulls like any other, yielding its input's elements in the
// order "the oldest input whose key has room", each with a ticket that holds
// its key's room until the task that got it ends.
//
// key_state (shared by the source, every ticket and a pull in progress):
// - keys_: per key, running (tickets alive) and queue (inputs pulled, not
//   handed out, in input order: per-key FIFO). An entry exists only while
//   running > 0 or its queue is non-empty.
// - ready_: the keys with room (running < per_key) and a queued input, by
//   rank, then the sequence number of their oldest one: begin() is the input
//   that may start next. The rank is 0 for every key when oldest_first, else
//   the key's queue length, longest first (most_waiting). Invariant: a key is
//   in ready_ iff running < per_key and its queue is non-empty, under the
//   rank and sequence its entry has now (unready() before a change,
//   make_ready() after it).
// - buffered_ = the inputs in all queues <= buffer_ (the pull stops there:
//   backpressure on the input).
// - At most one pull of the input at a time; for an async input it runs as a
//   coroutine of its own (pulling_), so a key that frees meanwhile is served
//   at once, not after the pull. A pull or a ticket's release that makes an
//   input ready wakes the parked next() (one at most: map_unordered never
//   calls next() concurrently).

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/map_core.hpp>
#include <sluice/detail/range_holder.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace sluice::detail {

template <class U, class Key, class Hash>
class key_state : public std::enable_shared_from_this<key_state<U, Key, Hash>> {
 public:
  struct entry {
    std::size_t running = 0;
    std::deque<std::pair<std::uint64_t, U>> queue;
  };
  using map_type = std::unordered_map<Key, entry, Hash>;
  using node = typename map_type::value_type;

  // Holds one unit of its key's room; gives it back when destroyed.
  class ticket {
   public:
    ticket(std::shared_ptr<key_state> s, node* n) noexcept : s_(std::move(s)), n_(n) {}
    ticket(ticket&& o) noexcept : s_(std::move(o.s_)), n_(std::exchange(o.n_, nullptr)) {}
    ticket& operator=(ticket&& o) noexcept {
      if (this != &o) {
        reset();
        s_ = std::move(o.s_);
        n_ = std::exchange(o.n_, nullptr);
      }
      return *this;
    }
    ~ticket() { reset(); }
    void reset() noexcept {
      if (n_ != nullptr) std::exchange(s_, nullptr)->release(std::exchange(n_, nullptr));
    }

   private:
    std::shared_ptr<key_state> s_;
    node* n_;
  };

  key_state(std::size_t per_key, std::size_t buffer, bool most_waiting = false)
      : per_key_(per_key), buffer_(buffer), most_waiting_(most_waiting) {}

  // Queues `value` under `key` (the pull's result).
  void push(Key key, U value) {
    auto [it, made] = keys_.try_emplace(std::move(key));
    node* n = &*it;
    unready(n);
    n->second.queue.emplace_back(seq_++, std::move(value));
    ++buffered_;
    make_ready(n);
  }

  // The input that may start next (see ready_), with its ticket; empty if none.
  std::optional<std::pair<ticket, U>> take() {
    if (ready_.empty()) return std::nullopt;
    node* n = std::get<2>(*ready_.begin());
    ready_.erase(ready_.begin());
    entry& e = n->second;
    std::pair<ticket, U> out(ticket(this->shared_from_this(), n),
                             std::move(e.queue.front().second));
    e.queue.pop_front();
    --buffered_;
    ++e.running;
    make_ready(n);
    return out;
  }

  // The sequence number the next pushed input gets (its age among the inputs).
  [[nodiscard]] std::uint64_t next_seq() const noexcept { return seq_; }
  // The sequence number of the input take() would return; empty if none.
  [[nodiscard]] std::optional<std::uint64_t> ready_seq() const noexcept {
    if (ready_.empty()) return std::nullopt;
    return std::get<1>(*ready_.begin());
  }
  // Takes a sequence number for an input kept elsewhere (ages stay comparable).
  std::uint64_t take_seq() noexcept { return seq_++; }
  [[nodiscard]] bool most_waiting() const noexcept { return most_waiting_; }

  [[nodiscard]] bool has_room() const noexcept { return buffered_ < buffer_; }
  [[nodiscard]] std::size_t buffered() const noexcept { return buffered_; }
  [[nodiscard]] std::size_t keys() const noexcept { return keys_.size(); }
  [[nodiscard]] std::size_t per_key() const noexcept { return per_key_; }

  // Waits for wake(): void(error_code). Cancellation completes it with
  // operation_aborted. Completions are posted.
  template <class Executor>
  asio::awaitable<void, Executor> park(const Executor& ex) {
    error_code ec;
    auto token = asio::redirect_error(asio::use_awaitable_t<Executor>{}, ec);
    co_await asio::async_initiate<decltype(token), void(error_code)>(
        [this, ex](auto handler) {
          auto slot = asio::get_associated_cancellation_slot(handler);
          if (slot.is_connected()) {
            slot.assign([this](asio::cancellation_type type) {
              if (type != asio::cancellation_type::none && parked_)
                std::exchange(parked_, {}).complete(asio::error::operation_aborted);
            });
          }
          parked_ = erased_handler<error_code>(std::move(handler), ex);
        },
        token);
    if (ec) throw system_error(ec, "sluice::by_key");
  }

  void wake() {
    if (parked_) std::exchange(parked_, {}).complete(error_code());
  }

  bool pulling = false;      // a pull of an async input runs
  bool input_done = false;   // the input has ended
  std::exception_ptr error;  // the input's (or the key function's) failure

 private:
  using rank_key = std::tuple<std::size_t, std::uint64_t, node*>;

  [[nodiscard]] rank_key rank(node* n) const noexcept {
    const entry& e = n->second;
    const std::size_t r = most_waiting_ ? static_cast<std::size_t>(-1) - e.queue.size() : 0;
    return {r, e.queue.front().first, n};
  }
  void unready(node* n) {
    const entry& e = n->second;
    if (e.running < per_key_ && !e.queue.empty()) ready_.erase(rank(n));
  }
  // (noexcept enough in release(): a node of a small set)
  void make_ready(node* n) {
    const entry& e = n->second;
    if (e.running < per_key_ && !e.queue.empty()) ready_.insert(rank(n));
  }

  void release(node* n) noexcept {
    entry& e = n->second;
    --e.running;
    if (e.running + 1 == per_key_ && !e.queue.empty()) {
      make_ready(n);
      wake();
    } else if (e.running == 0 && e.queue.empty()) {
      keys_.erase(n->first);
    }
  }

  std::size_t per_key_;
  std::size_t buffer_;
  bool most_waiting_;
  std::size_t buffered_ = 0;
  std::uint64_t seq_ = 0;
  map_type keys_;
  std::set<rank_key> ready_;
  erased_handler<error_code> parked_;
};

// What the source hands the worker: the input and its ticket.
template <class U, class Ticket>
struct keyed_input {
  Ticket ticket;
  U value;
};

// The async source over `In` (a range or an async source).
template <class In, class KeyFn, class Executor>
class keyed_source {
  static constexpr bool is_async = fan_out_input_traits<In>::is_async;
  using value_type = typename fan_out_input_traits<In>::value_type;
  using key_type = std::remove_cvref_t<std::invoke_result_t<KeyFn&, const value_type&>>;
  using state = key_state<value_type, key_type, std::hash<key_type>>;
  using input_type = std::conditional_t<is_async, range_holder<In>, range_cursor<In>>;

  // The input and the key function: shared with a pull in progress.
  struct shared {
    shared(In&& in, KeyFn k) : input(std::forward<In>(in)), key(std::move(k)) {}
    input_type input;
    KeyFn key;
    std::shared_ptr<child_set> pulls = std::make_shared<child_set>();  // the pull in progress
  };

 public:
  using item = keyed_input<value_type, typename state::ticket>;

  keyed_source(In&& in, KeyFn key, std::size_t per_key, std::size_t buffer, bool most_waiting)
      : state_(std::make_shared<state>(per_key, buffer, most_waiting)),
        shared_(std::make_shared<shared>(std::forward<In>(in), std::move(key))) {}

  // The next input to start: the oldest whose key has room (most_waiting:
  // of the key with the most buffered inputs, after pulling as far as the
  // buffer or what the input has now). Waits (holding nothing) while every
  // buffered input's key is full and the buffer is full or the input has
  // nothing more now. Empty at the end of the input once everything buffered
  // was handed out.
  asio::awaitable<std::optional<item>, Executor> next() {
    const Executor ex = co_await asio::this_coro::executor;
    for (;;) {
      if (auto e = std::exchange(state_->error, nullptr)) std::rethrow_exception(e);
      const bool can_pull = !state_->input_done && !state_->pulling && state_->has_room();
      if (!(can_pull && state_->most_waiting()))
        if (auto t = state_->take()) co_return item{std::move(t->first), std::move(t->second)};
      if (state_->input_done && !state_->pulling && state_->buffered() == 0) co_return std::nullopt;
      if (can_pull) {
        if constexpr (is_async) {
          state_->pulling = true;
          shared_->pulls->spawn(ex, pull(state_, shared_));
          if (!state_->pulling) continue;  // it finished inside spawn (co_spawn dispatches)
          if (auto t = state_->take()) co_return item{std::move(t->first), std::move(t->second)};
        } else {
          if (shared_->input.done()) {
            state_->input_done = true;
          } else {
            auto v = shared_->input.take();
            auto k = std::invoke(shared_->key, std::as_const(v));
            state_->push(std::move(k), std::move(v));
          }
          continue;
        }
      }
      co_await state_->park(ex);
    }
  }

  // Cancels a pull in progress and waits for it, then closes an owned input
  // that has close() (map_unordered calls it when the stream stops).
  asio::awaitable<void, Executor> close() {
    shared_->pulls->cancel_all();
    error_code ec;
    const Executor ex = co_await asio::this_coro::executor;
    co_await shared_->pulls->async_join(
        ex, asio::redirect_error(asio::use_awaitable_t<Executor>{}, ec));
    if constexpr (is_async && !std::is_reference_v<In>) {
      if constexpr (requires(std::remove_reference_t<In> & s) {
                      { s.close() } -> std::same_as<asio::awaitable<void, Executor>>;
                    }) {
        co_await shared_->input.get().close();
      }
    }
  }

 private:
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
};

// The function the map applies: runs fn on the input while its ticket holds
// the key's room.
template <class F>
struct keyed_call {
  F fn;
  template <class Item,
            class Task = std::invoke_result_t<F&, decltype(std::declval<Item&>().value)>>
  Task operator()(Item item) {
    auto held = std::move(item.ticket);  // released when this task ends
    if constexpr (std::is_void_v<task_result_t<Task>>) {
      co_await std::invoke(fn, std::move(item.value));
    } else {
      co_return co_await std::invoke(fn, std::move(item.value));
    }
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEYED_SOURCE_HPP
