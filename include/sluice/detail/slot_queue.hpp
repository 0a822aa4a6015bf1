// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_SLOT_QUEUE_HPP
#define SLUICE_DETAIL_SLOT_QUEUE_HPP

// What waits for a slot of a sluice::task_group: the children queued by
// spawn (FIFO, unstarted), then the producers waiting in spawn_when_ready
// (FIFO, each with its child). The group decides when a slot is free; this
// says what gets it.

#include <sluice/config.hpp>
#include <sluice/detail/producer_queue.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

namespace sluice::detail {

// Invariant: a producer gets a slot only while no queued child waits (queued
// children are older: they were accepted at once).
class slot_queue {
 public:
  void push(asio::awaitable<void> child) { children_.push_back(std::move(child)); }

  // The next child to start in a free slot: the oldest queued child, else the
  // oldest producer's (its spawn_when_ready resumes with true); empty if none.
  std::optional<asio::awaitable<void>> next() {
    if (!children_.empty()) {
      auto c = std::move(children_.front());
      children_.pop_front();
      return c;
    }
    if (!producers_.empty()) return producers_.grant_front();
    return std::nullopt;
  }

  // Drops every queued child unstarted and refuses every producer (false).
  void drop_all() {
    auto dropped = std::move(children_);  // destroyed unstarted at scope exit
    children_.clear();
    producers_.refuse_all();
  }

  [[nodiscard]] bool empty() const noexcept { return children_.empty() && producers_.empty(); }
  // Queued children (not the producers).
  [[nodiscard]] std::size_t size() const noexcept { return children_.size(); }
  [[nodiscard]] producer_queue<>& producers() noexcept { return producers_; }
  [[nodiscard]] const producer_queue<>& producers() const noexcept { return producers_; }

 private:
  std::deque<asio::awaitable<void>> children_;  // accepted, not started (FIFO)
  producer_queue<> producers_;                  // in spawn_when_ready (FIFO)
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_SLOT_QUEUE_HPP
