// SPDX-License-Identifier: BSL-1.0
// make compile-bench: a coroutine awaiting 10 tasks in a loop with Asio alone, the baseline of
// sluice_fanout.cpp.
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <vector>

asio::awaitable<int> task(int i) {
  co_await asio::post(asio::use_awaitable);
  co_return i;
}

asio::awaitable<void> run(int& sum) {
  std::vector<int> results;
  for (int i = 0; i < 10; ++i) results.push_back(co_await task(i));
  for (int r : results) sum += r;
}

int main() {
  asio::io_context ctx;
  int sum = 0;
  asio::co_spawn(ctx, run(sum), asio::detached);
  ctx.run();
  return sum == 45 ? 0 : 1;
}
