// SPDX-License-Identifier: BSL-1.0
// Behaviours of CPython's test_locks.py EventTests, plus sluice's own
// guarantees (DESIGN.md, "Synchronization primitives").
#include <sluice/event.hpp>

#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::tasks_on_loop;

TEST_CASE("set wakes every waiter", "[event]") {
  tasks_on_loop h;
  sluice::event ev;
  int woken = 0;
  for (int i = 0; i < 3; ++i) {
    h.spawn([&]() -> asio::awaitable<void> {
      co_await ev.wait();
      ++woken;
    });
  }
  h.poll();
  CHECK(woken == 0);
  CHECK(ev.waiters() == 3);
  ev.set();
  CHECK(ev.is_set());
  CHECK(woken == 0);  // resumed through a post, not inside set()
  h.poll();
  CHECK(woken == 3);
  CHECK(ev.waiters() == 0);
  CHECK(ev.max_waiters() == 3);
}

TEST_CASE("wait on a set event returns at once without a trip through the loop", "[event]") {
  sluice::testing::virtual_loop loop;
  sluice::event ev;
  ev.set();
  bool other_ran = false;
  loop.run([&]() -> asio::awaitable<void> {
    asio::post(loop.get_executor(), [&] { other_ran = true; });
    co_await ev.wait();
    CHECK_FALSE(other_ran);
  });
  CHECK(loop.now() == 0s);
}

TEST_CASE("set wakes every current waiter even if clear follows at once", "[event]") {
  tasks_on_loop h;
  sluice::event ev;
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await ev.wait(); });
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await ev.wait(); });
  h.poll();
  ev.set();
  ev.clear();
  h.poll();
  CHECK(a.succeeded());
  CHECK(b.succeeded());
  CHECK_FALSE(ev.is_set());
  auto& c = h.spawn([&]() -> asio::awaitable<void> { co_await ev.wait(); });
  h.poll();
  CHECK_FALSE(c.done);  // cleared: a new wait suspends
  ev.set();
  h.poll();
  CHECK(c.succeeded());
}

TEST_CASE("a cancelled event waiter is removed", "[event]") {
  tasks_on_loop h;
  sluice::event ev;
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await ev.wait(); });
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await ev.wait(); });
  h.poll();
  a.cancel();
  CHECK(ev.waiters() == 1);
  h.poll();
  CHECK(a.cancelled());
  ev.set();
  h.poll();
  CHECK(b.succeeded());
}

TEST_CASE("set clear set set wakes a waiter exactly once", "[event]") {
  tasks_on_loop h;
  sluice::event ev;
  int wakeups = 0;
  h.spawn([&]() -> asio::awaitable<void> {
    co_await ev.wait();
    ++wakeups;
  });
  h.poll();
  ev.set();
  ev.clear();
  ev.set();
  ev.set();
  h.poll();
  CHECK(wakeups == 1);
  CHECK(ev.is_set());
  CHECK(ev.waiters() == 0);
}

TEST_CASE("a timeout around an event wait ends it cleanly", "[event]") {
  sluice::testing::virtual_loop loop;
  sluice::event ev;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto r = co_await (ev.wait() || sluice::sleep(2s));
    CHECK(r.index() == 1);
  });
  CHECK(loop.now() == 2s);
  CHECK(ev.waiters() == 0);
}

TEST_CASE("event async_wait works with use_awaitable, a plain callback and use_future", "[event]") {
  tasks_on_loop h;
  sluice::event ev{h.loop.get_executor()};
  auto& a =
      h.spawn([&]() -> asio::awaitable<void> { co_await ev.async_wait(asio::use_awaitable); });
  h.poll();
  sluice::error_code cb_ec = asio::error::would_block;
  ev.async_wait([&](sluice::error_code ec) { cb_ec = ec; });
  std::future<void> fut = ev.async_wait(asio::use_future);
  CHECK(ev.waiters() == 3);
  ev.set();
  CHECK(cb_ec == asio::error::would_block);
  h.poll();
  CHECK(a.succeeded());
  CHECK_FALSE(cb_ec);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  fut.get();
  // On a set event the operation still completes through a post.
  cb_ec = asio::error::would_block;
  ev.async_wait([&](sluice::error_code ec) { cb_ec = ec; });
  CHECK(cb_ec == asio::error::would_block);
  h.poll();
  CHECK_FALSE(cb_ec);
}

