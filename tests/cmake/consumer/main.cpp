// SPDX-License-Identifier: BSL-1.0
// A user's program: Asio included first, sluice after it (the target's
// definitions make that work on clang too).
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <sluice/sluice.hpp>

#include <vector>

asio::awaitable<int> twice(int x) {
  co_return 2 * x;
}

int main() {
  asio::io_context ctx;
  int sum = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<int>> tasks;
        for (int i = 1; i <= 4; ++i) tasks.push_back(twice(i));
        for (int v : co_await sluice::gather_with_concurrency(2, std::move(tasks))) sum += v;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  ctx.run();
  return sum == 20 ? 0 : 1;
}
