// SPDX-License-Identifier: BSL-1.0
// Behaviours of CPython's test_locks.py ConditionTests, plus sluice's own
// guarantees (DESIGN.md, "Synchronization primitives").
#include <sluice/condition.hpp>

#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::tasks_on_loop;

namespace {

// A waiter that records its tag once notified, holding the lock.
auto tagged_waiter(sluice::condition& cv, std::vector<int>& out, int tag) {
  return [&cv, &out, tag]() -> asio::awaitable<void> {
    co_await cv.acquire();
    co_await cv.wait();
    CHECK(cv.locked());
    out.push_back(tag);
    cv.release();
  };
}

}  // namespace

TEST_CASE("notified waiters wake only after the notifier releases the lock", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  std::vector<int> result;
  for (int i = 1; i <= 3; ++i) h.spawn(tagged_waiter(cv, result, i));
  h.poll();
  CHECK(cv.waiters() == 3);
  CHECK_FALSE(cv.locked());
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify();
  h.poll();
  CHECK(result.empty());  // woken, but the lock is still held
  cv.release();
  h.poll();
  CHECK(result == std::vector<int>{1});
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify(2);
  cv.release();
  h.poll();
  CHECK(result == std::vector<int>{1, 2, 3});
  CHECK(cv.waiters() == 0);
  CHECK_FALSE(cv.locked());
}

TEST_CASE("notify with more than the waiting count wakes those there are", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  std::vector<int> result;
  h.spawn(tagged_waiter(cv, result, 1));
  h.spawn(tagged_waiter(cv, result, 2));
  h.poll();
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify(5);
  cv.release();
  h.poll();
  CHECK(result == std::vector<int>{1, 2});
}

TEST_CASE("notify_all wakes every waiter in order", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  std::vector<int> result;
  for (int i = 1; i <= 4; ++i) h.spawn(tagged_waiter(cv, result, i));
  h.poll();
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify_all();
  cv.release();
  h.poll();
  CHECK(result == std::vector<int>{1, 2, 3, 4});
  CHECK(cv.max_waiters() == 4);
}

TEST_CASE("wait and notify without the lock throw logic_error", "[condition]") {
  sluice::testing::virtual_loop loop;
  sluice::condition cv;
  CHECK_THROWS_AS(cv.notify(), std::logic_error);
  CHECK_THROWS_AS(cv.notify_all(), std::logic_error);
  CHECK_THROWS_AS(loop.run(cv.wait()), std::logic_error);
  CHECK_THROWS_AS(cv.release(), std::logic_error);
}

TEST_CASE("wait with a predicate returns once the predicate holds", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  int value = 0;
  bool done = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    auto g = co_await cv.scoped_acquire();
    co_await cv.wait([&] { return value == 2; });
    CHECK(cv.locked());
    done = true;
  });
  h.poll();
  for (int i = 1; i <= 3 && !done; ++i) {
    REQUIRE(cv.get_lock().try_acquire());
    value = i;
    cv.notify();
    cv.release();
    h.poll();
    CHECK(done == (i == 2));
  }
  CHECK(t.succeeded());
  CHECK_FALSE(cv.locked());
}

TEST_CASE("a cancelled wait still holds the lock afterwards", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  bool locked_after = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await cv.acquire();
    try {
      co_await cv.wait();
    } catch (const sluice::system_error&) {
      locked_after = cv.locked();
      cv.release();
      throw;
    }
  });
  h.poll();
  CHECK_FALSE(cv.locked());
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(locked_after);
  CHECK_FALSE(cv.locked());
  CHECK(cv.waiters() == 0);
}

TEST_CASE("a wait cancelled while the lock is contested re-acquires it before throwing",
          "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  bool locked_after = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await cv.acquire();
    try {
      co_await cv.wait();
    } catch (const sluice::system_error&) {
      locked_after = cv.locked();
      cv.release();
      throw;
    }
  });
  h.poll();
  REQUIRE(cv.get_lock().try_acquire());  // someone else holds the lock
  t.cancel();
  h.poll();
  CHECK_FALSE(t.done);  // waits for the lock despite the cancellation
  cv.release();
  h.poll();
  CHECK(t.cancelled());
  CHECK(locked_after);
  CHECK_FALSE(cv.locked());
}

