// SPDX-License-Identifier: BSL-1.0
// Behaviours of CPython's test_locks.py SemaphoreTests, plus sluice's own
// guarantees (DESIGN.md, "Synchronization primitives").
#include <sluice/semaphore.hpp>

#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/death.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::tasks_on_loop;

TEST_CASE("a semaphore with initial value 0 is locked", "[semaphore]") {
  sluice::semaphore sem{0};
  CHECK(sem.locked());
  CHECK(sem.value() == 0);
  CHECK_FALSE(sem.try_acquire());
}

TEST_CASE("value waiters and locked are exact at every step", "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 2};
  CHECK(sem.value() == 2);
  CHECK_FALSE(sem.locked());
  REQUIRE(sem.try_acquire());
  CHECK(sem.value() == 1);
  CHECK_FALSE(sem.locked());
  REQUIRE(sem.try_acquire());
  CHECK(sem.value() == 0);
  CHECK(sem.locked());
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
  h.poll();
  CHECK(sem.waiters() == 2);
  CHECK(sem.value() == 0);
  sem.release();
  CHECK(sem.waiters() == 1);
  CHECK(sem.value() == 0);
  h.poll();
  CHECK(a.succeeded());
  CHECK_FALSE(b.done);
  sem.release();
  h.poll();
  CHECK(b.succeeded());
  CHECK(sem.waiters() == 0);
  CHECK(sem.value() == 0);
  sem.release();
  sem.release();
  sem.release();
  sem.release();
  CHECK(sem.value() == 4);
  CHECK_FALSE(sem.locked());
  CHECK(sem.max_waiters() == 2);
}

TEST_CASE("an uncontended acquire completes without a trip through the loop", "[semaphore]") {
  sluice::testing::virtual_loop loop;
  sluice::semaphore sem{1};
  bool other_ran = false;
  loop.run([&]() -> asio::awaitable<void> {
    asio::post(loop.get_executor(), [&] { other_ran = true; });
    co_await sem.acquire();
    CHECK_FALSE(other_ran);
    sem.release();
    auto p = co_await sem.scoped_acquire();
    CHECK_FALSE(other_ran);
  });
  CHECK(other_ran);
  CHECK(sem.value() == 1);
}

TEST_CASE("a woken waiter is resumed through a post, not inside release", "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
  h.poll();
  sem.release();
  CHECK_FALSE(a.done);
  h.poll();
  CHECK(a.succeeded());
}

TEST_CASE("two releases let exactly two of three waiters through", "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<int> order;
  for (int i = 1; i <= 3; ++i) {
    h.spawn([&, i]() -> asio::awaitable<void> {
      co_await sem.acquire();
      order.push_back(i);
    });
  }
  h.poll();
  CHECK(sem.waiters() == 3);
  sem.release();
  sem.release();
  h.poll();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(sem.waiters() == 1);
  CHECK(sem.value() == 0);
  CHECK(sem.locked());
}

TEST_CASE("with four waiters, two cancelled and one release, exactly the third runs",
          "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<sluice_test::task*> t;
  for (int i = 0; i < 4; ++i) {
    t.push_back(&h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); }));
  }
  h.poll();
  t[0]->cancel();
  t[1]->cancel();
  sem.release();
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(t[1]->cancelled());
  CHECK(t[2]->succeeded());
  CHECK_FALSE(t[3]->done);
  CHECK(sem.waiters() == 1);
  CHECK(sem.value() == 0);
}

