// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_LAZY_TASKS_HPP
#define SLUICE_TESTS_SUPPORT_LAZY_TASKS_HPP

// A lazy input range of tasks, made one at a time by `make(i)` as the
// consumer advances it, counting what was pulled. It can be told to throw when
// item `throw_at` is pulled. Hand-written because clang 14 cannot instantiate
// libstdc++'s std::views.

#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>

namespace sluice_test {

struct input_broken : std::runtime_error {
  input_broken() : std::runtime_error("the input range broke") {}
};

template <class Task>
class lazy_tasks {
  struct state {
    std::size_t n;
    std::function<Task(std::size_t)> make;
    std::size_t pulled = 0;
    std::size_t throw_at = static_cast<std::size_t>(-1);
  };

 public:
  class iterator {
   public:
    using value_type = Task;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(state* s) : s_(s) {}
    Task operator*() const {
      if (s_->pulled == s_->throw_at) throw input_broken();
      return s_->make(s_->pulled);
    }
    iterator& operator++() {
      ++s_->pulled;
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) {
      return it.s_->pulled >= it.s_->n;
    }

   private:
    state* s_ = nullptr;
  };

  lazy_tasks(std::size_t n, std::function<Task(std::size_t)> make)
      : s_(std::make_shared<state>(state{n, std::move(make)})) {}

  iterator begin() { return iterator(s_.get()); }
  std::default_sentinel_t end() { return {}; }

  // Items taken from the range so far.
  std::size_t pulled() const { return s_->pulled; }
  void throw_at(std::size_t i) { s_->throw_at = i; }

 private:
  std::shared_ptr<state> s_;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_LAZY_TASKS_HPP
