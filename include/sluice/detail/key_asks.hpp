// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEY_ASKS_HPP
#define SLUICE_DETAIL_KEY_ASKS_HPP

// A keyed fan-out's waits on a keyed limit the user owns (keyed_semaphore,
// keyed_rate_limiter; detail/keyed_limit.hpp): sluice::by_key(key, limit)'s
// source (detail/keyed_source.hpp) and keyed_task_group::run(n, limit, ...).
//
// The key_state (detail/key_queues.hpp) has no per-key bound, so every key
// with queued items is "ready" to it; the limit decides. take(), called only
// while the fan-out has a free slot, hands out the head item of the first
// ready key in take()'s order whose grant is in hand or free now
// (try_take), with the grant (the task's ticket). If none, the owner calls
// ask_ready(): one wait on the limit per ready key, at most one per key; a
// wait that ends calls on_change (with the limit's error if it refused, e.g.
// its shed bound), and the owner tries take() again (at once, without
// parking, when the wait ended inside ask_ready). When take() hands out
// an item, and when the owner has no free slot (withdraw()), the other waits
// are withdrawn: cancelled (a grant racing the cancellation is handed on by
// the limit) and grants already in hand dropped, which gives them back. So a
// key is asked for only while a slot is free and a grant is never kept
// without its task, at the price of the fan-out's place in the limit's queue.
//
// asks_: per key, the wait's child index in set_, live (the wait runs),
// withdrawn, and its grant once it ended with one. An entry is erased when
// its wait ended withdrawn or failed, or its grant was taken or dropped; a
// key with an entry gets no second wait. join() withdraws and awaits every
// wait (the owner's end: nothing it started outlives it).

#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/keyed_limit.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::detail {

template <class State, class Limit>
class key_asks : public std::enable_shared_from_this<key_asks<State, Limit>> {
  using traits = keyed_limit_traits<Limit>;
  using key_type = typename State::key_type;
  using node = typename State::node;

 public:
  using grant = typename traits::grant;
  using ticket = grant;  // what a task holds for its run
  using taken = std::pair<grant, typename State::value_type>;

  // on_change(error): a wait ended (error: the limit refused it).
  key_asks(std::shared_ptr<State> st, Limit& l, std::function<void(std::exception_ptr)> on_change)
      : st_(std::move(st)), limit_(&l), on_change_(std::move(on_change)) {}

  // Before the first take: the limit learns the fan-out's executor (its
  // clock; keyed_limit_traits::bind). Once; throws what the limit throws.
  template <class Executor>
  void bind(const Executor& ex) {
    if (bound_) return;
    traits::bind(*limit_, asio::any_io_executor(ex));
    bound_ = true;
  }

  // The head item of the first ready key whose grant is in hand or free.
  std::optional<taken> take() {
    std::optional<grant> g;
    node* n = st_->find_ready([&](const key_type& k) {
      g = grab(k);
      return g.has_value();
    });
    if (n == nullptr) return std::nullopt;
    return hand_out(n, std::move(*g));
  }

  // As take(), for n's key only (its head item was just pushed: the keys
  // before it were tried already).
  std::optional<taken> take_pushed(node* n) {
    if (n->second.queue.size() != 1) return std::nullopt;
    if (auto g = grab(n->first)) return hand_out(n, std::move(*g));
    return std::nullopt;
  }

  // One wait on the limit for every ready key that has none. True if a wait
  // ended inside (a limit that answers without suspending: its on_change
  // came before the owner parked): the owner tries again instead of parking.
  bool ask_ready(const asio::any_io_executor& ex) {
    const std::size_t ended = ended_;
    if (set_->running() == 0 && set_->size() >= 64) set_ = child_set::make();  // finished slots go
    st_->find_ready([&](const key_type& k) {
      auto [a, made] = asks_.try_emplace(k);
      if (made) {
        a->second.child = set_->size();  // (the wait may end inside spawn)
        set_->spawn(ex, wait_for(this->shared_from_this(), k));
      }
      return false;
    });
    return ended_ != ended;
  }