TEST_CASE("the gh-90155 repro does not hang", "[semaphore]") {
  // One waiter is cancelled, then a release must still reach the other.
  sluice::testing::virtual_loop loop;
  sluice::semaphore sem{0};
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto ex = co_await asio::this_coro::executor;
    asio::cancellation_signal sig;
    bool first_aborted = false, second_done = false;
    asio::co_spawn(ex, sem.acquire(),
                   asio::bind_cancellation_slot(
                       sig.slot(), [&](std::exception_ptr e) { first_aborted = e != nullptr; }));
    asio::co_spawn(ex, sem.acquire(), [&](std::exception_ptr e) { second_done = e == nullptr; });
    co_await sluice::sleep(0s);
    sig.emit(asio::cancellation_type::terminal);
    sem.release();
    co_await sluice::sleep(1s);
    CHECK(first_aborted);
    CHECK(second_done);
    CHECK(sem.value() == 0);
    CHECK(sem.waiters() == 0);
  });
}

TEST_CASE("holders are served in FIFO order c1_1 c2_1 c3_1 c1_2 c2_2 c3_2", "[semaphore]") {
  sluice::testing::virtual_loop loop;
  sluice::semaphore sem{1};
  std::vector<std::string> result;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto coro = [&](std::string tag) -> asio::awaitable<void> {
      co_await sem.acquire();
      result.push_back(tag + "_1");
      co_await sluice::sleep(10ms);
      sem.release();
      co_await sem.acquire();
      result.push_back(tag + "_2");
      co_await sluice::sleep(10ms);
      sem.release();
    };
    co_await (coro("c1") && coro("c2") && coro("c3"));
  });
  CHECK(result == std::vector<std::string>{"c1_1", "c2_1", "c3_1", "c1_2", "c2_2", "c3_2"});
  CHECK(loop.now() == 60ms);
}

TEST_CASE("a holder that releases and re-acquires goes to the back of the queue", "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{1};
  std::vector<int> order;
  REQUIRE(sem.try_acquire());
  for (int i = 2; i <= 3; ++i) {
    h.spawn([&, i]() -> asio::awaitable<void> {
      co_await sem.acquire();
      order.push_back(i);
      sem.release();
    });
  }
  h.poll();
  auto& one = h.spawn([&]() -> asio::awaitable<void> {
    sem.release();
    CHECK_FALSE(sem.try_acquire());  // no barging past the waiters
    co_await sem.acquire();
    order.push_back(1);
    sem.release();
  });
  h.poll();
  CHECK(one.succeeded());
  CHECK(order == std::vector<int>{2, 3, 1});
  CHECK(sem.value() == 1);
}

TEST_CASE("try_acquire fails while others wait even if a permit was just released", "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
  h.poll();
  sem.release();  // handed to the waiter, not to the pool
  CHECK_FALSE(sem.try_acquire());
  h.poll();
  CHECK(a.succeeded());
}

TEST_CASE("a cancelled waiter is skipped", "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<int> order;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      co_await sem.acquire();
      order.push_back(i);
    }));
  }
  h.poll();
  t[0]->cancel();
  CHECK(sem.waiters() == 2);
  sem.release();
  sem.release();
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(order == std::vector<int>{2, 3});
  CHECK(sem.value() == 0);
}

TEST_CASE("a waiter granted then cancelled before it resumes hands its permit to the next",
          "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<int> order;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      co_await sem.acquire();
      order.push_back(i);
    }));
  }
  h.poll();
  sem.release();
  sem.release();   // 1 and 2 granted
  t[0]->cancel();  // 1 cancelled before it runs: its permit goes on to 3
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(order == std::vector<int>{2, 3});
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("async_acquire completes successfully once granted even if cancelled later",
          "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 0};
  asio::cancellation_signal sig;
  sluice::error_code result = asio::error::would_block;
  sem.async_acquire(
      asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code ec) { result = ec; }));
  sem.release();
  sig.emit(asio::cancellation_type::terminal);  // too late: already granted
  h.poll();
  CHECK_FALSE(result);
  CHECK(sem.value() == 0);
}

