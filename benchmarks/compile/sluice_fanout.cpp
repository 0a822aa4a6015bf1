// SPDX-License-Identifier: BSL-1.0
// make compile-bench: the 10 tasks of asio_fanout.cpp through gather_with_concurrency, a
// semaphore and for_each(map_unordered), each from its own header.
#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/semaphore.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <vector>

sluice::semaphore sem{4};

asio::awaitable<int> task(int i) {
  auto permit = co_await sem.scoped_acquire();
  co_await asio::post(asio::use_awaitable);
  co_return i;
}

asio::awaitable<void> run(int& sum) {
  std::vector<asio::awaitable<int>> tasks;
  for (int i = 0; i < 10; ++i) tasks.push_back(task(i));
  for (int r : co_await sluice::gather_with_concurrency(4, std::move(tasks))) sum += r;
  std::vector<int> ids{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  co_await sluice::for_each(sluice::map_unordered(task, ids, 4), [&](int r) { sum += r; });
}

int main() {
  asio::io_context ctx;
  int sum = 0;
  asio::co_spawn(ctx, run(sum), asio::detached);
  ctx.run();
  return sum == 90 ? 0 : 1;
}