  // Cancels every live wait and drops the grants in hand.
  void withdraw() {
    std::vector<std::size_t> cancel;
    for (auto a = asks_.begin(); a != asks_.end();) {
      if (!a->second.live) {
        a = asks_.erase(a);  // its grant goes back to the limit
        continue;
      }
      if (!std::exchange(a->second.withdrawn, true)) cancel.push_back(a->second.child);
      ++a;
    }
    auto set = set_;
    for (std::size_t i : cancel) set->cancel(i);
  }

  // Withdraws every wait and awaits it.
  template <class Executor>
  asio::awaitable<void, Executor> join(Executor ex) {
    withdraw();
    error_code ec;
    co_await set_->join(ex, ec);
  }

 private:
  struct ask {
    std::size_t child = 0;
    bool live = true;
    bool withdrawn = false;
    std::optional<grant> granted;
  };

  // Key k's grant if it is in hand or free now.
  std::optional<grant> grab(const key_type& k) {
    std::optional<grant> g;
    if (auto a = asks_.find(k); a != asks_.end() && !a->second.withdrawn) {
      if (!a->second.granted) return g;  // our wait for it is queued
      g = std::move(a->second.granted);
      asks_.erase(a);
      return g;
    }
    return traits::try_take(*limit_, k);
  }

  // The head item of n's key with its grant; the other waits are withdrawn.
  taken hand_out(node* n, grant g) {
    auto t = st_->take(n);
    t.first.reset();  // the limit holds the key's room
    withdraw();
    return taken(std::move(g), std::move(t.second));
  }

  static asio::awaitable<void> wait_for(std::shared_ptr<key_asks> self, key_type k) {
    std::optional<grant> g;
    std::exception_ptr error;
    try {
      g.emplace(co_await traits::wait(*self->limit_, k));
    } catch (...) {
      error = std::current_exception();
    }
    ++self->ended_;
    auto a = self->asks_.find(k);  // there: a live wait's entry is kept
    a->second.live = false;
    const bool withdrawn = a->second.withdrawn;
    if (!withdrawn && g) {
      a->second.granted = std::move(g);
    } else {
      self->asks_.erase(a);  // (g, if any, goes back to the limit)
    }
    self->on_change_(withdrawn ? nullptr : error);
  }

  std::shared_ptr<State> st_;
  Limit* limit_;
  std::function<void(std::exception_ptr)> on_change_;
  std::unordered_map<key_type, ask, typename State::hash_type> asks_;
  std::shared_ptr<child_set> set_ = child_set::make();
  std::size_t ended_ = 0;  // waits ended so far
  bool bound_ = false;     // bind() done
};

// keyed_task_group's waits on a keyed limit the caller owns
// (run(limit, keyed, ...)), type-erased so that the group's type does not
// name the limit.
struct key_gate {
  virtual ~key_gate() = default;
  // A waiting child whose grant is in hand or free, wrapped to hold it.
  virtual std::optional<asio::awaitable<void>> take() = 0;
  // True if a wait ended already (see key_asks::ask_ready).
  virtual bool ask(const asio::any_io_executor& ex) = 0;
  virtual void withdraw() = 0;
  virtual asio::awaitable<void> join(asio::any_io_executor ex) = 0;
};

template <class State, class Limit>
struct key_gate_for final : key_gate {
  using asks = key_asks<State, Limit>;
  // The limit bound to `ex`'s clock (key_asks::bind).
  key_gate_for(std::shared_ptr<State> st, Limit& l,
               std::function<void(std::exception_ptr)> on_change, const asio::any_io_executor& ex)
      : a(std::make_shared<asks>(std::move(st), l, std::move(on_change))) {
    a->bind(ex);
  }
  std::optional<asio::awaitable<void>> take() override {
    auto t = a->take();
    if (!t) return std::nullopt;
    return holding(std::move(t->first), std::move(t->second));
  }
  bool ask(const asio::any_io_executor& ex) override { return a->ask_ready(ex); }
  void withdraw() override { a->withdraw(); }
  asio::awaitable<void> join(asio::any_io_executor ex) override { return a->join(ex); }
  // The child, holding its grant for its run (a rate start is spent now).
  static asio::awaitable<void> holding(typename asks::grant g, asio::awaitable<void> child) {
    if constexpr (requires { g.spend(); }) g.spend();
    co_await std::move(child);
  }
  std::shared_ptr<asks> a;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEY_ASKS_HPP
