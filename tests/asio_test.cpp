// SPDX-License-Identifier: BSL-1.0
// <sluice/asio.hpp> and the ways to name Asio that compile on g++ and clang++
// with standalone Asio and with Boost.Asio (this file is built in every
// configuration of the suite). It includes no test header: the public
// headers alone must be enough.
#include <sluice/asio.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <type_traits>

using namespace std::chrono_literals;

// A name of your own at global scope (not `namespace asio = sluice::asio;`,
// which clang rejects on standalone Asio: `redefinition of 'asio'`).
namespace net = sluice::asio;

// The alias inside your own namespace.
namespace app {
namespace asio = sluice::asio;

inline asio::awaitable<int> twice(int x) {
  co_await sluice::sleep(1s);
  co_return 2 * x;
}
}  // namespace app

TEST_CASE("sluice/asio.hpp names the configured Asio as asio on either backend", "[asio]") {
  STATIC_REQUIRE(std::is_same_v<asio::io_context, sluice::asio::io_context>);
  STATIC_REQUIRE(std::is_same_v<asio::awaitable<int>, sluice::asio::awaitable<int>>);
  asio::io_context ctx;
  sluice::semaphore sem{ctx.get_executor(), 1};
  bool ran = false;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        using namespace asio::experimental::awaitable_operators;  // from the header too
        auto permit = co_await sem.scoped_acquire();
        asio::steady_timer t(co_await asio::this_coro::executor);
        t.expires_after(1ms);
        co_await (t.async_wait(asio::use_awaitable) || sem.acquire());
        ran = true;
      },
      asio::detached);
  ctx.run();
  CHECK(ran);
  CHECK(sem.value() == 1);
}

TEST_CASE("a global alias of another name and an alias inside a namespace both compile", "[asio]") {
  STATIC_REQUIRE(std::is_same_v<net::io_context, sluice::asio::io_context>);
  STATIC_REQUIRE(std::is_same_v<app::asio::io_context, sluice::asio::io_context>);
  sluice::testing::virtual_loop loop;
  CHECK(loop.run(app::twice(21)) == 42);
  CHECK(loop.now() == 1s);
}
