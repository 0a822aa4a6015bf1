// SPDX-License-Identifier: BSL-1.0
// Callers cancelled before they call (DESIGN.md, "Bad input"): a coroutine
// whose cancellation was requested, running on with throw_if_cancelled(false)
// (the documented way to clean up), gets operation_aborted at once from every
// wait in the library, holding nothing and taking nothing, whether or not a
// place is free. One case per kind of wait.
#include <sluice/adaptive_limit.hpp>
#include <sluice/breaker.hpp>
#include <sluice/condition.hpp>
#include <sluice/event.hpp>
#include <sluice/fair_semaphore.hpp>
#include <sluice/hedge.hpp>
#include <sluice/keyed_rate_limiter.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/limits.hpp>
#include <sluice/lock.hpp>
#include <sluice/policy.hpp>
#include <sluice/queue.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/shed.hpp>
#include <sluice/single_flight.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>
#include <sluice/token_bucket.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <optional>
#include <string>

using namespace std::chrono_literals;
using sluice_test::task;
using sluice_test::tasks_on_loop;

namespace {

// Starts a task that is cancelled while it sleeps, catches that, and then,
// with throw_if_cancelled off, calls `call()`; runs the loop until the task
// is blocked or done, without advancing time. `call` returns an awaitable.
template <class Call>
task& call_after_cancel(tasks_on_loop& h, Call call) {
  task& t = h.spawn([call]() mutable -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    co_await call();  // ...then calls
  });
  h.poll();
  t.cancel();
  h.poll();
  return t;
}

// The task was refused at once: it threw operation_aborted at t = 0.
void check_refused(tasks_on_loop& h, const task& t) {
  CHECK(t.cancelled());
  CHECK(h.loop.now() == 0s);
}

}  // namespace

TEST_CASE("a semaphore refuses a caller cancelled before it called, busy or free",
          "[semaphore][precancel]") {
  tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 1};
  SECTION("busy: it does not queue") {
    REQUIRE(sem.try_acquire());
    auto& t = call_after_cancel(h, [&] { return sem.acquire(); });
    check_refused(h, t);
    CHECK(sem.waiters() == 0);
    sem.release();
    CHECK(sem.value() == 1);
  }
  SECTION("free: it takes nothing") {
    auto& t = call_after_cancel(
        h, [&]() -> asio::awaitable<void> { auto p = co_await sem.scoped_acquire(); });
    check_refused(h, t);
    CHECK(sem.value() == 1);
    CHECK(sem.stats().acquired == 0);
  }
  SECTION("async_acquire with a coroutine's handler, busy or free") {
    const bool busy = GENERATE(true, false);
    if (busy) REQUIRE(sem.try_acquire());
    auto& t = call_after_cancel(h, [&] { return sem.async_acquire(asio::use_awaitable); });
    check_refused(h, t);
    CHECK(sem.waiters() == 0);
    CHECK(sem.value() == (busy ? 0 : 1));
  }
}

TEST_CASE("a bounded_semaphore refuses a caller cancelled before it called",
          "[semaphore][precancel]") {
  tasks_on_loop h;
  sluice::bounded_semaphore sem{h.loop.get_executor(), 1};
  REQUIRE(sem.try_acquire());
  auto& t = call_after_cancel(h, [&] { return sem.acquire(); });
  check_refused(h, t);
  CHECK(sem.waiters() == 0);
  sem.release();  // the one permit taken: no over-release
  CHECK(sem.value() == 1);
}

TEST_CASE("a lock refuses a caller cancelled before it called, locked or not",
          "[lock][precancel]") {
  tasks_on_loop h;
  sluice::lock l{h.loop.get_executor()};
  const bool held = GENERATE(true, false);
  if (held) REQUIRE(l.try_acquire());
  auto& t = call_after_cancel(
      h, [&]() -> asio::awaitable<void> { auto g = co_await l.scoped_acquire(); });
  check_refused(h, t);
  CHECK(l.waiters() == 0);
  CHECK(l.locked() == held);
}

