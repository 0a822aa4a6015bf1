// SPDX-License-Identifier: BSL-1.0
// Behaviours of CPython's test_locks.py LockTests, plus sluice's own
// guarantees (DESIGN.md, "Synchronization primitives").
#include <sluice/lock.hpp>

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

TEST_CASE("a new lock is unlocked and try_acquire takes it", "[lock]") {
  sluice::lock l;
  CHECK_FALSE(l.locked());
  REQUIRE(l.try_acquire());
  CHECK(l.locked());
  CHECK_FALSE(l.try_acquire());
  l.release();
  CHECK_FALSE(l.locked());
}

TEST_CASE("waiters get the lock in FIFO order even with a late arrival", "[lock]") {
  tasks_on_loop h;
  sluice::lock l;
  std::vector<int> result;
  REQUIRE(l.try_acquire());
  auto waiter = [&](int tag) {
    return [&, tag]() -> asio::awaitable<void> {
      co_await l.acquire();
      result.push_back(tag);
    };
  };
  h.spawn(waiter(1));
  h.spawn(waiter(2));
  h.poll();
  CHECK(result.empty());
  l.release();
  h.poll();
  CHECK(result == std::vector<int>{1});
  h.poll();
  CHECK(result == std::vector<int>{1});
  h.spawn(waiter(3));  // late arrival queues behind 2
  h.poll();
  l.release();
  h.poll();
  CHECK(result == std::vector<int>{1, 2});
  l.release();
  h.poll();
  CHECK(result == std::vector<int>{1, 2, 3});
  CHECK(l.locked());
}

TEST_CASE("a cancelled waiter leaves no trace", "[lock]") {
  tasks_on_loop h;
  sluice::lock l;
  REQUIRE(l.try_acquire());
  auto& t = h.spawn([&]() -> asio::awaitable<void> { co_await l.acquire(); });
  h.poll();
  CHECK(l.waiters() == 1);
  t.cancel();
  CHECK(l.waiters() == 0);
  h.poll();
  CHECK(t.cancelled());
  l.release();
  CHECK_FALSE(l.locked());
  CHECK(l.try_acquire());
}

TEST_CASE("B cancelled while A releases lets C take the lock", "[lock]") {
  tasks_on_loop h;
  sluice::lock l;
  bool a_done = false, c_got = false;
  auto& a = h.spawn([&]() -> asio::awaitable<void> {
    co_await l.acquire();
    co_await sluice::sleep(1s);
    a_done = true;
  });
  h.poll();
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await l.acquire(); });
  auto& c = h.spawn([&]() -> asio::awaitable<void> {
    co_await l.acquire();
    c_got = true;
    l.release();
  });
  h.poll();
  CHECK(l.waiters() == 2);
  h.loop.run_for(1s);
  CHECK(a_done);
  // In one step: B is cancelled, then A releases.
  b.cancel();
  l.release();
  h.poll();
  CHECK(a.succeeded());
  CHECK(b.cancelled());
  CHECK(c.succeeded());
  CHECK(c_got);
  CHECK_FALSE(l.locked());
}

TEST_CASE("a cancel racing with release leaves exactly one holder", "[lock]") {
  tasks_on_loop h;
  sluice::lock l;
  int calls = 0, holders = 0;
  REQUIRE(l.try_acquire());
  auto lockit = [&]() -> asio::awaitable<void> {
    ++calls;
    co_await l.acquire();
    ++holders;
  };
  auto& t1 = h.spawn(lockit);
  auto& t2 = h.spawn(lockit);
  auto& t3 = h.spawn(lockit);
  h.poll();
  asio::post(h.loop.get_executor(), [&] {
    t1.cancel();
    l.release();
  });
  h.poll();
  CHECK(t1.cancelled());
  CHECK(t2.succeeded());
  CHECK(holders == 1);
  CHECK(calls == 3);
  CHECK(l.locked());
  t3.cancel();
  h.poll();
  CHECK(t3.cancelled());
  CHECK(l.waiters() == 0);
}

TEST_CASE("a waiter woken then cancelled passes the lock on", "[lock]") {
  tasks_on_loop h;
  sluice::lock l;
  REQUIRE(l.try_acquire());
  auto& ta = h.spawn([&]() -> asio::awaitable<void> { co_await l.acquire(); });
  h.poll();
  auto& tb = h.spawn([&]() -> asio::awaitable<void> { co_await l.acquire(); });
  h.poll();
  CHECK(l.waiters() == 2);
  l.release();  // wakes ta...
  ta.cancel();  // ...which is cancelled before it runs
  h.poll();
  CHECK(ta.cancelled());
  CHECK(tb.succeeded());
  CHECK(l.locked());
  CHECK(l.waiters() == 0);
}

TEST_CASE("releasing an unlocked lock throws logic_error", "[lock]") {
  sluice::lock l;
  CHECK_THROWS_AS(l.release(), std::logic_error);
  REQUIRE(l.try_acquire());
  l.release();
  CHECK_THROWS_AS(l.release(), std::logic_error);
  CHECK_FALSE(l.locked());
}

TEST_CASE("a guard from scoped_acquire releases the lock on destruction", "[lock]") {
  sluice::testing::virtual_loop loop;
  sluice::lock l;
  loop.run([&]() -> asio::awaitable<void> {
    {
      auto g = co_await l.scoped_acquire();
      CHECK(g);
      CHECK(l.locked());
      sluice::lock::guard moved = std::move(g);
      CHECK_FALSE(g);
      CHECK(l.locked());
    }
    CHECK_FALSE(l.locked());
  });
  static_assert(!std::is_copy_constructible_v<sluice::lock::guard>);
}

TEST_CASE("lock holders are serialized across co_await", "[lock]") {
  sluice::testing::virtual_loop loop;
  sluice::lock l;
  int inside = 0, max_inside = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto critical = [&]() -> asio::awaitable<void> {
      auto g = co_await l.scoped_acquire();
      max_inside = std::max(max_inside, ++inside);
      co_await sluice::sleep(1s);
      --inside;
    };
    co_await (critical() && critical() && critical());
  });
  CHECK(max_inside == 1);
  CHECK(loop.now() == 3s);
  CHECK(l.max_waiters() == 2);
}

TEST_CASE("lock async_acquire works with a plain callback and use_future", "[lock]") {
  tasks_on_loop h;
  sluice::lock l{h.loop.get_executor()};
  sluice::error_code cb_ec = asio::error::would_block;
  l.async_acquire([&](sluice::error_code ec) { cb_ec = ec; });
  h.poll();
  CHECK_FALSE(cb_ec);
  CHECK(l.locked());
  std::future<void> fut = l.async_acquire(asio::use_future);
  CHECK(l.waiters() == 1);
  l.release();
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  fut.get();
  CHECK(l.locked());
}

TEST_CASE("destroying a lock with waiters completes them with operation_aborted", "[lock]") {
  tasks_on_loop h;
  auto l = std::make_unique<sluice::lock>();
  REQUIRE(l->try_acquire());
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await l->acquire(); });
  h.poll();
  l.reset();
  h.poll();
  CHECK(a.cancelled());
}
