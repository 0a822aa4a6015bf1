// SPDX-License-Identifier: BSL-1.0
// sluice::rate_limiter: DESIGN.md "Beyond asyncio", semantics 3. Every timing
// is exact, in virtual time.
#include <sluice/rate_limiter.hpp>

#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/death.hpp>
#include <support/fresh_loop.hpp>
#include <support/spawned.hpp>
#include <support/virtual_timers.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <future>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice_test::pending_timers;
using sluice_test::tasks_on_loop;
namespace latency = sluice::testing::latency;

namespace {

// The most starts in any half-open window (t - per, t]; the maximum is reached
// by a window that ends at a start.
std::size_t max_in_any_window(std::vector<std::chrono::nanoseconds> starts,
                              std::chrono::nanoseconds per) {
  std::sort(starts.begin(), starts.end());
  std::size_t most = 0;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    std::size_t j = i;
    while (j > 0 && starts[j - 1] > starts[i] - per) --j;
    most = std::max(most, i - j + 1);
  }
  return most;
}

std::vector<std::chrono::nanoseconds> starts_of(const slow_service& svc) {
  std::vector<std::chrono::nanoseconds> s;
  for (const auto& r : svc.timeline())
    if (r.result != sluice::testing::call_result::throttled) s.push_back(r.start);
  return s;
}

}  // namespace

TEST_CASE("rate_limiter 60 per minute before 200 calls: zero throttles, last start at 180 s",
          "[rate_limiter]") {
  slow_service svc(
      {.latency = latency::uniform(1s, 5s, 7), .quota = {.calls_per_window = 60, .window = 1min}});
  sluice::rate_limiter rpm{60, 1min};
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> calls;
    for (int i = 0; i < 200; ++i) {
      calls.push_back([](sluice::rate_limiter& rl, slow_service& s) -> asio::awaitable<void> {
        co_await rl.acquire();
        co_await s.call();
      }(rpm, svc));
    }
    co_await sluice::gather(std::move(calls));
  });
  CHECK(svc.throttles() == 0);
  CHECK(svc.calls() == 200);
  auto starts = starts_of(svc);
  REQUIRE(starts.size() == 200);
  std::sort(starts.begin(), starts.end());
  CHECK(starts.back() == 180s);
  // Not slower than needed: each minute's 60 go the instant the previous
  // minute's expire.
  for (std::size_t i = 0; i < 200; ++i) CHECK(starts[i] == std::chrono::minutes(i / 60));
  CHECK(max_in_any_window(starts, 1min) == 60);
  CHECK(rpm.waiters() == 0);
  CHECK(pending_timers(loop) == 0);
}

TEST_CASE("the k-th acquisition over the quota goes exactly when the oldest start expires",
          "[rate_limiter]") {
  virtual_loop loop;
  sluice::rate_limiter rl{3, 10s};
  std::vector<std::chrono::nanoseconds> granted;
  loop.run([&]() -> asio::awaitable<void> {
    // Starts at 0, 2 and 4 s fill the window; then seven more back to back.
    for (auto at : {0s, 2s, 4s}) {
      co_await sluice::sleep_until(sluice::clock::time_point(at));
      co_await rl.acquire();
      granted.push_back(loop.now());
    }
    for (int i = 0; i < 7; ++i) {
      co_await rl.acquire();
      granted.push_back(loop.now());
    }
  });
  CHECK(granted ==
        std::vector<std::chrono::nanoseconds>{0s, 2s, 4s, 10s, 12s, 14s, 20s, 22s, 24s, 30s});
  CHECK(max_in_any_window(granted, 10s) == 3);
}

TEST_CASE("starts exactly one window ago have left it: try_acquire succeeds at that instant",
          "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter rps{h.loop.get_executor(), 2, 1s};
  CHECK(rps.try_acquire());
  CHECK(rps.try_acquire());
  h.loop.run_for(1s - 1ns);
  CHECK_FALSE(rps.try_acquire());
  h.loop.run_for(1ns);  // (now - per, now] no longer holds the starts at 0
  CHECK(rps.try_acquire());
  CHECK(rps.try_acquire());
  CHECK_FALSE(rps.try_acquire());
}