TEST_CASE("a keyed_semaphore refuses a caller cancelled before it called and keeps no entry",
          "[keyed_semaphore][precancel]") {
  tasks_on_loop h;
  sluice::keyed_semaphore<std::string> ks{h.loop.get_executor(), 1};
  SECTION("a busy key") {
    auto holder = ks.try_acquire("k");
    auto& t = call_after_cancel(h, [&] { return ks.acquire("k"); });
    check_refused(h, t);
    CHECK(ks.waiters("k") == 0);
    holder.reset();
    CHECK(ks.keys() == 0);
  }
  SECTION("a new key") {
    auto& t = call_after_cancel(
        h, [&]() -> asio::awaitable<void> { auto p = co_await ks.scoped_acquire("k"); });
    check_refused(h, t);
    CHECK(ks.keys() == 0);
  }
  SECTION("async_acquire of a new key") {
    auto& t = call_after_cancel(h, [&] { return ks.async_acquire("k", asio::use_awaitable); });
    check_refused(h, t);
    CHECK(ks.keys() == 0);
  }
}

TEST_CASE("an adaptive_limit refuses a caller cancelled before it called",
          "[adaptive_limit][precancel]") {
  tasks_on_loop h;
  sluice::adaptive_limit cap{{.initial = 1, .min = 1, .max = 1}};
  const bool busy = GENERATE(true, false);
  auto held = busy ? cap.try_acquire(h.loop.get_executor()) : sluice::adaptive_limit::permit{};
  auto& t = call_after_cancel(
      h, [&]() -> asio::awaitable<void> { auto p = co_await cap.scoped_acquire(); });
  check_refused(h, t);
  CHECK(cap.waiters() == 0);
  CHECK(cap.in_flight() == (busy ? 1 : 0));
}

TEST_CASE("a shared_semaphore refuses a caller cancelled before it called",
          "[shared_semaphore][precancel]") {
  tasks_on_loop h;
  sluice::shared_semaphore sem{1};
  const bool busy = GENERATE(true, false);
  if (busy) REQUIRE(sem.try_acquire());
  SECTION("acquire") {
    auto& t = call_after_cancel(h, [&] { return sem.acquire(); });
    check_refused(h, t);
  }
  SECTION("async_acquire with a coroutine's handler") {
    auto& t = call_after_cancel(h, [&] { return sem.async_acquire(asio::use_awaitable); });
    check_refused(h, t);
  }
  CHECK(sem.waiters() == 0);
  CHECK(sem.value() == (busy ? 0 : 1));
}

TEST_CASE("rate limits refuse a caller cancelled before it called, with room or without",
          "[rate_limiter][precancel]") {
  tasks_on_loop h;
  const auto ex = h.loop.get_executor();
  sluice::rate_limiter rl{ex, 1, 1s};
  sluice::token_bucket tb{ex, 1.0, 1};
  sluice::keyed_rate_limiter<std::string> krl{ex, 1, 1s};
  const bool full = GENERATE(true, false);
  if (full) {
    REQUIRE(rl.try_acquire());
    REQUIRE(tb.try_acquire());
    REQUIRE(krl.try_acquire("k"));
  }
  SECTION("rate_limiter") {
    check_refused(h, call_after_cancel(h, [&] { return rl.acquire(); }));
    check_refused(h,
                  call_after_cancel(h, [&] { return rl.async_acquire(1, asio::use_awaitable); }));
    CHECK(rl.waiters() == 0);
    CHECK(rl.stats().acquired == (full ? 1 : 0));
  }
  SECTION("token_bucket") {
    check_refused(h, call_after_cancel(h, [&] { return tb.acquire(); }));
    check_refused(h,
                  call_after_cancel(h, [&] { return tb.async_acquire(1, asio::use_awaitable); }));
    CHECK(tb.waiters() == 0);
    CHECK(tb.stats().acquired == (full ? 1 : 0));
  }
  SECTION("keyed_rate_limiter") {
    check_refused(h, call_after_cancel(h, [&] { return krl.acquire("k"); }));
    CHECK(krl.waiters("k") == 0);
  }
}

