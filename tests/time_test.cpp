// SPDX-License-Identifier: BSL-1.0
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>
#include <support/lifetime.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <system_error>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;

TEST_CASE("sleep advances virtual time exactly and instantly", "[time]") {
  virtual_loop loop;
  const auto wall0 = std::chrono::steady_clock::now();
  loop.run([]() -> asio::awaitable<void> {
    co_await sluice::sleep(3h);
    co_await sluice::sleep(250ms);
  });
  CHECK(loop.now() == 3h + 250ms);
  // Three simulated hours must not take one real minute; this only guards
  // against the loop waiting in real time, it asserts no duration.
  CHECK(std::chrono::steady_clock::now() - wall0 < 1min);
}

TEST_CASE("now() of an executor is virtual under the virtual loop", "[time]") {
  virtual_loop loop;
  auto t = loop.run([]() -> asio::awaitable<sluice::clock::time_point> {
    co_await sluice::sleep(42s);
    co_return sluice::now(co_await asio::this_coro::executor);
  });
  CHECK(t.time_since_epoch() == 42s);
}

TEST_CASE("timers with the same deadline fire in the order they were set", "[time]") {
  virtual_loop loop;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) {
    asio::co_spawn(
        loop.get_executor(),
        [&order, i]() -> asio::awaitable<void> {
          co_await sluice::sleep(1s);
          order.push_back(i);
        },
        [](std::exception_ptr) {});
  }
  loop.run_for(1s);
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("cancelling a sleep ends it at once with operation_aborted", "[time]") {
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::exception_ptr error;
  bool done = false;
  asio::co_spawn(loop.get_executor(), sluice::sleep(10s),
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
                   error = e;
                   done = true;
                 }));
  loop.run_for(2s);
  REQUIRE_FALSE(done);
  cancel.emit(asio::cancellation_type::terminal);
  cancel.emit(asio::cancellation_type::terminal);  // a second request is harmless
  loop.poll();
  REQUIRE(done);
  CHECK(loop.now() == 2s);
  try {
    std::rethrow_exception(error);
  } catch (const sluice::system_error& e) {
    CHECK(e.code() == asio::error::operation_aborted);
  }
}

TEST_CASE("a blocked main coroutine is reported as a deadlock instead of hanging", "[time]") {
  virtual_loop loop;
  asio::steady_timer never(loop.get_executor());  // real-time timer: invisible to virtual time
  never.expires_at(asio::steady_timer::time_point::max());
  CHECK_THROWS_AS(
      loop.run([&]() -> asio::awaitable<void> { co_await never.async_wait(asio::use_awaitable); }),
      sluice::testing::deadlock_error);
  never.cancel();
}

TEST_CASE("the same program gives the same timeline on every run", "[time]") {
  auto trace = [] {
    virtual_loop loop;
    std::vector<std::chrono::nanoseconds> t;
    for (int i = 0; i < 4; ++i) {
      asio::co_spawn(
          loop.get_executor(),
          [&, i]() -> asio::awaitable<void> {
            for (int k = 0; k < 3; ++k) {
              co_await sluice::sleep(std::chrono::milliseconds(10 * (i + 1) + k));
              t.push_back(loop.now());
            }
          },
          [](std::exception_ptr) {});
    }
    loop.run_for(1s);
    return t;
  };
  auto a = trace();
  CHECK(a.size() == 12);
  CHECK(a == trace());
}

TEST_CASE("sleep waits on the steady clock on an ordinary io_context", "[time]") {
  asio::io_context ctx;
  bool done = false;
  asio::co_spawn(ctx, sluice::sleep(1ms), [&](std::exception_ptr e) { done = !e; });
  ctx.run();
  CHECK(done);
}

TEST_CASE("sleep(duration::max()) saturates instead of returning at once", "[time]") {
  virtual_loop loop;
  bool woke = false;
  loop.run_for(1s);  // now > 0: now + max would wrap
  asio::co_spawn(
      loop.get_executor(),
      [&]() -> asio::awaitable<void> {
        co_await sluice::sleep(sluice::clock::duration::max());
        woke = true;
      },
      [](std::exception_ptr) {});
  loop.run_for(24h);
  CHECK_FALSE(woke);

  asio::io_context ctx;  // the steady clock: now is far from its epoch
  bool steady_woke = false;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await sluice::sleep(sluice::clock::duration::max());
        steady_woke = true;
      },
      [](std::exception_ptr) {});
  ctx.run_for(20ms);
  CHECK_FALSE(steady_woke);
}

