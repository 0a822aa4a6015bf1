// SPDX-License-Identifier: BSL-1.0
#include <sluice/shared_semaphore.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lifetime.hpp>
#include <support/peak.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

using namespace std::chrono_literals;

namespace {

// N io_contexts, each run by a thread of its own.
struct loops {
  explicit loops(std::size_t n) : ctx(n) {}
  std::vector<asio::io_context> ctx;
  std::vector<std::thread> threads;

  void start() {
    for (auto& c : ctx) threads.emplace_back([&c] { c.run(); });
  }
  void join() {
    for (auto& t : threads) t.join();
    threads.clear();
  }
};

// Spins (on a test thread) until `pred()` holds.
template <class Pred>
void until(Pred pred) {
  while (!pred()) std::this_thread::sleep_for(100us);
}

// A semaphore whose only permit is held (by the test) and one coroutine
// waiting on it, cancellable through `cancel`; `how` is how it ended.
struct one_waiter {
  sluice::shared_semaphore sem{1};
  asio::io_context ctx;
  asio::cancellation_signal cancel;
  std::string how;
  one_waiter() {
    REQUIRE(sem.try_acquire());
    asio::co_spawn(ctx, sluice_test::ending_of(sem.acquire()),
                   sluice_test::bind_slot(cancel.slot(),
                                          [this](std::exception_ptr, std::string s) { how = s; }));
    ctx.poll();
    REQUIRE(sem.waiters() == 1);
  }
};

}  // namespace

TEST_CASE("8 threads x 1000 coroutines never hold more than 5 permits and all finish",
          "[shared_semaphore]") {
  sluice::shared_semaphore sem{5};
  std::atomic<int> holders{0}, max_holders{0}, finished{0};
  std::atomic<int> wrong_thread{0};
  loops l(8);
  for (auto& ctx : l.ctx) {
    for (int i = 0; i < 1000; ++i) {
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            const auto self = std::this_thread::get_id();
            auto permit = co_await sem.scoped_acquire();
            if (std::this_thread::get_id() != self) ++wrong_thread;
            sluice_test::raise_peak(max_holders, ++holders);
            co_await asio::post(asio::use_awaitable);  // hold it across a suspension
            --holders;
            permit.reset();
            ++finished;
          },
          asio::detached);
    }
  }
  l.start();
  l.join();
  CHECK(finished.load() == 8000);
  CHECK(max_holders.load() <= 5);
  CHECK(max_holders.load() >= 1);
  CHECK(wrong_thread.load() == 0);
  CHECK(sem.value() == 5);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("callbacks, coroutines and use_future share one cap across threads",
          "[shared_semaphore]") {
  sluice::shared_semaphore sem{3};
  std::atomic<int> holders{0}, max_holders{0}, finished{0};
  loops l(4);
  for (auto& ctx : l.ctx) {
    for (int i = 0; i < 250; ++i) {
      sem.async_acquire(asio::bind_executor(ctx, [&](sluice::error_code ec) {
        if (ec) return;
        sluice_test::raise_peak(max_holders, ++holders);
        --holders;
        sem.release();
        ++finished;
      }));
    }
  }
  l.start();
  for (int i = 0; i < 100; ++i) {  // a plain thread waits on futures meanwhile
    sem.async_acquire(asio::use_future).get();
    sluice_test::raise_peak(max_holders, ++holders);
    --holders;
    sem.release();
    ++finished;
  }
  l.join();
  CHECK(finished.load() == 1100);
  CHECK(max_holders.load() <= 3);
  CHECK(sem.value() == 3);
}

