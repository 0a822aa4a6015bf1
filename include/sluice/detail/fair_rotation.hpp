// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_FAIR_ROTATION_HPP
#define SLUICE_DETAIL_FAIR_ROTATION_HPP

// The two parts shared by fair_semaphore and fair_limit: the deficit round
// robin over the keys with waiters (fair_rotation), and the record of the last
// grants that per-key shares are read from (grant_window).
//
// An Entry (one key) has: `double weight`, `double deficit`, `bool active`
// (in the rotation), `std::size_t in_window` (units among the window's grants).

#include <sluice/config.hpp>
#include <sluice/detail/doubles.hpp>

#include <cstddef>
#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::detail {

// Deficit round robin in units of cost: the key at the front gets `weight`
// units of credit when its credit does not cover its oldest waiter's cost,
// and serves waiters while it does; then it goes to the back (credit kept
// while it still waits, dropped when it has no waiter left). Over every
// backlogged key, the units served follow the weights, within one cost.
// A whole pass in which no key could serve (costs far above the weights)
// credits every key the rounds the nearest one still needed at once, so a
// grant never walks more than two passes.
template <class Entry>
class fair_rotation {
 public:
  // `e` has a waiter now: it joins at the back unless it is in turn already.
  void join(Entry* e) {
    if (e->active) return;
    e->active = true;
    order_.push_back(e);
  }

  // Serves the next waiter: `head_cost(e)` is the cost of e's oldest waiter
  // (0: e has none left, its waiters were cancelled); `serve(e, cost)` grants
  // it (it is no longer e's head afterwards); `left(e)` runs for an entry that
  // leaves the rotation without waiters (to free it). False: nobody waits.
  template <class HeadCost, class Serve, class Left>
  bool serve_next(HeadCost head_cost, Serve serve, Left left) {
    std::size_t missed = 0;
    while (!order_.empty()) {
      Entry* e = order_.front();
      const double cost = static_cast<double>(head_cost(e));
      if (cost == 0) {
        drop_front();
        left(e);
        missed = 0;
        continue;
      }
      if (e->deficit < cost) {
        e->deficit += e->weight;
        if (e->deficit < cost) {  // saves up over rounds
          order_.pop_front();
          order_.push_back(e);
          if (++missed >= order_.size()) {
            skip_rounds(head_cost);
            missed = 0;
          }
          continue;
        }
      }
      e->deficit -= cost;
      serve(e, static_cast<std::size_t>(cost));
      const double next = static_cast<double>(head_cost(e));
      if (next == 0) {
        drop_front();
      } else if (e->deficit < next) {
        order_.pop_front();
        order_.push_back(e);
      }
      return true;
    }
    return false;
  }

  // Keys in the rotation (some may have no waiter left until their turn).
  [[nodiscard]] const std::deque<Entry*>& keys() const noexcept { return order_; }

 private:
  void drop_front() {
    Entry* e = order_.front();
    order_.pop_front();
    e->active = false;
    e->deficit = 0;
  }

  // Every key has had a turn without reaching its cost: credits each the
  // rounds the closest key still needs, less the one its next turn adds.
  template <class HeadCost>
  void skip_rounds(HeadCost& head_cost) {
    double rounds = -1;
    for (Entry* e : order_) {
      const double cost = static_cast<double>(head_cost(e));
      if (cost == 0) continue;
      const double r = detail::ceil((cost - e->deficit) / e->weight);
      if (rounds < 0 || r < rounds) rounds = r;
    }
    if (rounds <= 1) return;
    for (Entry* e : order_) e->deficit += (rounds - 1) * e->weight;
  }

  std::deque<Entry*> order_;  // keys with waiters, in turn order
};

// The last `size` grants, for the per-key shares: each grant's entry and
// units; an entry's `in_window` is its units among them.
template <class Entry>
class grant_window {
 public:
  explicit grant_window(std::size_t size) : size_(size) {}

  // Records a grant of `units` to `e`; `evicted(old)` runs for the entry
  // whose grant left the window (to free it once idle).
  template <class Evicted>
  void record(Entry* e, std::size_t units, Evicted evicted) {
    e->in_window += units;
    total_ += units;
    if (ring_.size() < size_) {
      ring_.emplace_back(e, units);
      return;
    }
    auto old = std::exchange(ring_[next_], {e, units});
    next_ = (next_ + 1) % size_;
    old.first->in_window -= old.second;
    total_ -= old.second;
    if (old.first != e) evicted(old.first);
  }

  // e's part of the units in the window (0 when it is empty).
  [[nodiscard]] double share(const Entry& e) const noexcept {
    return total_ == 0 ? 0.0 : double(e.in_window) / double(total_);
  }

 private:
  std::size_t size_;
  std::vector<std::pair<Entry*, std::size_t>> ring_;
  std::size_t next_ = 0;  // the oldest of ring_ once it is full
  std::size_t total_ = 0;
};

// The weights set per key, kept while a key has no entry (default 1).
template <class Key, class Hash = std::hash<Key>, class KeyEqual = std::equal_to<Key>>
class fair_weights {
 public:
  // Keeps `w` for `key` and gives it to the key's entry in `map`, if any.
  // `who` names the limit in the error.
  template <class Map>
  void set(Map& map, const Key& key, double w, const char* who) {
    if (!(w > 0) || !is_finite(w))
      throw std::invalid_argument(std::string(who) + "::set_weight: weight must be > 0");
    weights_[key] = w;
    if (auto it = map.find(key); it != map.end()) it->second.weight = w;
  }
  [[nodiscard]] double of(const Key& key) const {
    auto it = weights_.find(key);
    return it == weights_.end() ? 1.0 : it->second;
  }

 private:
  std::unordered_map<Key, double, Hash, KeyEqual> weights_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_FAIR_ROTATION_HPP