TEST_CASE("no window of any alignment sees more than calls starts under uneven load",
          "[rate_limiter]") {
  // Arrivals at irregular times, n of 1..3 each: every start (n starts per
  // grant) is recorded and checked against every window.
  virtual_loop loop;
  sluice::rate_limiter rl{7, 3s};
  std::vector<std::chrono::nanoseconds> starts;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> callers;
    for (int i = 0; i < 60; ++i) {
      callers.push_back([](int i, sluice::rate_limiter& rl, virtual_loop& loop,
                           std::vector<std::chrono::nanoseconds>& out) -> asio::awaitable<void> {
        co_await sluice::sleep(std::chrono::milliseconds((i * 7919) % 20000));
        const std::size_t n = 1 + static_cast<std::size_t>(i % 3);
        co_await rl.acquire(n);
        for (std::size_t k = 0; k < n; ++k) out.push_back(loop.now());
      }(i, rl, loop, starts));
    }
    co_await sluice::gather(std::move(callers));
  });
  REQUIRE(starts.size() == 120);
  CHECK(max_in_any_window(starts, 3s) == 7);
}

TEST_CASE(
    "waiters are served FIFO with mixed n: a large head is not starved, small ones do not "
    "barge",
    "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter rl{h.loop.get_executor(), 5, 10s};
  std::vector<std::string> order;
  std::vector<std::chrono::nanoseconds> at;
  REQUIRE(rl.try_acquire(3));  // 3 of 5 used at t = 0
  auto waiter = [&](std::string name, std::size_t n) -> sluice_test::task& {
    return h.spawn([&, name, n]() -> asio::awaitable<void> {
      co_await rl.acquire(n);
      order.push_back(name);
      at.push_back(h.loop.now());
    });
  };
  waiter("big", 4);    // needs the 3 to expire: 10 s
  waiter("small", 1);  // would fit now, but waits behind big
  h.poll();
  CHECK(rl.waiters() == 2);
  CHECK_FALSE(rl.try_acquire(1));  // no barging past waiters either
  h.loop.run_for(9s);
  CHECK(order.empty());
  waiter("late", 2);  // behind small: 4 + 1 fill the window at 10 s, so 20 s
  h.loop.run_for(11s);
  CHECK(order == std::vector<std::string>{"big", "small", "late"});
  CHECK(at == std::vector<std::chrono::nanoseconds>{10s, 10s, 20s});
  CHECK(rl.waiters() == 0);
  CHECK(pending_timers(h.loop) == 0);
}

TEST_CASE("cancelling the head waiter lets the next one in at the right instant",
          "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter rl{h.loop.get_executor(), 5, 10s};
  REQUIRE(rl.try_acquire(4));
  auto& big = h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(3); });  // at 10 s
  std::chrono::nanoseconds small_at{-1};
  auto& small = h.spawn([&]() -> asio::awaitable<void> {
    co_await rl.acquire(1);  // fits now, but waits behind big
    small_at = h.loop.now();
  });
  h.loop.run_for(2s);
  CHECK(rl.waiters() == 2);
  big.cancel();
  h.poll();
  CHECK(big.cancelled());
  CHECK(small.succeeded());
  CHECK(small_at == 2s);
  CHECK(rl.waiters() == 0);
  CHECK(pending_timers(h.loop) == 0);
  // big took nothing: 4 at 0 s and 1 at 2 s are in the window; at 10 s the 4 leave.
  CHECK_FALSE(rl.try_acquire(1));
  h.loop.run_for(8s);
  CHECK(rl.try_acquire(4));
  CHECK_FALSE(rl.try_acquire(1));
}

TEST_CASE("cancelling the head re-arms the timer for the next waiter's instant", "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter rl{h.loop.get_executor(), 5, 10s};
  REQUIRE(rl.try_acquire(2));  // at 0 s
  h.loop.run_for(3s);
  REQUIRE(rl.try_acquire(2));                                                       // at 3 s
  auto& big = h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(5); });  // at 13 s
  std::chrono::nanoseconds next_at{-1};
  h.spawn([&]() -> asio::awaitable<void> {
    co_await rl.acquire(2);  // alone it would go at 10 s
    next_at = h.loop.now();
  });
  h.loop.run_for(1s);
  big.cancel();
  h.loop.run_for(20s);
  CHECK(big.cancelled());
  CHECK(next_at == 10s);
}

TEST_CASE("a caller cancelled before it called takes nothing", "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter rl{h.loop.get_executor(), 2, 10s};
  bool reached = false;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1s);
    } catch (const sluice::system_error&) {
    }
    reached = true;
    co_await rl.acquire(2);
  });
  h.poll();
  t.cancel();
  h.poll();
  CHECK(reached);
  CHECK(t.cancelled());
  CHECK(rl.try_acquire(2));  // nothing was taken
}