TEST_CASE("a queue refuses a caller cancelled before it called, and loses no item",
          "[queue][precancel]") {
  tasks_on_loop h;
  sluice::queue<int> q{h.loop.get_executor(), 1};
  SECTION("put with room: the item does not go in") {
    check_refused(h, call_after_cancel(h, [&] { return q.put(1); }));
    CHECK(q.empty());
    CHECK(q.unfinished_tasks() == 0);
  }
  SECTION("async_put with room") {
    check_refused(h, call_after_cancel(h, [&] { return q.async_put(1, asio::use_awaitable); }));
    CHECK(q.empty());
  }
  SECTION("put when full: it does not queue") {
    REQUIRE(q.try_put(1));
    check_refused(h, call_after_cancel(h, [&] { return q.put(2); }));
    CHECK(q.putters() == 0);
    CHECK(q.size() == 1);
  }
  SECTION("get with an item: the item stays") {
    REQUIRE(q.try_put(7));
    check_refused(h, call_after_cancel(h, [&] { return q.get(); }));
    CHECK(q.size() == 1);
    CHECK(q.try_get() == 7);
  }
  SECTION("async_get with an item") {
    REQUIRE(q.try_put(7));
    check_refused(h, call_after_cancel(h, [&] { return q.async_get(asio::use_awaitable); }));
    CHECK(q.try_get() == 7);
  }
  SECTION("get when empty: it does not queue") {
    check_refused(h, call_after_cancel(h, [&] { return q.get(); }));
    CHECK(q.getters() == 0);
  }
  SECTION("join, with unfinished items or without") {
    const bool unfinished = GENERATE(true, false);
    if (unfinished) REQUIRE(q.try_put(1));
    check_refused(h, call_after_cancel(h, [&] { return q.join(); }));
    check_refused(h, call_after_cancel(h, [&] { return q.async_join(asio::use_awaitable); }));
  }
}

TEST_CASE("a condition refuses a caller cancelled before it waited, holding the lock again",
          "[condition][precancel]") {
  tasks_on_loop h;
  sluice::condition c{h.loop.get_executor()};
  bool held_when_thrown = false;
  auto& t = call_after_cancel(h, [&]() -> asio::awaitable<void> {
    auto g = co_await c.scoped_acquire();
    try {
      co_await c.wait();
    } catch (const sluice::system_error&) {
      held_when_thrown = c.locked();
      throw;
    }
  });
  // scoped_acquire is a wait too: the caller does not even get the lock.
  check_refused(h, t);
  CHECK_FALSE(c.locked());
  // A caller that holds the lock when its cancellation comes.
  auto& t2 = h.spawn([&]() -> asio::awaitable<void> {
    auto g = co_await c.scoped_acquire();
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);
    } catch (const sluice::system_error&) {
    }
    try {
      co_await c.wait();
    } catch (const sluice::system_error&) {
      held_when_thrown = c.locked();
      throw;
    }
  });
  h.poll();
  t2.cancel();
  h.poll();
  check_refused(h, t2);
  CHECK(held_when_thrown);
  CHECK(c.waiters() == 0);
  CHECK_FALSE(c.locked());  // the guard released it on the way out
}

TEST_CASE("an event refuses a caller cancelled before it waited, set or not",
          "[event][precancel]") {
  tasks_on_loop h;
  sluice::event e{h.loop.get_executor()};
  const bool set = GENERATE(true, false);
  if (set) e.set();
  check_refused(h, call_after_cancel(h, [&] { return e.wait(); }));
  check_refused(h, call_after_cancel(h, [&] { return e.async_wait(asio::use_awaitable); }));
  CHECK(e.waiters() == 0);
}