TEST_CASE(
    "a waiter notified then cancelled while the lock is contested holds the lock and "
    "passes the notification on",
    "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  int state = 0;
  std::vector<int> consumed_by;
  auto consumer = [&](int tag) {
    return [&, tag]() -> asio::awaitable<void> {
      auto g = co_await cv.scoped_acquire();
      for (;;) {
        co_await cv.wait([&] { return state != 0; });
        if (state < 0) co_return;
        --state;
        consumed_by.push_back(tag);
      }
    };
  };
  auto& c1 = h.spawn(consumer(1));
  auto& c2 = h.spawn(consumer(2));
  h.poll();
  CHECK(cv.waiters() == 2);
  REQUIRE(cv.get_lock().try_acquire());
  state = 1;
  cv.notify(1);  // wakes c1...
  c1.cancel();   // ...which is cancelled before it runs
  cv.release();
  h.poll();
  CHECK(c1.cancelled());
  CHECK(state == 0);  // the notification was not lost: c2 consumed the item
  CHECK(consumed_by == std::vector<int>{2});
  REQUIRE(cv.get_lock().try_acquire());
  state = -1;
  cv.notify_all();
  cv.release();
  h.poll();
  CHECK(c2.succeeded());
  CHECK_FALSE(cv.locked());
}

TEST_CASE("a waiter notified and then cancelled while re-acquiring still holds the lock",
          "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  bool waited = false, locked_after = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    auto g = co_await cv.scoped_acquire();
    waited = true;
    try {
      co_await cv.wait();
    } catch (const sluice::system_error&) {
      locked_after = cv.locked();
      throw;
    }
  });
  h.poll();
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify();
  h.poll();  // the waiter now queues for the lock
  CHECK(cv.get_lock().waiters() == 1);
  t.cancel();
  h.poll();
  CHECK_FALSE(t.done);
  cv.release();
  h.poll();
  CHECK(t.cancelled());
  CHECK(waited);
  CHECK(locked_after);
  CHECK_FALSE(cv.locked());
}

TEST_CASE("a timeout during wait leaves the lock held", "[condition]") {
  sluice::testing::virtual_loop loop;
  sluice::condition cv;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto g = co_await cv.scoped_acquire();
    auto r = co_await (cv.wait() || sluice::sleep(1s));
    CHECK(r.index() == 1);
    CHECK(cv.locked());
    CHECK(cv.waiters() == 0);
  });
  CHECK(loop.now() == 1s);
  CHECK_FALSE(cv.locked());
}

TEST_CASE("a condition can share an existing lock", "[condition]") {
  tasks_on_loop h;
  sluice::lock l;
  sluice::condition cv{l};
  CHECK(&cv.get_lock() == &l);
  bool woke = false;
  h.spawn([&]() -> asio::awaitable<void> {
    auto g = co_await l.scoped_acquire();
    co_await cv.wait();
    woke = l.locked();
  });
  h.poll();
  REQUIRE(l.try_acquire());
  cv.notify();
  l.release();
  h.poll();
  CHECK(woke);
  CHECK_FALSE(l.locked());
}

TEST_CASE("destroying a condition with waiters completes them with operation_aborted",
          "[condition]") {
  tasks_on_loop h;
  sluice::lock l;
  auto cv = std::make_unique<sluice::condition>(l);
  bool locked_after = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await l.acquire();
    try {
      co_await cv->wait();
    } catch (const sluice::system_error&) {
      locked_after = l.locked();
      l.release();
      throw;
    }
  });
  h.poll();
  cv.reset();
  h.poll();
  CHECK(t.cancelled());
  CHECK(locked_after);
}

// ---------------------------------------------------------------------------
// Adversarial review: notify racing cancellation; destruction.