TEST_CASE("waiters on different threads are served in FIFO order, each on its own thread",
          "[shared_semaphore]") {
  sluice::shared_semaphore sem{1};
  REQUIRE(sem.try_acquire());
  loops l(2);
  auto guard_a = asio::make_work_guard(l.ctx[0]);
  auto guard_b = asio::make_work_guard(l.ctx[1]);
  l.start();
  std::mutex m;
  std::vector<int> order;
  std::vector<bool> on_own_thread(6, false);
  std::vector<std::thread::id> loop_thread{l.threads[0].get_id(), l.threads[1].get_id()};
  for (int i = 0; i < 6; ++i) {
    auto& ctx = l.ctx[static_cast<std::size_t>(i % 2)];  // alternate between the threads
    asio::co_spawn(
        ctx,
        [&, i]() -> asio::awaitable<void> {
          co_await sem.acquire();
          {
            std::lock_guard<std::mutex> lock(m);
            order.push_back(i);
            on_own_thread[static_cast<std::size_t>(i)] =
                std::this_thread::get_id() == loop_thread[static_cast<std::size_t>(i % 2)];
          }
          sem.release();
        },
        asio::detached);
    until([&] { return sem.waiters() == static_cast<std::size_t>(i + 1); });
  }
  CHECK_FALSE(sem.try_acquire());  // no barging past the waiters
  sem.release();
  until([&] {
    std::lock_guard<std::mutex> lock(m);
    return order.size() == 6;
  });
  guard_a.reset();
  guard_b.reset();
  l.join();
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4, 5});
  CHECK(on_own_thread == std::vector<bool>(6, true));
  CHECK(sem.value() == 1);
}

TEST_CASE(
    "timeouts cancel waiters on their own threads while other threads release, losing "
    "nothing",
    "[shared_semaphore]") {
  using namespace asio::experimental::awaitable_operators;
  sluice::shared_semaphore sem{2};
  std::atomic<int> holders{0}, max_holders{0}, acquired{0}, timed_out{0};
  loops l(4);
  for (std::size_t t = 0; t < l.ctx.size(); ++t) {
    for (int i = 0; i < 300; ++i) {
      asio::co_spawn(
          l.ctx[t],
          [&, i]() -> asio::awaitable<void> {
            auto r = co_await (sem.acquire() ||
                               sluice::sleep(std::chrono::microseconds(10 + (i % 7) * 15)));
            if (r.index() == 1) {
              ++timed_out;
              co_return;
            }
            sluice_test::raise_peak(max_holders, ++holders);
            co_await sluice::sleep(std::chrono::microseconds(20));
            --holders;
            sem.release();
            ++acquired;
          },
          asio::detached);
    }
  }
  l.start();
  l.join();
  CHECK(acquired.load() + timed_out.load() == 1200);
  CHECK(acquired.load() > 0);
  CHECK(max_holders.load() <= 2);
  CHECK(sem.value() == 2);  // no permit lost, none duplicated
  CHECK(sem.waiters() == 0);
}

TEST_CASE("a waiter cancelled after it was granted hands the permit on and throws",
          "[shared_semaphore]") {
  one_waiter w;
  auto& [sem, ctx, cancel, how] = w;
  sem.release();  // granted; the completion is posted, not run
  CHECK(sem.value() == 0);
  cancel.emit(asio::cancellation_type::terminal);  // too late to remove it
  ctx.run();
  CHECK(how == "aborted");
  CHECK(sem.value() == 1);  // passed on, not lost
}

TEST_CASE("a cancelled waiter is removed and holds nothing", "[shared_semaphore]") {
  one_waiter w;
  auto& [sem, ctx, cancel, how] = w;
  cancel.emit(asio::cancellation_type::terminal);
  CHECK(sem.waiters() == 0);
  ctx.run();
  CHECK(how == "aborted");
  sem.release();
  CHECK(sem.value() == 1);
}

TEST_CASE("release hands the permit to a waiter rather than the pool; try_acquire never barges",
          "[shared_semaphore]") {
  sluice::shared_semaphore sem{0};
  CHECK_FALSE(sem.try_acquire());
  asio::io_context ctx;
  bool got = false;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await sem.acquire();
        got = true;
      },
      asio::detached);
  ctx.poll();
  CHECK(sem.locked());
  std::thread([&] { sem.release(); }).join();  // from another thread
  CHECK(sem.value() == 0);                     // handed over, not pooled
  CHECK_FALSE(sem.try_acquire());
  CHECK_FALSE(got);  // resumed through a post, not inside release
  ctx.run();
  CHECK(got);
  CHECK(sem.max_waiters() == 1);
}

