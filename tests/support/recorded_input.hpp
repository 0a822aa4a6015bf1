// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_RECORDED_INPUT_HPP
#define SLUICE_TESTS_SUPPORT_RECORDED_INPUT_HPP

// Instrumented inputs for fan-out tests, hand-written because clang 14 cannot
// instantiate libstdc++'s std::views:
// - recorded_input<T>: a lazy input range over a list of values that tells a
//   hook when each item is pulled and when its end is seen ("iter end"), and
//   can be told to throw when item `throw_at` is pulled;
// - recorded_source<T>: the same as an async source whose next() waits
//   `delay` (virtual time) first and counts how many next() calls overlap.

#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sluice_test {

struct input_failure : std::runtime_error {
  input_failure() : std::runtime_error("the input failed") {}
};

template <class T>
class recorded_input {
  struct state {
    std::vector<T> items;
    std::function<void(std::size_t)> on_pull;  // index of the item pulled
    std::function<void()> on_end;              // the end was seen
    std::size_t pulled = 0;
    std::size_t throw_at = static_cast<std::size_t>(-1);
    bool end_seen = false;
  };

 public:
  class iterator {
   public:
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(state* s) : s_(s) {}
    T operator*() const {
      if (s_->pulled == s_->throw_at) throw input_failure();
      if (s_->on_pull) s_->on_pull(s_->pulled);
      return s_->items[s_->pulled];
    }
    iterator& operator++() {
      ++s_->pulled;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) {
      const bool end = it.s_->pulled >= it.s_->items.size();
      if (end && !it.s_->end_seen) {
        it.s_->end_seen = true;
        if (it.s_->on_end) it.s_->on_end();
      }
      return end;
    }

   private:
    state* s_ = nullptr;
  };

  explicit recorded_input(std::vector<T> items) : s_(std::make_shared<state>()) {
    s_->items = std::move(items);
  }

  iterator begin() { return iterator(s_.get()); }
  std::default_sentinel_t end() { return {}; }

  void on_pull(std::function<void(std::size_t)> f) { s_->on_pull = std::move(f); }
  void on_end(std::function<void()> f) { s_->on_end = std::move(f); }
  void throw_at(std::size_t i) { s_->throw_at = i; }
  std::size_t pulled() const { return s_->pulled; }
  bool end_seen() const { return s_->end_seen; }

 private:
  std::shared_ptr<state> s_;
};

template <class T>
class recorded_source {
  struct state {
    std::vector<T> items;
    std::chrono::nanoseconds delay{0};
    std::size_t pulled = 0;
    std::size_t calls = 0;
    std::size_t active = 0;
    std::size_t max_active = 0;
    std::size_t throw_at = static_cast<std::size_t>(-1);
  };

 public:
  recorded_source(std::vector<T> items, std::chrono::nanoseconds delay)
      : s_(std::make_shared<state>()) {
    s_->items = std::move(items);
    s_->delay = delay;
  }

  asio::awaitable<std::optional<T>> next() {
    auto s = s_;
    ++s->calls;
    s->max_active = std::max(s->max_active, ++s->active);
    struct leave {
      state* s;
      ~leave() { --s->active; }
    } guard{s.get()};
    co_await sluice::sleep(s->delay);
    if (s->pulled == s->throw_at) throw input_failure();
    if (s->pulled >= s->items.size()) co_return std::nullopt;
    co_return s->items[s->pulled++];
  }

  void throw_at(std::size_t i) { s_->throw_at = i; }
  std::size_t pulled() const { return s_->pulled; }
  std::size_t calls() const { return s_->calls; }
  std::size_t max_active() const { return s_->max_active; }

 private:
  std::shared_ptr<state> s_;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_RECORDED_INPUT_HPP
