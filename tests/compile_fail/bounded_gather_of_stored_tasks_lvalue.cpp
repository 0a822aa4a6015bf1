// SPDX-License-Identifier: BSL-1.0
// clang-format off
// expect: sluice::gather / gather_with_concurrency: `tasks` holds stored asio::awaitable<T>s and is passed as an lvalue
#include <sluice/gather.hpp>

#include <list>

asio::awaitable<void> task();

asio::awaitable<void> misuse() {
  std::list<asio::awaitable<void>> tasks;
  tasks.push_back(task());
  co_await sluice::gather_with_concurrency(2, tasks);
  co_await sluice::gather_with_concurrency(2, tasks, sluice::return_exceptions);
}
