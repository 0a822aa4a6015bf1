// SPDX-License-Identifier: BSL-1.0
// Behaviours of CPython's test_locks.py SemaphoreTests, plus sluice's own
// guarantees (DESIGN.md, "Synchronization primitives").
#include <sluice/semaphore.hpp>

#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <asio/bind_executor.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/use_future.hpp>

#include <catch2/catch.hpp>
#include <support/death.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
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
  std::error_code result = asio::error::would_block;
  sem.async_acquire(
      asio::bind_cancellation_slot(sig.slot(), [&](std::error_code ec) { result = ec; }));
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
  std::error_code cb_ec = asio::error::would_block;
  sem.async_acquire([&](std::error_code ec) { cb_ec = ec; });
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
  CHECK_THROWS_AS(sem.async_acquire([](std::error_code) {}), std::invalid_argument);
  CHECK(sem.value() == 1);
}

TEST_CASE("destroying a semaphore with waiters completes them with operation_aborted",
          "[semaphore]") {
  tasks_on_loop h;
  auto sem = std::make_unique<sluice::semaphore>(0);
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await sem->acquire(); });
  std::error_code cb_ec;
  sem->async_acquire(
      asio::bind_executor(h.loop.get_executor(), [&](std::error_code ec) { cb_ec = ec; }));
  h.poll();
  sem.reset();
  h.poll();
  CHECK(a.cancelled());
  CHECK(cb_ec == asio::error::operation_aborted);
}

#if SLUICE_AFFINITY_CHECKS
TEST_CASE("the affinity check accepts the loop thread and flags another thread",
          "[semaphore][affinity]") {
  asio::io_context ctx;
  sluice::detail::affinity a;
  a.bind(ctx.get_executor());
  CHECK_FALSE(a.violated());  // set-up before the loop ran it
  asio::post(ctx, [&] { CHECK_FALSE(a.violated()); });
  std::thread loop_thread([&] { ctx.run(); });
  loop_thread.join();
  CHECK(a.violated());  // the loop ran it on loop_thread, this is another thread
}

#if SLUICE_TEST_CAN_FORK
TEST_CASE("a semaphore used from a thread that is not running its loop aborts naming it",
          "[semaphore][affinity]") {
  auto r = sluice_test::run_in_child([] {
    asio::io_context ctx;
    sluice::semaphore sem{ctx.get_executor(), 1};
    asio::post(ctx, [&] { (void)sem.try_acquire(); });
    std::thread t([&] { ctx.run(); });
    t.join();
    sem.release();  // main thread, while the loop belongs to t
  });
  CHECK(r.aborted);
  CHECK(r.stderr_text.find("sluice::semaphore") != std::string::npos);
}

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
