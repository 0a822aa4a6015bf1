// SPDX-License-Identifier: BSL-1.0
// stats() on every limit (DESIGN.md "Operating it"): counts and durations
// exact in virtual time, quantiles from the documented log buckets.
#include <sluice/sluice.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <sluice/detail/stats_recorder.hpp>

#include <support/asio.hpp>
#include <support/spawned.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using std::chrono::nanoseconds;

namespace {

// The upper edge of the bucket that holds `d` (what p50/p99 report unless
// clamped by min or max).
nanoseconds edge(nanoseconds d) {
  return nanoseconds(static_cast<std::int64_t>(
      sluice::detail::stats_bucket_high(sluice::detail::stats_bucket(d.count()))));
}

// Holds a permit of `sem` for `hold`, starting at `start`.
template <class Sem>
asio::awaitable<void> hold_for(Sem& sem, nanoseconds start, nanoseconds hold) {
  co_await sluice::sleep(start);
  auto permit = co_await sem.scoped_acquire();
  co_await sluice::sleep(hold);
}

}  // namespace

TEST_CASE("the log buckets: exact below 8 ns, then 8 per power of two", "[stats]") {
  using sluice::detail::stats_bucket;
  using sluice::detail::stats_bucket_high;
  using sluice::detail::stats_bucket_low;
  for (std::uint64_t v = 0; v < 8; ++v) CHECK(stats_bucket(v) == v);
  // Every value lies in its bucket, and a bucket is at most 1/8 of its lower edge wide.
  for (std::uint64_t v : {8ull, 9ull, 15ull, 16ull, 17ull, 1000ull, 999'999ull, 1'000'000'000ull,
                          123'456'789'012ull}) {
    const auto b = stats_bucket(v);
    CHECK(stats_bucket_low(b) <= v);
    CHECK(v <= stats_bucket_high(b));
    CHECK(stats_bucket_high(b) - stats_bucket_low(b) + 1 <= stats_bucket_low(b) / 8 + 1);
  }
  CHECK(edge(1s) == 1'006'632'959ns);  // the bucket [939'524'096, 1'006'632'959] ns
}

TEST_CASE("a semaphore counts grants, waits and holds exactly in virtual time", "[stats]") {
  virtual_loop loop;
  sluice::semaphore sem{2};
  sluice::stats mid;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    // A and B take the two permits at 0 for 1 s and 3 s; C waits for A (1 s),
    // holds 2 s; D waits for the next release, at 3 s, and holds 1 s.
    tasks.push_back(hold_for(sem, 0s, 1s));
    tasks.push_back(hold_for(sem, 0s, 3s));
    tasks.push_back(hold_for(sem, 0s, 2s));
    tasks.push_back(hold_for(sem, 0s, 1s));
    tasks.push_back([](sluice::semaphore& sem, sluice::stats& mid) -> asio::awaitable<void> {
      co_await sluice::sleep(500ms);
      mid = sem.stats();
    }(sem, mid));
    co_await sluice::gather(std::move(tasks));
  }());
  CHECK(loop.now() == 4s);
  CHECK(mid.acquired == 2);
  CHECK(mid.waiting == 2);
  CHECK(mid.in_use == 2);
  CHECK(mid.limit == 2);

  const sluice::stats s = sem.stats();
  CHECK(s.acquired == 4);
  CHECK(s.cancelled == 0);
  CHECK(s.throttled == 0);
  CHECK(s.waiting == 0);
  CHECK(s.in_use == 0);
  CHECK(s.limit == 2);
  // Waits 0, 0, 1 s, 3 s.
  CHECK(s.wait.count == 4);
  CHECK(s.wait.total == 4s);
  CHECK(s.wait.mean() == 1s);
  CHECK(s.wait.min == 0s);
  CHECK(s.wait.max == 3s);
  CHECK(s.wait.p50 == 0s);
  CHECK(s.wait.p99 == 3s);  // the bucket's edge, clamped to the max
  // Holds 1 s, 3 s, 2 s, 1 s.
  CHECK(s.hold.count == 4);
  CHECK(s.hold.total == 7s);
  CHECK(s.hold.mean() == 1750ms);
  CHECK(s.hold.min == 1s);
  CHECK(s.hold.max == 3s);
  CHECK(s.hold.p50 == edge(1s));
  CHECK(s.hold.p99 == 3s);
}