TEST_CASE("destroying the semaphore completes its waiters with operation_aborted",
          "[shared_semaphore]") {
  asio::io_context ctx;
  std::string how;
  {
    sluice::shared_semaphore sem{0};
    sem.async_acquire(asio::bind_executor(
        ctx, [&](sluice::error_code ec) { how = ec ? ec.message() : "granted"; }));
  }
  ctx.run();
  CHECK(how == sluice::error_code(asio::error::operation_aborted).message());
}

TEST_CASE("a handler without an executor needs a semaphore with one", "[shared_semaphore]") {
  sluice::shared_semaphore bare{1};
  CHECK_THROWS_AS(bare.async_acquire([](sluice::error_code) {}), std::invalid_argument);
  CHECK(bare.value() == 1);

  asio::io_context ctx;
  sluice::shared_semaphore with_ex{ctx.get_executor(), 1};
  bool ran = false;
  with_ex.async_acquire([&](sluice::error_code ec) { ran = !ec; });
  ctx.run();
  CHECK(ran);
  CHECK(with_ex.value() == 0);
}

TEST_CASE("an uncontended acquire does not suspend", "[shared_semaphore]") {
  sluice::shared_semaphore sem{2};
  asio::io_context ctx;
  int steps = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await sem.acquire();
        co_await sem.acquire();
        steps = 2;
      },
      asio::detached);
  ctx.run_one();  // the co_spawn start itself
  CHECK(steps == 2);
  CHECK(sem.value() == 0);
}

TEST_CASE("a permit is move-only and releases once, on whichever thread drops it",
          "[shared_semaphore]") {
  static_assert(!std::is_copy_constructible_v<sluice::shared_semaphore::permit>);
  static_assert(std::is_nothrow_move_assignable_v<sluice::shared_semaphore::permit>);
  sluice::shared_semaphore sem{2};
  asio::io_context ctx;
  sluice::shared_semaphore::permit a, b;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        a = co_await sem.scoped_acquire();
        b = co_await sem.scoped_acquire();
      },
      asio::detached);
  ctx.run();
  REQUIRE(a);
  REQUIRE(b);
  CHECK(sem.value() == 0);
  a = std::move(b);  // releases what `a` held, takes `b`'s
  CHECK_FALSE(b);
  CHECK(sem.value() == 1);
  std::thread([p = std::move(a)]() mutable { p.reset(); }).join();
  CHECK_FALSE(a);
  CHECK(sem.value() == 2);
}

