// SPDX-License-Identifier: BSL-1.0
// A user's program: Asio included first, sluice after it (the target's
// definitions make that work on clang too). Under Boost.Asio, the public API
// must read boost::asio types.
#if defined(EXPECT_BOOST_ASIO)
#if !defined(SLUICE_USE_BOOST_ASIO)
#error "the sluice::sluice target should have selected Boost.Asio"
#endif
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
namespace net = boost::asio;
using error_code = boost::system::error_code;
#else
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
namespace net = asio;
using error_code = std::error_code;
#endif
#include <sluice/sluice.hpp>

#include <type_traits>
#include <vector>

static_assert(std::is_same_v<sluice::error_code, error_code>);
static_assert(
    std::is_same_v<decltype(sluice::gather_with_concurrency(1, std::vector<net::awaitable<int>>{})),
                   net::awaitable<std::vector<int>>>);

net::awaitable<int> twice(int x) {
  co_return 2 * x;
}

int main() {
  net::io_context ctx;
  int sum = 0;
  net::co_spawn(
      ctx,
      [&]() -> net::awaitable<void> {
        std::vector<net::awaitable<int>> tasks;
        for (int i = 1; i <= 4; ++i) tasks.push_back(twice(i));
        for (int v : co_await sluice::gather_with_concurrency(2, std::move(tasks))) sum += v;
        sluice::semaphore sem{ctx.get_executor(), 1};
        sem.async_acquire([](error_code) {});
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  ctx.run();
  return sum == 20 ? 0 : 1;
}