TEST_CASE("notify skips waiters cancelled earlier in the same turn", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  std::vector<int> out;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 4; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      auto g = co_await cv.scoped_acquire();
      co_await cv.wait();
      out.push_back(i);
    }));
  }
  h.poll();
  CHECK(cv.waiters() == 4);
  t[0]->cancel();
  t[2]->cancel();
  CHECK(cv.waiters() == 2);  // removed at once
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify(1);  // reaches 2, not the cancelled 1
  CHECK(cv.waiters() == 1);
  cv.release();
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(t[2]->cancelled());
  CHECK(out == std::vector<int>{2});
  CHECK(cv.waiters() == 1);
  CHECK_FALSE(cv.locked());
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify(5);
  cv.release();
  h.poll();
  CHECK(out == std::vector<int>{2, 4});
  CHECK(t[3]->succeeded());
  CHECK_FALSE(cv.locked());
}

TEST_CASE("notify(2) racing with the cancellation of both notified waiters reaches the rest",
          "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  std::vector<int> out;
  std::vector<sluice_test::task*> t;
  std::vector<bool> held_when_thrown(4, false);
  for (int i = 0; i < 4; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      co_await cv.acquire();
      try {
        co_await cv.wait();
      } catch (const sluice::system_error&) {
        held_when_thrown[static_cast<std::size_t>(i)] = cv.locked();
        cv.release();
        throw;
      }
      out.push_back(i);
      cv.release();
    }));
  }
  h.poll();
  REQUIRE(cv.get_lock().try_acquire());
  cv.notify(2);  // 0 and 1 notified...
  t[0]->cancel();
  t[1]->cancel();  // ...and both cancelled before they run
  cv.release();
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(t[1]->cancelled());
  CHECK(held_when_thrown[0]);
  CHECK(held_when_thrown[1]);
  CHECK(out == std::vector<int>{2, 3});  // both notifications passed on
  CHECK(cv.waiters() == 0);
  CHECK_FALSE(cv.locked());
}

TEST_CASE("a cancelled wait(pred) throws with the lock held and leaves no waiter", "[condition]") {
  tasks_on_loop h;
  sluice::condition cv;
  int value = 0;
  bool held = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    auto g = co_await cv.scoped_acquire();
    try {
      co_await cv.wait([&] { return value == 2; });
    } catch (const sluice::system_error&) {
      held = cv.locked();
      throw;
    }
  });
  h.poll();
  REQUIRE(cv.get_lock().try_acquire());
  value = 1;
  cv.notify();  // wakes it; the predicate is still false so it waits again
  cv.release();
  h.poll();
  CHECK(cv.waiters() == 1);
  CHECK_FALSE(t.done);
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(held);
  CHECK(cv.waiters() == 0);
  CHECK_FALSE(cv.locked());
}

TEST_CASE("destroying a condition that owns its lock while a coroutine waits does not dangle",
          "[condition]") {
  tasks_on_loop h;
  auto cv = std::make_unique<sluice::condition>(h.loop.get_executor());
  bool aborted = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await cv->acquire();
    try {
      co_await cv->wait();
    } catch (const sluice::system_error& e) {
      aborted = e.code() == asio::error::operation_aborted;
      throw;  // the condition and its lock are gone: nothing to release
    }
  });
  h.poll();
  CHECK(cv->waiters() == 1);
  cv.reset();
  h.poll();
  CHECK(t.cancelled());
  CHECK(aborted);
}

TEST_CASE("a condition destroyed after notifying a waiter that is then cancelled does not dangle",
          "[condition]") {
  tasks_on_loop h;
  sluice::lock l;
  auto cv = std::make_unique<sluice::condition>(l);
  bool held = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await l.acquire();
    try {
      co_await cv->wait();
    } catch (const sluice::system_error&) {
      held = l.locked();
      l.release();
      throw;
    }
  });
  h.poll();
  REQUIRE(l.try_acquire());
  cv->notify();
  t.cancel();
  cv.reset();  // no waiter is left in it
  l.release();
  h.poll();
  CHECK(t.cancelled());
  CHECK(held);
  CHECK_FALSE(l.locked());
}