TEST_CASE("a grant that did not wait counts as a wait of 0; acquire and release have no hold",
          "[stats]") {
  virtual_loop loop;
  sluice::bounded_semaphore sem{3};
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 1000; ++i) {
      co_await sem.acquire();
      co_await sluice::sleep(1ms);
      sem.release();
    }
    REQUIRE(sem.try_acquire());
    sem.release();
  }());
  const auto s = sem.stats();
  CHECK(s.acquired == 1001);
  CHECK(s.wait.count == 1001);
  CHECK(s.wait.total == 0s);
  CHECK(s.wait.p99 == 0s);
  CHECK(s.hold.count == 0);
  CHECK(s.in_use == 0);
  CHECK(s.limit == 3);
}

TEST_CASE("a cancelled wait counts as cancelled and holds nothing", "[stats]") {
  virtual_loop loop;
  sluice::semaphore sem{1};
  loop.run([&]() -> asio::awaitable<void> {
    auto held = co_await sem.scoped_acquire();
    for (int i = 0; i < 3; ++i) {
      CHECK_THROWS_AS(co_await sluice::with_timeout(2s, sem.acquire()), sluice::timeout_error);
    }
    CHECK(sem.stats().waiting == 0);
  }());
  const auto s = sem.stats();
  CHECK(s.acquired == 1);
  CHECK(s.cancelled == 3);
  CHECK(s.wait.count == 1);
  CHECK(s.hold.count == 1);
  CHECK(s.hold.total == 6s);
}

TEST_CASE("a permit moved keeps its hold; reset() ends it", "[stats]") {
  virtual_loop loop;
  sluice::semaphore sem{1};
  loop.run([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire();
    co_await sluice::sleep(2s);
    sluice::semaphore::permit q = std::move(p);
    CHECK(sem.stats().hold.count == 0);
    co_await sluice::sleep(3s);
    q.reset();
    CHECK(sem.stats().hold.count == 1);
    co_await sluice::sleep(4s);
  }());
  const auto s = sem.stats();
  CHECK(s.hold.count == 1);
  CHECK(s.hold.total == 5s);
}

TEST_CASE("on the steady clock one permit in 16 has its hold timed; every grant is counted",
          "[stats]") {
  asio::io_context ctx;
  sluice::semaphore sem{1};
  sluice::lock mutex;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 40; ++i) {
          auto p = co_await sem.scoped_acquire();
          auto g = co_await mutex.scoped_acquire();
        }
      },
      asio::detached);
  ctx.run();
  const auto s = sem.stats();
  CHECK(s.acquired == 40);
  CHECK(s.wait.count == 40);
  CHECK(s.hold.count == 3);  // the 1st, 17th and 33rd
  CHECK(mutex.stats().hold.count == 3);
}

TEST_CASE("a lock reports its guards' holds and its waiters' waits", "[stats]") {
  virtual_loop loop;
  sluice::lock mutex;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    for (int i = 0; i < 5; ++i) tasks.push_back(hold_for(mutex, 0s, 2s));
    co_await sluice::gather(std::move(tasks));
  }());
  CHECK(loop.now() == 10s);
  const auto s = mutex.stats();
  CHECK(s.acquired == 5);
  CHECK(s.limit == 1);
  CHECK(s.in_use == 0);
  CHECK(s.wait.total == 0s + 2s + 4s + 6s + 8s);
  CHECK(s.wait.max == 8s);
  CHECK(s.wait.p50 == edge(4s));
  CHECK(s.hold.count == 5);
  CHECK(s.hold.total == 10s);
  CHECK(s.hold.p50 == 2s);  // every hold the same: exact
  CHECK(s.hold.p99 == 2s);
}