TEST_CASE("a timeout racing with a grant never loses a permit", "[semaphore]") {
  sluice::testing::virtual_loop loop;
  sluice::semaphore sem{1};
  int got = 0, timed_out = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto holder = [&]() -> asio::awaitable<void> {
      auto p = co_await sem.scoped_acquire();
      co_await sluice::sleep(1s);
    };
    auto contender = [&]() -> asio::awaitable<void> {
      auto r = co_await (sem.scoped_acquire() || sluice::sleep(1s));
      if (r.index() == 0) {
        ++got;
      } else {
        ++timed_out;
      }
    };
    auto plain = [&]() -> asio::awaitable<void> {
      auto r = co_await (sem.acquire() || sluice::sleep(1s));
      if (r.index() == 0) {
        ++got;
        sem.release();
      } else {
        ++timed_out;
      }
    };
    co_await (holder() && contender() && plain());
  });
  CHECK(got + timed_out == 2);
  CHECK(sem.value() == 1);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("releasing a bounded semaphore above its initial value throws logic_error",
          "[semaphore]") {
  sluice::bounded_semaphore sem{2};
  REQUIRE(sem.try_acquire());
  sem.release();
  CHECK_THROWS_AS(sem.release(), std::logic_error);
  CHECK(sem.value() == 2);
  sluice::bounded_semaphore zero{0};
  CHECK_THROWS_AS(zero.release(), std::logic_error);
}

TEST_CASE("a bounded semaphore of 0 refuses a release even while someone waits", "[semaphore]") {
  // Found by tests/fuzz/semaphore_fuzz: the release used to hand the waiter a
  // permit that never existed.
  sluice::testing::virtual_loop loop;
  sluice::bounded_semaphore zero{loop.get_executor(), 0};
  bool granted = false;
  zero.async_acquire([&](sluice::error_code ec) { granted = !ec; });
  CHECK_THROWS_AS(zero.release(), std::logic_error);
  loop.poll();
  CHECK_FALSE(granted);
  CHECK(zero.waiters() == 1);
  CHECK(zero.value() == 0);
}

TEST_CASE("a plain semaphore may be released above its initial value", "[semaphore]") {
  sluice::semaphore sem{1};
  sem.release();
  CHECK(sem.value() == 2);
}

TEST_CASE("scoped_acquire returns a move-only permit that releases on destruction", "[semaphore]") {
  sluice::testing::virtual_loop loop;
  sluice::semaphore sem{2};
  loop.run([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire();
    CHECK(p);
    CHECK(sem.value() == 1);
    {
      sluice::semaphore::permit q = std::move(p);
      CHECK_FALSE(p);
      CHECK(sem.value() == 1);
    }
    CHECK(sem.value() == 2);
    auto r = co_await sem.scoped_acquire();
    r.reset();
    CHECK(sem.value() == 2);
  });
  static_assert(!std::is_copy_constructible_v<sluice::semaphore::permit>);
}

TEST_CASE("async_acquire works with use_awaitable, a plain callback and use_future",
          "[semaphore]") {
  tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 0};
  bool by_awaitable = false;
  h.spawn([&]() -> asio::awaitable<void> {
    co_await sem.async_acquire(asio::use_awaitable);
    by_awaitable = true;
  });
  h.poll();
  sluice::error_code cb_ec = asio::error::would_block;
  sem.async_acquire([&](sluice::error_code ec) { cb_ec = ec; });
  std::future<void> fut = sem.async_acquire(asio::use_future);
  CHECK(sem.waiters() == 3);
  sem.release();
  sem.release();
  CHECK(cb_ec == asio::error::would_block);  // not inline
  sem.release();
  h.poll();
  CHECK(by_awaitable);
  CHECK_FALSE(cb_ec);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  fut.get();
}

TEST_CASE("a bare callback on a semaphore without an executor is rejected", "[semaphore]") {
  sluice::semaphore sem{1};
  CHECK_THROWS_AS(sem.async_acquire([](sluice::error_code) {}), std::invalid_argument);
  CHECK(sem.value() == 1);
}