TEST_CASE("async_wait on an event that is already set completes at once with every token",
          "[event]") {
  tasks_on_loop h;
  sluice::event ev{h.loop.get_executor()};
  ev.set();
  auto& coro =
      h.spawn([&]() -> asio::awaitable<void> { co_await ev.async_wait(asio::use_awaitable); });
  sluice::error_code cb_ec = asio::error::would_block;
  ev.async_wait([&](sluice::error_code ec) { cb_ec = ec; });
  std::future<void> fut = ev.async_wait(asio::use_future);
  CHECK(ev.waiters() == 0);                  // nobody queued: nothing waits for another set()
  CHECK(cb_ec == asio::error::would_block);  // not inside the call: through a post
  h.poll();
  CHECK(coro.succeeded());
  CHECK_FALSE(cb_ec);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  fut.get();
  CHECK(h.loop.now() == 0s);
  CHECK(ev.max_waiters() == 0);
}

TEST_CASE("a bare callback on an event without an executor is rejected", "[event]") {
  sluice::event ev;
  CHECK_THROWS_AS(ev.async_wait([](sluice::error_code) {}), std::invalid_argument);
  CHECK(ev.waiters() == 0);
}

TEST_CASE("destroying an event with waiters completes them with operation_aborted", "[event]") {
  tasks_on_loop h;
  auto ev = std::make_unique<sluice::event>();
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await ev->wait(); });
  h.poll();
  ev.reset();
  h.poll();
  CHECK(a.cancelled());
}

// ---------------------------------------------------------------------------
// Adversarial review.

TEST_CASE("set clear set in one turn wakes both the old and the new waiters once", "[event]") {
  tasks_on_loop h;
  sluice::event e;
  int woke = 0;
  auto waiter = [&]() -> asio::awaitable<void> {
    co_await e.wait();
    ++woke;
  };
  h.spawn(waiter);
  h.poll();
  e.set();
  e.clear();
  h.spawn(waiter);  // queued on the cleared event in the same turn
  h.poll();
  CHECK(woke == 1);
  CHECK(e.waiters() == 1);
  e.set();
  e.clear();
  e.set();
  h.poll();
  CHECK(woke == 2);
  CHECK(e.waiters() == 0);
}

TEST_CASE("a waiter cancelled between set and its resumption returns normally", "[event]") {
  tasks_on_loop h;
  sluice::event e{h.loop.get_executor()};
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await e.wait(); });
  asio::cancellation_signal sig;
  sluice::error_code cb = asio::error::would_block;
  e.async_wait(asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code ec) { cb = ec; }));
  h.poll();
  e.set();
  a.cancel();
  sig.emit(asio::cancellation_type::terminal);
  sig.emit(asio::cancellation_type::terminal);
  h.poll();
  CHECK(a.succeeded());  // the wakeup was delivered before the cancellation
  CHECK_FALSE(cb);
  CHECK(e.waiters() == 0);
}

TEST_CASE("a callback waiter cancelled before set is aborted and the others still wake",
          "[event]") {
  tasks_on_loop h;
  sluice::event e{h.loop.get_executor()};
  asio::cancellation_signal sig;
  sluice::error_code c1 = asio::error::would_block, c2 = c1;
  e.async_wait(asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code ec) { c1 = ec; }));
  std::future<void> fut = e.async_wait(asio::use_future);
  e.async_wait([&](sluice::error_code ec) { c2 = ec; });
  sig.emit(asio::cancellation_type::terminal);
  CHECK(e.waiters() == 2);
  e.set();
  h.poll();
  CHECK(c1 == asio::error::operation_aborted);
  CHECK_FALSE(c2);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  fut.get();
}

TEST_CASE("destroying an event with waiters of every token kind aborts each of them", "[event]") {
  tasks_on_loop h;
  auto e = std::make_unique<sluice::event>(h.loop.get_executor());
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await e->wait(); });
  sluice::error_code cb = asio::error::would_block;
  e->async_wait([&](sluice::error_code ec) { cb = ec; });
  std::future<void> fut = e->async_wait(asio::use_future);
  h.poll();
  CHECK(e->waiters() == 3);
  e.reset();
  h.poll();
  CHECK(a.cancelled());
  CHECK(cb == asio::error::operation_aborted);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  CHECK_THROWS_AS(fut.get(), sluice::system_error);
}