TEST_CASE("a shared_semaphore reports the same on a virtual loop", "[stats]") {
  virtual_loop loop;
  sluice::shared_semaphore sem{2};
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    tasks.push_back(hold_for(sem, 0s, 1s));
    tasks.push_back(hold_for(sem, 0s, 3s));
    tasks.push_back(hold_for(sem, 0s, 2s));
    tasks.push_back(hold_for(sem, 0s, 1s));
    tasks.push_back([](sluice::shared_semaphore& sem) -> asio::awaitable<void> {
      co_await sluice::sleep(500ms);
      const auto mid = sem.stats();
      CHECK(mid.waiting == 2);
      CHECK(mid.in_use == 2);
      CHECK(sem.try_acquire() == false);
      CHECK_THROWS_AS(co_await sluice::with_timeout(1s, sem.acquire()), sluice::timeout_error);
    }(sem));
    co_await sluice::gather(std::move(tasks));
  }());
  const auto s = sem.stats();
  CHECK(s.acquired == 4);
  CHECK(s.cancelled == 1);
  CHECK(s.waiting == 0);
  CHECK(s.in_use == 0);
  CHECK(s.limit == 2);
  CHECK(s.wait.count == 4);
  CHECK(s.wait.total == 4s);
  CHECK(s.wait.max == 3s);
  CHECK(s.hold.count == 4);
  CHECK(s.hold.total == 7s);
  CHECK(s.hold.p99 == 3s);
}

// A limit outlives the loops that use it (a virtual loop per batch, each at
// the same address): its stats read each batch's clock, never a dead one's.
template <class Sem>
void three_batches_on_their_own_virtual_loops(Sem& sem) {
  for (int batch = 0; batch < 3; ++batch) {
    virtual_loop loop;
    loop.run([&]() -> asio::awaitable<void> {
      std::vector<asio::awaitable<void>> tasks;
      tasks.push_back(hold_for(sem, 0s, 1s));
      tasks.push_back(hold_for(sem, 0s, 2s));  // waits 1 s for the first
      co_await sluice::gather(std::move(tasks));
    });
  }
  const auto s = sem.stats();
  CHECK(s.acquired == 6);
  CHECK(s.wait.count == 6);
  CHECK(s.wait.total == 3s);
  CHECK(s.wait.max == 1s);
  CHECK(s.hold.count == 6);
  CHECK(s.hold.total == 9s);
  CHECK(s.hold.max == 2s);
}

TEST_CASE("a shared_semaphore's stats follow a new virtual loop after the last one died",
          "[stats]") {
  sluice::shared_semaphore sem{1};
  three_batches_on_their_own_virtual_loops(sem);
}

TEST_CASE("a semaphore's stats follow a new virtual loop at the address of a dead one", "[stats]") {
  sluice::semaphore sem{1};
  three_batches_on_their_own_virtual_loops(sem);
}

TEST_CASE("a shared_semaphore counts permits released on other threads", "[stats]") {
  sluice::shared_semaphore sem{4};
  asio::thread_pool pool{2};
  constexpr int per_thread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      asio::io_context ctx;
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            for (int i = 0; i < per_thread; ++i) {
              auto p = co_await sem.scoped_acquire();
              co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
            }
          },
          asio::detached);
      ctx.run();
    });
  }
  for (auto& t : threads) t.join();
  const auto s = sem.stats();
  CHECK(s.acquired == 2 * per_thread);
  // On the steady clock one permit in 16 per thread is timed: 0, 16, ..., 496.
  CHECK(s.hold.count == 2 * ((per_thread + 15) / 16));
  CHECK(s.wait.count == 2 * per_thread);
  CHECK(s.in_use == 0);
  CHECK(s.waiting == 0);
}

TEST_CASE("a keyed_semaphore counts every key together, and one key on request", "[stats]") {
  virtual_loop loop;
  sluice::keyed_semaphore<std::string> per_account{1};
  auto hold_key = [](sluice::keyed_semaphore<std::string>& sem, std::string key,
                     nanoseconds hold) -> asio::awaitable<void> {
    auto permit = co_await sem.scoped_acquire(key);
    co_await sluice::sleep(hold);
  };
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    tasks.push_back(hold_key(per_account, "a", 1s));
    tasks.push_back(hold_key(per_account, "a", 2s));  // waits 1 s for the first "a"
    tasks.push_back(hold_key(per_account, "b", 1s));
    tasks.push_back([](sluice::keyed_semaphore<std::string>& sem) -> asio::awaitable<void> {
      co_await sluice::sleep(500ms);
      const auto all = sem.stats();
      CHECK(all.acquired == 2);
      CHECK(all.waiting == 1);
      CHECK(all.in_use == 2);
      CHECK(all.limit == 1);
      const auto a = sem.stats("a");
      CHECK(a.waiting == 1);
      CHECK(a.in_use == 1);
      CHECK(a.limit == 1);
      CHECK(sem.stats("c").in_use == 0);
      CHECK_FALSE(sem.try_acquire("b").has_value());
    }(per_account));
    co_await sluice::gather(std::move(tasks));
  }());
  CHECK(loop.now() == 3s);
  const auto s = per_account.stats();
  CHECK(s.acquired == 3);
  CHECK(s.waiting == 0);
  CHECK(s.in_use == 0);
  CHECK(s.wait.count == 3);
  CHECK(s.wait.total == 1s);
  CHECK(s.hold.count == 3);
  CHECK(s.hold.total == 4s);
  CHECK(s.hold.max == 2s);
  CHECK(per_account.keys() == 0);
}