TEST_CASE("destroying a semaphore with waiters completes them with operation_aborted",
          "[semaphore]") {
  tasks_on_loop h;
  auto sem = std::make_unique<sluice::semaphore>(0);
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await sem->acquire(); });
  sluice::error_code cb_ec;
  sem->async_acquire(
      asio::bind_executor(h.loop.get_executor(), [&](sluice::error_code ec) { cb_ec = ec; }));
  h.poll();
  sem.reset();
  h.poll();
  CHECK(a.cancelled());
  CHECK(cb_ec == asio::error::operation_aborted);
}

#if SLUICE_AFFINITY_CHECKS
#if SLUICE_TEST_CAN_FORK
TEST_CASE("the loop thread may keep using a primitive between runs", "[semaphore][affinity]") {
  auto r = sluice_test::run_in_child([] {
    sluice::testing::virtual_loop loop;
    sluice::semaphore sem{loop.get_executor(), 1};
    loop.run([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
    sem.release();
  });
  CHECK_FALSE(r.aborted);
}
#endif  // SLUICE_TEST_CAN_FORK
#endif

TEST_CASE("waiters on a strand are handed permits and resume on the strand", "[semaphore]") {
  sluice::testing::virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  sluice::semaphore sem{strand, 1};
  int resumed_on_strand = 0;
  std::vector<std::chrono::nanoseconds> acquired_at;
  for (int i = 0; i < 4; ++i) {
    asio::co_spawn(
        strand,
        [&]() -> asio::awaitable<void> {
          auto permit = co_await sem.scoped_acquire();
          resumed_on_strand += strand.running_in_this_thread() ? 1 : 0;
          acquired_at.push_back(loop.now());
          co_await sluice::sleep(std::chrono::seconds(1));
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  loop.run_for(std::chrono::seconds(10));
  CHECK(resumed_on_strand == 4);
  using std::chrono::seconds;
  CHECK(acquired_at ==
        std::vector<std::chrono::nanoseconds>{seconds(0), seconds(1), seconds(2), seconds(3)});
  CHECK(sem.value() == 1);
  CHECK(sem.waiters() == 0);
}

// ---------------------------------------------------------------------------
// Adversarial review: cancellation at every suspension point, every token kind.

TEST_CASE("a waiter cancelled before it is granted holds nothing and the next one gets the permit",
          "[semaphore][cancel]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<int> order;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      co_await sem.acquire();
      order.push_back(i);
    }));
  }
  h.poll();
  CHECK(sem.waiters() == 3);
  t[0]->cancel();
  CHECK(sem.waiters() == 2);  // removed at once, not on the next turn
  CHECK(sem.value() == 0);
  CHECK(sem.locked());
  t[0]->cancel();  // twice: nothing more happens
  CHECK(sem.waiters() == 2);
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(sem.waiters() == 2);
  sem.release();
  CHECK(sem.waiters() == 1);
  CHECK(sem.value() == 0);
  h.poll();
  CHECK(order == std::vector<int>{2});
  sem.release();
  h.poll();
  CHECK(order == std::vector<int>{2, 3});
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 0);
  sem.release();
  sem.release();
  CHECK(sem.value() == 2);
  CHECK_FALSE(sem.locked());
}