TEST_CASE(
    "a waiter cancelled on its thread while another thread releases to it loses no permit, "
    "over many races",
    "[shared_semaphore]") {
  // Each round: the permit is held here; waiter 1 waits on loop A, waiter 2
  // on loop B. Loop A cancels waiter 1 while this thread releases: waiter 1
  // is removed (the release goes to waiter 2), or granted and resumed (it
  // releases at once), or granted and then cancelled before it resumed (it
  // hands the permit on and throws). In every case waiter 2 gets the permit.
  sluice::shared_semaphore sem{1};
  loops l(2);
  auto guard_a = asio::make_work_guard(l.ctx[0]);
  auto guard_b = asio::make_work_guard(l.ctx[1]);
  l.start();
  constexpr int rounds = 300;
  int first_aborted = 0, first_ok = 0, lost = 0;
  for (int round = 0; round < rounds; ++round) {
    REQUIRE(sem.try_acquire());
    asio::cancellation_signal cancel;      // emitted on loop A only
    std::atomic<int> first{0}, second{0};  // 1: ok, 2: aborted
    asio::co_spawn(l.ctx[0], sluice_test::ending_of(sem.acquire()),
                   sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr, std::string s) {
                     if (s == "ok") sem.release();
                     first = s == "ok" ? 1 : 2;
                   }));
    until([&] { return sem.waiters() == 1; });
    asio::co_spawn(l.ctx[1], sluice_test::ending_of(sem.acquire()),
                   [&](std::exception_ptr, std::string s) {
                     if (s == "ok") sem.release();
                     second = s == "ok" ? 1 : 2;
                   });
    until([&] { return sem.waiters() == 2; });
    // The cancellation runs on loop A after a spin of 0-49 us, racing this
    // thread's release; every third round releases first.
    const auto spin = std::chrono::microseconds(round % 50);
    std::atomic<bool> emitted{false};
    auto cancel_on_a = [&cancel, &emitted, spin] {
      const auto until_t = std::chrono::steady_clock::now() + spin;
      while (std::chrono::steady_clock::now() < until_t) {
      }
      cancel.emit(asio::cancellation_type::terminal);
      emitted = true;
    };
    if (round % 3 == 0) sem.release();
    asio::post(l.ctx[0], cancel_on_a);
    if (round % 3 != 0) sem.release();
    const auto give_up = std::chrono::steady_clock::now() + 10s;  // a lost permit: no hang
    while ((first == 0 || second == 0 || !emitted) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(20us);
    if (first == 0 || second != 1 || !emitted) {
      ++lost;
      if (second == 0) sem.release();  // a permit was lost: let waiter 2 end
      until([&] { return second != 0 && emitted; });
      break;
    }
    if (first == 2) ++first_aborted;
    if (first == 1) ++first_ok;
    until([&] { return sem.value() == 1; });  // the last release may still be under way
  }
  guard_a.reset();
  guard_b.reset();
  l.join();
  CHECK(lost == 0);
  CHECK(sem.value() == 1);
  CHECK(sem.waiters() == 0);
  WARN("waiter 1: cancelled (removed or handed on) in " << first_aborted << ", granted in "
                                                        << first_ok << " of " << rounds);
}

TEST_CASE("a waiter's loop destroyed before release() frees the waiter and loses no permit",
          "[shared_semaphore][lifetime]") {
  // ASan: release() posted into the destroyed io_context (use after free).
  using sluice_test::lifetime_counter;
  const int before = lifetime_counter::live();
  sluice::shared_semaphore sem{1};
  REQUIRE(sem.try_acquire());
  {
    asio::io_context ctx;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          lifetime_counter in_frame;
          co_await sem.acquire();
          sem.release();
        },
        asio::detached);
    ctx.run_for(10ms);  // stopped with the waiter queued
    REQUIRE(sem.waiters() == 1);
  }  // the loop dies: its waiter goes with it
  CHECK(sem.waiters() == 0);
  CHECK(lifetime_counter::live() == before);
  std::thread elsewhere([&] { sem.release(); });
  elsewhere.join();
  CHECK(sem.value() == 1);  // the permit was not handed to the dead waiter
}

TEST_CASE("a waiter granted but not yet resumed when its loop dies is freed with the loop",
          "[shared_semaphore][lifetime]") {
  using sluice_test::lifetime_counter;
  const int before = lifetime_counter::live();
  sluice::shared_semaphore sem{1};
  REQUIRE(sem.try_acquire());
  {
    asio::io_context ctx;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          lifetime_counter in_frame;
          co_await sem.acquire();
        },
        asio::detached);
    ctx.poll();
    REQUIRE(sem.waiters() == 1);
    sem.release();  // granted: the completion is posted, never run
  }
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE("threads that destroy their loop right after run() race with no grant's post",
          "[shared_semaphore][lifetime]") {
  // TSan: the releasing thread must be done with its post before the
  // waiter's thread may destroy the io_context.
  sluice::shared_semaphore sem{1};
  int granted = 0;
  for (int round = 0; round < 200; ++round) {
    REQUIRE(sem.try_acquire());
    std::atomic<bool> queued{false};
    std::thread owner([&] {
      asio::io_context ctx;
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            auto permit = co_await sem.scoped_acquire();
            ++granted;
          },
          asio::detached);
      ctx.poll();
      queued = true;
      ctx.restart();
      ctx.run();
    });
    until([&] { return queued.load() && sem.waiters() == 1; });
    sem.release();
    owner.join();
  }
  CHECK(granted == 200);
  CHECK(sem.value() == 1);
}