TEST_CASE("a waiter granted then cancelled before it resumes gives its grant back",
          "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter rl{h.loop.get_executor(), 2, 10s};
  REQUIRE(rl.try_acquire(1));
  auto& head = h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(2); });
  auto& next = h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(1); });
  h.poll();
  REQUIRE(rl.waiters() == 2);
  head.cancel();  // next is granted at once (its completion is posted)...
  CHECK(rl.waiters() == 0);
  next.cancel();  // ...and cancelled before it resumes
  h.poll();
  CHECK(head.cancelled());
  CHECK(next.cancelled());
  CHECK(rl.try_acquire(1));  // next's grant came back
  CHECK_FALSE(rl.try_acquire(1));
}

TEST_CASE("async_acquire takes any completion token and completes through a post",
          "[rate_limiter]") {
  virtual_loop loop;
  sluice::rate_limiter rl{loop.get_executor(), 1, 5s};
  std::vector<std::chrono::nanoseconds> done;
  sluice::error_code last = asio::error::would_block;
  for (int i = 0; i < 3; ++i) {
    rl.async_acquire(1, [&](sluice::error_code ec) {
      last = ec;
      done.push_back(loop.now());
    });
  }
  CHECK(done.empty());  // not inline, not even the free one
  loop.run_for(20s);
  CHECK_FALSE(last);
  CHECK(done == std::vector<std::chrono::nanoseconds>{0s, 5s, 10s});
}

TEST_CASE("a callback waiter cancelled through its slot is aborted and takes nothing",
          "[rate_limiter]") {
  virtual_loop loop;
  sluice::rate_limiter rl{loop.get_executor(), 1, 5s};
  REQUIRE(rl.try_acquire());
  asio::cancellation_signal sig;
  sluice::error_code result;
  rl.async_acquire(
      1, asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code ec) { result = ec; }));
  loop.run_for(1s);
  sig.emit(asio::cancellation_type::terminal);
  loop.poll();
  CHECK(result == asio::error::operation_aborted);
  CHECK(rl.waiters() == 0);
  CHECK(pending_timers(loop) == 0);
  loop.run_for(4s);
  CHECK(rl.try_acquire());
}

TEST_CASE("bad input is rejected at once with invalid_argument", "[rate_limiter]") {
  CHECK_THROWS_AS(sluice::rate_limiter(0, 1s), std::invalid_argument);
  CHECK_THROWS_AS(sluice::rate_limiter(1, 0s), std::invalid_argument);
  CHECK_THROWS_AS(sluice::rate_limiter(1, -1s), std::invalid_argument);
  virtual_loop loop;
  sluice::rate_limiter rl{loop.get_executor(), 60, 1min};
  CHECK_THROWS_AS((void)rl.acquire(61), std::invalid_argument);  // at the call, not a hang
  CHECK_THROWS_AS((void)rl.acquire(0), std::invalid_argument);
  CHECK_THROWS_AS((void)rl.try_acquire(61), std::invalid_argument);
  CHECK_THROWS_AS(rl.async_acquire(61, [](sluice::error_code) {}), std::invalid_argument);
  CHECK(rl.waiters() == 0);
  CHECK(rl.try_acquire(60));  // nothing was lost
  sluice::rate_limiter no_ex{1, 1s};
  CHECK_THROWS_AS(no_ex.async_acquire(1, [](sluice::error_code) {}), std::invalid_argument);
}

TEST_CASE("destroying a rate_limiter with waiters aborts them and leaves no timer",
          "[rate_limiter]") {
  tasks_on_loop h;
  std::vector<sluice_test::task*> t;
  {
    sluice::rate_limiter rl{h.loop.get_executor(), 1, 1h};
    REQUIRE(rl.try_acquire());
    for (int i = 0; i < 3; ++i)
      t.push_back(&h.spawn([&]() -> asio::awaitable<void> { co_await rl.acquire(); }));
    h.poll();
    CHECK(rl.waiters() == 3);
    CHECK(pending_timers(h.loop) == 1);  // one timer for the limiter, not one per waiter
  }
  CHECK(pending_timers(h.loop) == 0);
  h.poll();
  for (auto* x : t) CHECK(x->cancelled());
}

TEST_CASE("a rate_limiter without an executor takes its clock from the first waiter",
          "[rate_limiter]") {
  virtual_loop loop;
  sluice::rate_limiter rl{1, 30s};
  loop.run([&]() -> asio::awaitable<void> {
    co_await rl.acquire();
    co_await rl.acquire();
  });
  CHECK(loop.now() == 30s);
}