TEST_CASE("single_flight, sleep and with_timeout refuse a caller cancelled before it called",
          "[single_flight][time][timeout][precancel]") {
  tasks_on_loop h;
  sluice::single_flight<std::string, int> flights;
  int started = 0;
  SECTION("single_flight: the work does not start") {
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> {
                    co_await flights.run("k", [&]() -> asio::awaitable<int> {
                      ++started;
                      co_return 1;
                    });
                  }));
    CHECK(started == 0);
    CHECK(flights.in_flight() == 0);
  }
  SECTION("sleep") {
    check_refused(h, call_after_cancel(h, [] { return sluice::sleep(1s); }));
  }
  SECTION("with_timeout: the operation does not start") {
    check_refused(h, call_after_cancel(h, [&] {
                    return sluice::with_timeout(1s, [&]() -> asio::awaitable<void> {
                      ++started;
                      co_return;
                    }());
                  }));
    CHECK(started == 0);
  }
}

TEST_CASE(
    "call policies refuse a caller cancelled before it called, taking no free permit or start",
    "[policy][shed][limits][precancel]") {
  // shed's fast path (the limit's try_acquire) took a free permit or a rate
  // start for such a caller and ran the call.
  tasks_on_loop h;
  const auto ex = h.loop.get_executor();
  sluice::semaphore sem{ex, 1};
  sluice::shared_semaphore shared{ex, 1};
  sluice::rate_limiter rl{ex, 1, 1s};
  int started = 0;
  auto fn = [&]() -> asio::awaitable<int> {
    ++started;
    co_return 1;
  };
  SECTION("shed over a semaphore") {
    auto p = sluice::policy(sluice::shed(sem));
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> { co_await p(fn); }));
    CHECK(p.get<0>().stats().admitted == 0);
    CHECK(sem.stats().acquired == 0);
  }
  SECTION("shed over a shared_semaphore") {
    auto p = sluice::policy(sluice::shed(shared));
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> { co_await p(fn); }));
    CHECK(shared.stats().acquired == 0);
  }
  SECTION("shed over a rate_limiter: the start stays free") {
    auto p = sluice::policy(sluice::shed(rl));
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> { co_await p(fn); }));
    CHECK(rl.stats().acquired == 0);
    CHECK(rl.try_acquire());
  }
  SECTION("limits over a semaphore and a rate_limiter") {
    auto p = sluice::policy(sluice::limits(sem, rl));
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> { co_await p(fn); }));
    CHECK(rl.try_acquire());
  }
  SECTION("a breaker: no call recorded, so no half-open trial spent") {
    // The breaker and the hedge admitted such a caller and ran the call.
    auto p = sluice::policy(sluice::breaker({.window = 1, .minimum_calls = 1}));
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> { co_await p(fn); }));
    CHECK(p.get<0>().stats().calls == 0);
  }
  SECTION("a hedge, and a weighted call") {
    auto p = sluice::policy(sluice::hedge({.after = 1ms}));
    check_refused(h, call_after_cancel(h, [&]() -> asio::awaitable<void> { co_await p(fn); }));
    check_refused(h, call_after_cancel(
                         h, [&]() -> asio::awaitable<void> { co_await p(fn, sluice::weight(2)); }));
  }
  CHECK(started == 0);
  CHECK(sem.value() == 1);
  CHECK(shared.value() == 1);
}

TEST_CASE("a fair_semaphore refuses a caller cancelled before it called, async_acquire too",
          "[fair_semaphore][precancel]") {
  // async_acquire took the free permit for the key and parked it in the
  // key's gate before the gate refused the handler: the permit was lost
  // (value 0, the key "in use" by nobody).
  tasks_on_loop h;
  sluice::fair_semaphore<std::string> fs{h.loop.get_executor(), 1};
  const bool busy = GENERATE(true, false);
  std::optional<sluice::fair_semaphore<std::string>::permit> held;
  if (busy) held = fs.try_acquire("other");
  check_refused(h, call_after_cancel(h, [&] { return fs.acquire("k"); }));
  check_refused(h,
                call_after_cancel(h, [&] { return fs.async_acquire("k", asio::use_awaitable); }));
  CHECK(fs.waiters() == 0);
  CHECK(fs.stats("k").in_use == 0);
  held.reset();
  CHECK(fs.value() == 1);
  auto p = fs.try_acquire("k");  // the permit is there for the next caller
  CHECK(p.has_value());
}