TEST_CASE("a rate_limiter counts the requests it delayed and their waits", "[stats]") {
  virtual_loop loop;
  sluice::rate_limiter rl{loop.get_executor(), 3, 1s};
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    for (int i = 0; i < 5; ++i) tasks.push_back(rl.acquire());
    tasks.push_back([](sluice::rate_limiter& rl) -> asio::awaitable<void> {
      co_await sluice::sleep(500ms);
      const auto mid = rl.stats();
      CHECK(mid.acquired == 3);
      CHECK(mid.throttled == 2);
      CHECK(mid.waiting == 2);
      CHECK(mid.in_use == 3);
      CHECK(mid.limit == 3);
    }(rl));
    co_await sluice::gather(std::move(tasks));
    CHECK_FALSE(rl.try_acquire(2));  // 2 of 3 in the window since 1 s
  }());
  CHECK(loop.now() == 1s);
  const auto s = rl.stats();
  CHECK(s.acquired == 5);
  CHECK(s.throttled == 3);
  CHECK(s.waiting == 0);
  CHECK(s.in_use == 2);  // the starts at 0 s left the window (t - 1 s, t] at 1 s
  CHECK(s.wait.count == 5);
  CHECK(s.wait.total == 2s);
  CHECK(s.wait.p50 == 0s);
  CHECK(s.wait.p99 == 1s);
  CHECK(s.hold.count == 0);
}

TEST_CASE("a rate_limiter counts a cancelled wait", "[stats]") {
  virtual_loop loop;
  sluice::rate_limiter rl{loop.get_executor(), 1, 10s};
  loop.run([&]() -> asio::awaitable<void> {
    co_await rl.acquire();
    CHECK_THROWS_AS(co_await sluice::with_timeout(1s, rl.acquire()), sluice::timeout_error);
  }());
  const auto s = rl.stats();
  CHECK(s.acquired == 1);
  CHECK(s.cancelled == 1);
  CHECK(s.throttled == 1);
  CHECK(s.waiting == 0);
}

TEST_CASE("a token_bucket reports the tokens taken and not refilled", "[stats]") {
  virtual_loop loop;
  sluice::token_bucket tb{loop.get_executor(), 1.0, 2};
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    for (int i = 0; i < 3; ++i) tasks.push_back(tb.acquire());
    co_await sluice::gather(std::move(tasks));
  }());
  CHECK(loop.now() == 1s);
  const auto s = tb.stats();
  CHECK(s.acquired == 3);
  CHECK(s.throttled == 1);
  CHECK(s.wait.total == 1s);
  CHECK(s.in_use == 2);  // the bucket refills at 1/s: empty until 2 s
  CHECK(s.limit == 2);
}

TEST_CASE("a keyed_rate_limiter counts every key together, and one key on request", "[stats]") {
  virtual_loop loop;
  sluice::keyed_rate_limiter<std::string> per_customer{loop.get_executor(), 1, 1s};
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> tasks;
    tasks.push_back(per_customer.acquire("a"));
    tasks.push_back(per_customer.acquire("a"));  // waits 1 s
    tasks.push_back(per_customer.acquire("b"));
    tasks.push_back([](sluice::keyed_rate_limiter<std::string>& rl) -> asio::awaitable<void> {
      co_await sluice::sleep(500ms);
      const auto all = rl.stats();
      CHECK(all.acquired == 2);
      CHECK(all.waiting == 1);
      CHECK(all.in_use == 2);
      CHECK(all.limit == 1);
      const auto a = rl.stats("a");
      CHECK(a.waiting == 1);
      CHECK(a.in_use == 1);
      CHECK_FALSE(rl.try_acquire("b"));
    }(per_customer));
    co_await sluice::gather(std::move(tasks));
  }());
  const auto s = per_customer.stats();
  CHECK(s.acquired == 3);
  CHECK(s.throttled == 2);
  CHECK(s.wait.total == 1s);
  CHECK(s.wait.max == 1s);
}

