// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEYED_GATHER_HPP
#define SLUICE_DETAIL_KEYED_GATHER_HPP

// gather_with_concurrency(limit, tasks, by_key(key, per_key)) (by_key.hpp):
// the tasks, each with its index, become an async source that a keyed
// map_unordered pulls (key(index) is the task's key); its results, each with
// its index, are put back in input order. Fail fast, cancellation and the
// join are the stream's and for_each's; settling catches each task's
// exception into its outcome, so the stream itself never fails on a task.

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/range_holder.hpp>
#include <sluice/detail/ranges.hpp>
#include <sluice/for_each.hpp>
#include <sluice/outcome.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace sluice::detail {

// The tasks of R with their indices, as an async source (pulled one next()
// at a time). Owns the range when R is not a reference.
template <class R>
class indexed_tasks {
 public:
  using task_type = std::ranges::range_value_t<R>;
  using executor_type = task_executor_t<task_type>;
  using item = std::pair<std::size_t, task_type>;

  explicit indexed_tasks(R&& r) : in_(std::make_unique<range_cursor<R>>(std::forward<R>(r))) {}

  asio::awaitable<std::optional<item>, executor_type> next() {
    if (in_->done()) co_return std::nullopt;
    item out(at_, in_->take());
    ++at_;
    co_return out;
  }

 private:
  std::unique_ptr<range_cursor<R>> in_;
  std::size_t at_ = 0;
};

// key(index) for the source's items.
template <class KeyFn>
struct index_key {
  KeyFn key;
  template <class Item>
  auto operator()(const Item& item) {
    return key(item.first);
  }
};

// Awaits the task; its result (an outcome when settling) with its index.
template <bool Settle, class Task>
struct run_indexed {
  using value = task_result_t<Task>;
  using stored =
      std::conditional_t<Settle, outcome<value>,
                         std::conditional_t<std::is_void_v<value>, std::monostate, value>>;
  using executor = task_executor_t<Task>;

  asio::awaitable<std::pair<std::size_t, stored>, executor> operator()(
      std::pair<std::size_t, Task> item) const {
    const std::size_t i = item.first;
    if constexpr (Settle) {
      try {
        if constexpr (std::is_void_v<value>) {
          co_await std::move(item.second);
          co_return std::pair<std::size_t, stored>(i, stored());
        } else {
          co_return std::pair<std::size_t, stored>(i, stored(co_await std::move(item.second)));
        }
      } catch (...) {
        co_return std::pair<std::size_t, stored>(i, stored(std::current_exception()));
      }
    } else if constexpr (std::is_void_v<value>) {
      co_await std::move(item.second);
      co_return std::pair<std::size_t, stored>(i, stored());
    } else {
      co_return std::pair<std::size_t, stored>(i, co_await std::move(item.second));
    }
  }
};

// Reads the stream to its end and returns the results in input order
// (nothing for a fail-fast gather of void tasks).
template <bool Settle, class Task, class Stream>
auto keyed_gather(Stream s)
    -> asio::awaitable<std::conditional_t<!Settle && std::is_void_v<task_result_t<Task>>, void,
                                          std::vector<typename run_indexed<Settle, Task>::stored>>,
                       task_executor_t<Task>> {
  using stored = typename run_indexed<Settle, Task>::stored;
  std::vector<std::optional<stored>> slots;
  co_await sluice::for_each(std::move(s), [&](std::pair<std::size_t, stored> r) {
    if (r.first >= slots.size()) slots.resize(r.first + 1);
    slots[r.first].emplace(std::move(r.second));
  });
  if constexpr (Settle || !std::is_void_v<task_result_t<Task>>) {
    std::vector<stored> out;
    out.reserve(slots.size());
    for (auto& slot : slots) out.push_back(std::move(*slot));
    co_return out;
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEYED_GATHER_HPP