TEST_CASE("waiters on a strand are granted on time and resume on the strand", "[rate_limiter]") {
  // Also guards against g++ 12 destroying co_await temporaries twice, which
  // over-releases a strand's shared state.
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  sluice::rate_limiter rl{strand, 2, 10s};
  int on_strand = 0;
  std::vector<std::chrono::nanoseconds> at;
  for (int i = 0; i < 5; ++i) {
    asio::co_spawn(
        strand,
        [&]() -> asio::awaitable<void> {
          co_await rl.acquire();
          on_strand += strand.running_in_this_thread() ? 1 : 0;
          at.push_back(loop.now());
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  loop.run_for(30s);
  CHECK(on_strand == 5);
  CHECK(at == std::vector<std::chrono::nanoseconds>{0s, 0s, 10s, 10s, 20s});
}

TEST_CASE("a rate_limiter waits on the steady clock on an ordinary io_context", "[rate_limiter]") {
  asio::io_context ctx;
  sluice::rate_limiter rl{1, 20ms};
  bool done = false;
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration waited{};
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await rl.acquire();
        co_await rl.acquire();
        waited = std::chrono::steady_clock::now() - t0;
      },
      [&](std::exception_ptr e) { done = !e; });
  ctx.run();
  CHECK(done);
  CHECK(waited >= 20ms);  // a lower bound only: it cannot be early, it may be late
}

namespace {

// Two acquire()s of `rl` on a fresh io_context (steady clock): the second
// waits on a timer of that context.
bool two_acquires_on_a_fresh_loop(sluice::rate_limiter& rl) {
  return sluice_test::run_on_fresh_loop([&]() -> asio::awaitable<void> {
    co_await rl.acquire();
    co_await rl.acquire();
  });
}

}  // namespace

TEST_CASE("a rate_limiter serves one io_context after another", "[rate_limiter][lifetime]") {
  // A global limiter, loops made per batch: the timer of the first loop must
  // not be used on the second one (ASan: heap-use-after-free before the fix).
  sluice::rate_limiter rpm{1, 20ms};
  CHECK(two_acquires_on_a_fresh_loop(rpm));
  CHECK(two_acquires_on_a_fresh_loop(rpm));
  CHECK(rpm.waiters() == 0);
}

TEST_CASE("a rate_limiter bound to a virtual loop refuses the next one, even at its address",
          "[rate_limiter][lifetime]") {
  // Its recorded starts are on the first loop's clock: a second virtual loop
  // is a logic_error, never a read of the dead loop's clock (ASan:
  // heap-use-after-free before the fix, the second loop at the same address).
  sluice::rate_limiter rl{1, 30s};
  for (int batch = 0; batch < 2; ++batch) {
    virtual_loop loop;
    auto twice = [&]() -> asio::awaitable<void> {
      co_await rl.acquire();
      co_await rl.acquire();
    };
    if (batch == 0) {
      loop.run(twice);
      CHECK(loop.now() == 30s);
    } else {
      CHECK_THROWS_AS(loop.run(twice), std::logic_error);
    }
  }
  CHECK(rl.waiters() == 0);
}

TEST_CASE("a rate_limiter declared before its io_context is destroyed after it cleanly",
          "[rate_limiter][lifetime]") {
  sluice::rate_limiter rl{1, 20ms};
  CHECK(two_acquires_on_a_fresh_loop(rl));
  // The loop died first, then rl: nothing of the loop may be left in rl
  // (ASan: its destructor used the dead loop's timer before the fix).
}

TEST_CASE("a rate_limiter of one call per nanoseconds::max() admits one call, ever",
          "[rate_limiter]") {
  tasks_on_loop h;
  sluice::rate_limiter once{h.loop.get_executor(), 1, std::chrono::nanoseconds::max()};
  h.loop.run_for(1s);  // t > 0: the start's window end would wrap
  CHECK(once.try_acquire());
  h.loop.run_for(1h);
  CHECK_FALSE(once.try_acquire());
  auto& t = h.spawn([&]() -> asio::awaitable<void> { co_await once.acquire(); });
  h.loop.run_for(24h);
  CHECK_FALSE(t.done);
  CHECK(once.waiters() == 1);
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
}

TEST_CASE("a rate_limiter of SIZE_MAX calls never wraps its count", "[rate_limiter]") {
  tasks_on_loop h;
  const std::size_t most = std::numeric_limits<std::size_t>::max();
  sluice::rate_limiter rl{h.loop.get_executor(), most, 1s};
  CHECK(rl.try_acquire(most));
  CHECK_FALSE(rl.try_acquire(1));
  CHECK_FALSE(rl.try_acquire(most));
  h.loop.run_for(1s);
  CHECK(rl.try_acquire(1));
  CHECK_FALSE(rl.try_acquire(most));
}

#if SLUICE_AFFINITY_CHECKS
#if SLUICE_TEST_CAN_FORK
TEST_CASE("a rate_limiter used from a thread that is not running its loop aborts naming it",
          "[rate_limiter][affinity]") {
  auto r = sluice_test::run_in_child([] {
    asio::io_context ctx;
    sluice::rate_limiter rl{ctx.get_executor(), 5, 1s};
    auto busy = asio::make_work_guard(ctx);  // the loop keeps running on t
    std::promise<void> used;
    asio::post(ctx, [&] {
      (void)rl.try_acquire();
      used.set_value();
    });
    std::thread t([&] { ctx.run(); });
    used.get_future().wait();
    (void)rl.try_acquire();  // main thread, while the loop runs on t
    busy.reset();
    t.join();
  });
  CHECK(r.aborted);
  CHECK(r.stderr_text.find("sluice::rate_limiter") != std::string::npos);
}
#endif
#endif

TEST_CASE("in real time a start counts for per + margin, and from its call's end once restamped",
          "[rate_limiter]") {
  sluice::detail::sliding_window w(1, 10s, "w");
  const sluice::clock::time_point t0{};
  w.take(1, t0);
  CHECK(w.ready_at(1, t0) == t0 + 10s);  // a virtual clock: exact (rate_core restamps only on
                                         // the steady clock: acquire_all_test's schedules)
  w.real_time(true);                     // the steady clock
  CHECK(w.margin() == 100ms);
  CHECK(w.ready_at(1, t0) == t0 + 10s + 100ms);
  w.restamp(1, t0, t0 + 3s);  // the call completed at 3 s: counts from then
  CHECK(w.ready_at(1, t0 + 3s) == t0 + 13s + 100ms);
  w.set_margin(0s, "w");
  CHECK(w.ready_at(1, t0 + 3s) == t0 + 13s);
  w.restamp(1, t0, t0 + 4s);  // nothing recorded at 0 s any more: no change
  CHECK(w.ready_at(1, t0 + 4s) == t0 + 13s);
  CHECK_THROWS_AS(w.set_margin(-1ns, "w"), std::invalid_argument);

  sluice::rate_limiter rpm{60, 1min};
  CHECK(rpm.margin() == 600ms);
  rpm.set_margin(2s);
  CHECK(rpm.margin() == 2s);
  CHECK_THROWS_AS(rpm.set_margin(-1s), std::invalid_argument);
}

TEST_CASE("when the head waiter leaves, the timer moves to the next head's loop and wakes it",
          "[rate_limiter]") {
  // On the steady clock the timer is a steady_timer on the head waiter's
  // io_context. Here the head waits on loop a and leaves (cancelled); the next
  // head waits on loop b, the only loop run from then on: the timer must have
  // moved to b (a timer left on a would never fire for it). Real time: counts
  // only, bounded by 5 s.
  sluice::rate_limiter rl{1, 20ms};
  REQUIRE(rl.try_acquire());
  asio::io_context a, b;
  asio::cancellation_signal cancel_a;
  bool a_done = false, b_granted = false;
  asio::co_spawn(
      a, [&]() -> asio::awaitable<void> { co_await rl.acquire(); },
      sluice_test::bind_slot(cancel_a.slot(), [&](std::exception_ptr) { a_done = true; }));
  a.poll();
  asio::co_spawn(
      b,
      [&]() -> asio::awaitable<void> {
        co_await rl.acquire();
        b_granted = true;
      },
      asio::detached);
  b.poll();
  REQUIRE(rl.waiters() == 2);
  cancel_a.emit(asio::cancellation_type::terminal);  // b's waiter is the head now
  a.poll();
  CHECK(a_done);
  REQUIRE(rl.waiters() == 1);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!b_granted && std::chrono::steady_clock::now() < deadline) b.run_one_for(10ms);
  CHECK(b_granted);
  CHECK(rl.waiters() == 0);
  CHECK(rl.stats().acquired == 2);
}