TEST_CASE("sleep works on a strand, a reference-counted executor", "[time]") {
  // Guards against g++ 12 destroying co_await temporaries twice, which
  // over-releases a strand's shared state.
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  int woke = 0;
  for (int i = 0; i < 3; ++i) {
    asio::co_spawn(
        strand,
        [&]() -> asio::awaitable<void> {
          co_await sluice::sleep(1s);
          woke += strand.running_in_this_thread() ? 1 : 0;
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  loop.run_for(2s);
  CHECK(woke == 3);
}

TEST_CASE("a sleep cancelled after the loop returned is freed with the loop", "[time]") {
  using sluice_test::lifetime_counter;
  const int before = lifetime_counter::live();
  asio::cancellation_signal cancel;  // outlives the loop: the frame's slot points into it
  bool completed = false;
  {
    virtual_loop loop;
    asio::co_spawn(
        loop.get_executor(),
        []() -> asio::awaitable<void> {
          lifetime_counter in_frame;
          co_await sluice::sleep(10s);
        },
        sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr) { completed = true; }));
    loop.run([]() -> asio::awaitable<void> { co_await sluice::sleep(1s); });
    REQUIRE(lifetime_counter::live() == before + 1);  // still sleeping
    cancel.emit(asio::cancellation_type::terminal);   // its completion is posted, never run
    CHECK(lifetime_counter::live() == before + 1);
  }
  CHECK(lifetime_counter::live() == before);  // the frame died with the loop (LSan: no leak)
  CHECK_FALSE(completed);
}

TEST_CASE("a co-spawned sleep ends on partial cancellation only when the filter lets it through",
          "[time]") {
  const bool widened = GENERATE(false, true);
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::exception_ptr error;
  bool done = false;
  asio::co_spawn(
      loop.get_executor(),
      [widened]() -> asio::awaitable<void> {
        if (widened) {
          co_await asio::this_coro::reset_cancellation_state(asio::enable_partial_cancellation());
        }
        co_await sluice::sleep(10s);
      },
      sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e) {
        error = e;
        done = true;
      }));
  loop.run_for(2s);
  REQUIRE_FALSE(done);
  cancel.emit(asio::cancellation_type::partial);
  loop.poll();
  if (widened) {
    REQUIRE(done);  // ended at once, at t = 2 s
    CHECK(loop.now() == 2s);
    CHECK_THROWS_AS(std::rethrow_exception(error), sluice::system_error);
  } else {
    CHECK_FALSE(done);  // Asio's default filter drops partial cancellation
    loop.run_for(8s);
    REQUIRE(done);
    CHECK_FALSE(error);
    CHECK(loop.now() == 10s);
  }
}

TEST_CASE("a sleep of the clock's range never fires in virtual time: the loop reports the deadlock",
          "[time]") {
  virtual_loop loop;
  loop.run_for(1s);  // now > 0: now + max would wrap
  CHECK_THROWS_AS(loop.run(sluice::sleep(sluice::clock::duration::max())),
                  sluice::testing::deadlock_error);
  CHECK_THROWS_AS(loop.run(sluice::sleep_until(sluice::clock::time_point::max())),
                  sluice::testing::deadlock_error);
  CHECK(loop.now() == 1s);  // the clock did not jump to the end of time
}

TEST_CASE("sleep takes any duration and saturates it instead of overflowing", "[time]") {
  virtual_loop loop;
  // hours::max() in nanoseconds overflows: before sluice saw it, it was negative.
  CHECK_THROWS_AS(loop.run(sluice::sleep(std::chrono::hours::max())),
                  sluice::testing::deadlock_error);
  CHECK_THROWS_AS(loop.run(sluice::sleep(std::chrono::duration<double>(1e300))),
                  sluice::testing::deadlock_error);
  CHECK(loop.now() == 0s);
  loop.run(sluice::sleep(std::chrono::duration<double, std::milli>(2.5)));
  loop.run(sluice::sleep(std::chrono::duration<int, std::ratio<3600>>(1)));
  CHECK(loop.now() == 1h + 2500us);
  loop.run_for(std::chrono::nanoseconds::max());  // saturates too
  CHECK(loop.now() == std::chrono::nanoseconds::max());
}