TEST_CASE("a waiter cancelled twice after its grant passes the permit on exactly once",
          "[semaphore][cancel]") {
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<int> order;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 3; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      co_await sem.acquire();
      order.push_back(i);
    }));
  }
  h.poll();
  sem.release();  // granted to 1
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 2);
  t[0]->cancel();
  t[0]->cancel();
  CHECK(sem.waiters() == 2);  // granted: nothing to remove
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(order == std::vector<int>{2});  // only 2: the permit was passed on once
  CHECK(sem.waiters() == 1);
  CHECK(sem.value() == 0);
  sem.release();
  h.poll();
  CHECK(order == std::vector<int>{2, 3});
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("cancel and release in the same turn, in either order, lose no permit",
          "[semaphore][cancel]") {
  const bool cancel_first = GENERATE(true, false);
  tasks_on_loop h;
  sluice::semaphore sem{0};
  std::vector<int> order;
  auto& a = h.spawn([&]() -> asio::awaitable<void> {
    co_await sem.acquire();
    order.push_back(1);
  });
  h.spawn([&]() -> asio::awaitable<void> {
    co_await sem.acquire();
    order.push_back(2);
  });
  h.poll();
  if (cancel_first) {
    a.cancel();
    sem.release();
  } else {
    sem.release();
    a.cancel();
  }
  h.poll();
  CHECK(a.cancelled());
  CHECK(order == std::vector<int>{2});
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("callback waiters: cancelled before the grant aborts, after the grant keeps the permit",
          "[semaphore][cancel]") {
  tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 0};
  asio::cancellation_signal s1, s2, s3;
  sluice::error_code e1 = asio::error::would_block, e2 = e1, e3 = e1;
  sem.async_acquire(
      asio::bind_cancellation_slot(s1.slot(), [&](sluice::error_code ec) { e1 = ec; }));
  sem.async_acquire(
      asio::bind_cancellation_slot(s2.slot(), [&](sluice::error_code ec) { e2 = ec; }));
  sem.async_acquire(
      asio::bind_cancellation_slot(s3.slot(), [&](sluice::error_code ec) { e3 = ec; }));
  CHECK(sem.waiters() == 3);
  s1.emit(asio::cancellation_type::terminal);
  s1.emit(asio::cancellation_type::terminal);
  CHECK(sem.waiters() == 2);
  sem.release();                               // to 2
  s2.emit(asio::cancellation_type::terminal);  // too late for 2
  CHECK(sem.waiters() == 1);
  CHECK(e1 == asio::error::would_block);  // never inline
  h.poll();
  CHECK(e1 == asio::error::operation_aborted);
  CHECK_FALSE(e2);
  CHECK(e3 == asio::error::would_block);
  sem.release();  // 2's permit, to 3
  h.poll();
  CHECK_FALSE(e3);
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 0);
  sem.release();
  CHECK(sem.value() == 1);
}

TEST_CASE("a use_future waiter can be cancelled and its future gets operation_aborted",
          "[semaphore][cancel]") {
  tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 0};
  asio::cancellation_signal sig;
  std::future<void> cancelled =
      sem.async_acquire(asio::bind_cancellation_slot(sig.slot(), asio::use_future));
  std::future<void> granted = sem.async_acquire(asio::use_future);
  CHECK(sem.waiters() == 2);
  sig.emit(asio::cancellation_type::terminal);
  CHECK(sem.waiters() == 1);
  sem.release();
  h.poll();
  REQUIRE(cancelled.wait_for(5s) == std::future_status::ready);
  REQUIRE(granted.wait_for(5s) == std::future_status::ready);
  try {
    cancelled.get();
    FAIL("the cancelled future holds no error");
  } catch (const sluice::system_error& e) {
    CHECK(e.code() == asio::error::operation_aborted);
  }
  granted.get();
  CHECK(sem.value() == 0);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("destroying a semaphore with waiters of every token kind aborts each of them",
          "[semaphore]") {
  tasks_on_loop h;
  auto sem = std::make_unique<sluice::semaphore>(h.loop.get_executor(), 0);
  auto& coro = h.spawn([&]() -> asio::awaitable<void> { co_await sem->acquire(); });
  auto& scoped = h.spawn([&]() -> asio::awaitable<void> { (void)co_await sem->scoped_acquire(); });
  sluice::error_code bare = asio::error::would_block, bound = bare;
  sem->async_acquire([&](sluice::error_code ec) { bare = ec; });
  sem->async_acquire(
      asio::bind_executor(h.loop.get_executor(), [&](sluice::error_code ec) { bound = ec; }));
  std::future<void> fut = sem->async_acquire(asio::use_future);
  h.poll();
  CHECK(sem->waiters() == 5);
  sem.reset();
  h.poll();
  CHECK(coro.cancelled());
  CHECK(scoped.cancelled());
  CHECK(bare == asio::error::operation_aborted);
  CHECK(bound == asio::error::operation_aborted);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  CHECK_THROWS_AS(fut.get(), sluice::system_error);
}

