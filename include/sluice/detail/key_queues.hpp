// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEY_QUEUES_HPP
#define SLUICE_DETAIL_KEY_QUEUES_HPP

// Per-key queues with a limit per key, shared by sluice::by_key's source
// (detail/keyed_source.hpp) and sluice::keyed_task_group: items wait in
// their key's FIFO queue; take() hands out the next one whose key has room,
// with a ticket that holds that room until it is destroyed.
//
// key_state (shared by its owner, every ticket and a pull in progress):
// - keys_: per key, running (tickets alive) and queue (items pushed, not
//   handed out, in push order: per-key FIFO). An entry exists only while
//   running > 0 or its queue is non-empty.
// - ready_: the keys with room (running < per_key) and a queued item, by
//   rank, then the sequence number of their oldest one: begin() is the item
//   that may start next. The rank is 0 for every key when oldest first, else
//   the key's queue length, longest first (most_waiting). Invariant: a key is
//   in ready_ iff running < per_key and its queue is non-empty, under the
//   rank and sequence its entry has now (unready() before a change,
//   make_ready() after it).
// - buffered_ = the items in all queues; has_room() while it is below buffer_.
// - park()/wake(): one waiter (by_key's next()) for "an item became ready".

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>
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
  using key_type = Key;
  using value_type = U;
  using hash_type = Hash;

  // Holds one unit of its key's room; gives it back when destroyed.
  class ticket {
   public:
    ticket() noexcept = default;  // holds nothing
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
    node* n_ = nullptr;
  };

  key_state(std::size_t per_key, std::size_t buffer, bool most_waiting = false)
      : per_key_(per_key), buffer_(buffer), most_waiting_(most_waiting) {}

  // Queues `value` under `key` (the pull's result); returns the key's node.
  node* push(Key key, U value) {
    auto [it, made] = keys_.try_emplace(std::move(key));
    node* n = &*it;
    unready(n);
    n->second.queue.emplace_back(seq_++, std::move(value));
    ++buffered_;
    make_ready(n);
    return n;
  }

  // The input that may start next (see ready_), with its ticket; empty if none.
  std::optional<std::pair<ticket, U>> take() {
    if (ready_.empty()) return std::nullopt;
    return take(std::get<2>(*ready_.begin()));
  }

  // The first key with room and a queued item, in take()'s order, for which
  // pick(key) is true; null if none. (by_key with a keyed limit: pick asks
  // the limit.)
  template <class Pick>
  node* find_ready(Pick&& pick) {
    for (const auto& r : ready_)
      if (pick(std::as_const(std::get<2>(r)->first))) return std::get<2>(r);
    return nullptr;
  }

  // The oldest item of n's key, which find_ready() returned, with its ticket.
  std::pair<ticket, U> take(node* n) {
    ready_.erase(rank(n));
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

  // Drops every queued item (destroyed unhanded); running tickets stay valid.
  void drop_queued() {
    ready_.clear();
    buffered_ = 0;
    for (auto it = keys_.begin(); it != keys_.end();) {
      it->second.queue.clear();
      it = it->second.running == 0 ? keys_.erase(it) : std::next(it);
    }
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

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEY_QUEUES_HPP