TEST_CASE("an adaptive_limit reports its current limit, its throttles and each permit's hold",
          "[stats]") {
  virtual_loop loop;
  sluice::adaptive_limit cap{{.initial = 2, .min = 1, .max = 8, .algorithm = sluice::aimd{}}};
  auto one = [](sluice::adaptive_limit& cap, nanoseconds d,
                bool throttled) -> asio::awaitable<void> {
    auto p = co_await cap.scoped_acquire();
    co_await sluice::sleep(d);
    if (throttled) {
      p.throttled();
    } else {
      p.succeeded();
    }
  };
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> calls;
    calls.push_back(one(cap, 1s, false));
    calls.push_back(one(cap, 2s, true));
    calls.push_back(one(cap, 1s, false));  // waits 1 s for the first
    co_await sluice::gather(std::move(calls));
    {
      auto dropped_unreported = co_await cap.scoped_acquire();
      co_await sluice::sleep(3s);
    }
  }());
  const auto s = cap.stats();
  CHECK(s.acquired == 4);
  CHECK(s.throttled == 1);
  CHECK(s.throttled == cap.throttles());
  CHECK(s.limit == cap.limit());
  CHECK(s.in_use == 0);
  CHECK(s.waiting == 0);
  CHECK(s.wait.count == 4);
  CHECK(s.wait.total == 1s);
  CHECK(s.hold.count == 4);
  CHECK(s.hold.total == 1s + 2s + 1s + 3s);
  CHECK(s.hold.max == 3s);
}

TEST_CASE("a waiter granted then cancelled before it resumed counts as cancelled, not acquired",
          "[stats]") {
  // One meaning: `acquired` counts the grants callers got, `cancelled` the
  // waits that ended in operation_aborted; each wait counts once.
  sluice_test::tasks_on_loop h;
  sluice::semaphore sem{h.loop.get_executor(), 1};
  REQUIRE(sem.try_acquire());
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
  auto& c = h.spawn([&]() -> asio::awaitable<void> { co_await sem.acquire(); });
  h.poll();
  sem.release();  // granted to b...
  b.cancel();     // ...which is cancelled before it resumes: the permit goes on to c
  h.poll();
  CHECK(b.cancelled());
  CHECK(c.succeeded());
  auto s = sem.stats();
  CHECK(s.acquired == 2);  // the first holder and c
  CHECK(s.cancelled == 1);
  CHECK(s.wait.count == s.acquired);
  CHECK(s.in_use == 1);

  // The same on a shared_semaphore (it counted the grant, not the cancellation).
  sluice::shared_semaphore shared{h.loop.get_executor(), 1};
  REQUIRE(shared.try_acquire());
  auto& sb = h.spawn([&]() -> asio::awaitable<void> { co_await shared.acquire(); });
  auto& sc = h.spawn([&]() -> asio::awaitable<void> { co_await shared.acquire(); });
  h.poll();
  shared.release();
  sb.cancel();
  h.poll();
  CHECK(sb.cancelled());
  CHECK(sc.succeeded());
  s = shared.stats();
  CHECK(s.acquired == 2);
  CHECK(s.cancelled == 1);
  CHECK(s.wait.count == s.acquired);

  // The same on a rate limiter: b is granted when the head ahead of it leaves.
  sluice::rate_limiter rl{h.loop.get_executor(), 2, 10s};
  REQUIRE(rl.try_acquire());
  auto& head = h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(2); });
  auto& b2 = h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(); });
  h.poll();
  head.cancel();  // b2 is granted at once...
  b2.cancel();    // ...and cancelled before it resumes: the start is given back
  h.poll();
  CHECK(b2.cancelled());
  s = rl.stats();
  CHECK(s.acquired == 1);
  CHECK(s.cancelled == 2);
  CHECK(s.wait.count == 1);
  CHECK(s.in_use == 1);
}