TEST_CASE("a bare callback runs on the semaphore's executor, a bound one on its own",
          "[semaphore]") {
  sluice::testing::virtual_loop loop;
  auto strand_a = asio::make_strand(loop.get_executor());
  auto strand_b = asio::make_strand(loop.get_executor());
  sluice::semaphore sem{strand_a, 0};
  int on_a = 0, on_b = 0;
  sem.async_acquire([&](sluice::error_code ec) {
    CHECK_FALSE(ec);
    on_a += strand_a.running_in_this_thread() ? 1 : 0;
    on_b += strand_b.running_in_this_thread() ? 1 : 0;
  });
  sem.async_acquire(asio::bind_executor(strand_b, [&](sluice::error_code ec) {
    CHECK_FALSE(ec);
    on_a += strand_a.running_in_this_thread() ? 10 : 0;
    on_b += strand_b.running_in_this_thread() ? 10 : 0;
  }));
  sem.release();
  sem.release();
  loop.poll();
  CHECK(on_a == 1);
  CHECK(on_b == 10);
  CHECK(sem.value() == 0);
}

TEST_CASE("coroutines on different strands share a semaphore in FIFO order", "[semaphore]") {
  sluice::testing::virtual_loop loop;
  auto s1 = asio::make_strand(loop.get_executor());
  auto s2 = asio::make_strand(loop.get_executor());
  sluice::semaphore sem{1};
  std::vector<int> order, arrivals;
  int wrong_strand = 0;
  for (int i = 0; i < 6; ++i) {
    auto& s = (i % 2 == 0) ? s1 : s2;
    asio::co_spawn(
        s,
        [&, i]() -> asio::awaitable<void> {
          arrivals.push_back(i);  // the wait is queued synchronously below
          auto permit = co_await sem.scoped_acquire();
          if (!s.running_in_this_thread()) ++wrong_strand;
          order.push_back(i);
          co_await sluice::sleep(1s);
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  loop.run_for(10s);
  REQUIRE(arrivals.size() == 6);
  CHECK(order == arrivals);
  CHECK(wrong_strand == 0);
  CHECK(loop.now() == 10s);
  CHECK(sem.value() == 1);
  CHECK(sem.waiters() == 0);
}

namespace {

// One seeded run of 200 coroutines acquiring, holding, timing out and being
// cancelled on a semaphore of 3. Returns a trace of (time, id, what).
std::vector<std::string> random_interleaving(unsigned seed, int& granted, int& aborted) {
  constexpr int n = 200;
  constexpr std::size_t cap = 3;
  std::vector<asio::cancellation_signal> signals(n);  // outlive the loop
  std::vector<std::string> trace;
  sluice::testing::virtual_loop loop;
  sluice::semaphore sem{cap};
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  std::size_t holders = 0, max_holders = 0;
  int done = 0;
  granted = aborted = 0;
  auto log = [&](int id, const char* what) {
    trace.push_back(std::to_string(loop.now().count()) + " " + std::to_string(id) + " " + what);
  };
  auto hold = [&](int id) {
    ++holders;
    ++granted;
    max_holders = std::max(max_holders, holders);
    CHECK(sem.value() + holders <= cap);
    log(id, "got");
  };
  auto drop = [&](int id) {
    --holders;
    sem.release();
    log(id, "released");
  };
  for (int id = 0; id < n; ++id) {
    const auto start = std::chrono::milliseconds(pick(0, 500));
    const auto held = std::chrono::milliseconds(pick(1, 50));
    const auto patience = std::chrono::milliseconds(pick(1, 100));
    const int kind = pick(0, 2);
    asio::co_spawn(
        loop.get_executor(),
        [&, id, start, held, patience, kind]() -> asio::awaitable<void> {
          using namespace asio::experimental::awaitable_operators;
          co_await sluice::sleep(start);
          if (kind == 0) {  // plain acquire, maybe cancelled from outside
            co_await sem.acquire();
            hold(id);
            try {
              co_await sluice::sleep(held);
            } catch (...) {
              drop(id);
              throw;
            }
            drop(id);
          } else if (kind == 1) {  // scoped, raced against a timeout
            auto r = co_await (sem.scoped_acquire() || sluice::sleep(patience));
            if (r.index() == 0) {
              hold(id);
              try {
                co_await sluice::sleep(held);
              } catch (...) {
                --holders;  // the permit in r is released as it unwinds
                throw;
              }
              --holders;
              log(id, "released");
            } else {
              log(id, "timed out");
            }
          } else {  // acquire raced against a timeout, then cancellable hold
            auto r = co_await (sem.acquire() || sluice::sleep(patience));
            if (r.index() == 0) {
              hold(id);
              try {
                co_await sluice::sleep(held);
              } catch (...) {
                drop(id);
                throw;
              }
              drop(id);
            } else {
              log(id, "timed out");
            }
          }
        },
        asio::bind_cancellation_slot(signals[id].slot(), [&, id](std::exception_ptr e) {
          ++done;
          if (e) {
            ++aborted;
            log(id, "aborted");
          }
        }));
  }
  // A canceller that cancels random tasks at random times.
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<void> {
        for (int k = 0; k < 150; ++k) {
          co_await sluice::sleep(std::chrono::milliseconds(pick(0, 6)));
          signals[static_cast<std::size_t>(pick(0, n - 1))].emit(asio::cancellation_type::terminal);
        }
      },
      asio::detached);
  loop.run_for(std::chrono::seconds(10));
  CHECK(done == n);
  CHECK(holders == 0);
  CHECK(max_holders <= cap);
  CHECK(sem.value() == cap);
  CHECK(sem.waiters() == 0);
  CHECK_FALSE(sem.locked());
  return trace;
}

}  // namespace

TEST_CASE("a seeded random interleaving of acquires, timeouts and cancels conserves permits",
          "[semaphore][stress]") {
  const unsigned seed = GENERATE(1u, 2u, 3u, 42u, 2024u);
  int granted = 0, aborted = 0;
  const auto first = random_interleaving(seed, granted, aborted);
  CHECK(granted > 50);  // the run exercised contention...
  CHECK(aborted > 5);   // ...and cancellation
  int granted2 = 0, aborted2 = 0;
  CHECK(random_interleaving(seed, granted2, aborted2) == first);  // deterministic by seed
  CHECK(granted2 == granted);
}

TEST_CASE("a semaphore takes its count as any integer type and rejects a negative one",
          "[semaphore]") {
  int n = 3;  // an int variable in braces: not a narrowing error
  sluice::semaphore sem{n};
  CHECK(sem.value() == 3);
  long long big = 5;
  sluice::bounded_semaphore bounded{big};
  CHECK(bounded.value() == 5);
  sluice::testing::virtual_loop loop;
  short s = 2;
  sluice::semaphore with_ex{loop.get_executor(), s};
  CHECK(with_ex.value() == 2);
  int negative = -1;
  CHECK_THROWS_WITH(sluice::semaphore(negative), "sluice::semaphore: initial must not be negative");
  CHECK_THROWS_AS(sluice::bounded_semaphore(negative), std::invalid_argument);
  CHECK_THROWS_AS(sluice::semaphore(loop.get_executor(), negative), std::invalid_argument);
  CHECK(sluice::semaphore{}.value() == 1);
}
