// SPDX-License-Identifier: BSL-1.0
#include <sluice/gather.hpp>
#include <sluice/task_group.hpp>
#include <sluice/to_thread.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lifetime.hpp>
#include <support/peak.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

// Blocks the calling (pool) thread until `go` is set.
void wait_for(const std::atomic<bool>& go) {
  while (!go.load()) std::this_thread::sleep_for(1ms);
}

}  // namespace

TEST_CASE("the result comes back from the pool and run() waits for it", "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(2);
  int result = 0;
  std::thread::id fn_thread;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        result = co_await sluice::to_thread(pool.get_executor(), [&] {
          std::this_thread::sleep_for(50ms);  // the loop has nothing else to do meanwhile
          fn_thread = std::this_thread::get_id();
          return 42;
        });
      },
      asio::detached);
  ctx.run();  // returns early if the pending call is not counted as work
  CHECK(result == 42);
  CHECK(fn_thread != std::thread::id{});
  CHECK(fn_thread != std::this_thread::get_id());
  pool.join();
}

TEST_CASE("an exception thrown by fn is rethrown in the caller", "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(1);
  std::string how;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        how = co_await sluice_test::ending_of(sluice::to_thread(
            pool.get_executor(), []() -> int { throw std::runtime_error("parse error"); }));
      },
      asio::detached);
  ctx.run();
  CHECK(how == "parse error");
  pool.join();
}

TEST_CASE("void and move-only results round trip", "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(1);
  bool ran = false;
  int value = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await sluice::to_thread(pool.get_executor(), [&] { ran = true; });
        auto p = co_await sluice::to_thread(pool.get_executor(),
                                            [] { return std::make_unique<int>(7); });
        value = *p;
      },
      asio::detached);
  ctx.run();
  CHECK(ran);
  CHECK(value == 7);
  pool.join();
}

TEST_CASE("the continuation runs on the caller's thread, fn on a pool thread", "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(2);
  std::thread::id loop_thread, fn_thread, before, after;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 20; ++i) {
          before = std::this_thread::get_id();
          fn_thread = co_await sluice::to_thread(pool.get_executor(),
                                                 [] { return std::this_thread::get_id(); });
          after = std::this_thread::get_id();
          if (after != before || fn_thread == after) co_return;
        }
      },
      asio::detached);
  std::thread t([&] {
    loop_thread = std::this_thread::get_id();
    ctx.run();
  });
  t.join();
  CHECK(before == loop_thread);
  CHECK(after == loop_thread);
  CHECK(fn_thread != loop_thread);
  pool.join();
}

TEST_CASE("1000 concurrent calls over a 4-thread pool all complete, at most 4 at a time",
          "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(4);
  std::atomic<int> in_fn{0}, max_in_fn{0};
  long sum = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        std::vector<asio::awaitable<int>> calls;
        for (int i = 0; i < 1000; ++i) {
          calls.push_back(sluice::to_thread(pool.get_executor(), [&, i] {
            sluice_test::raise_peak(max_in_fn, ++in_fn);
            std::this_thread::sleep_for(20us);
            --in_fn;
            return i;
          }));
        }
        auto r = co_await sluice::gather(std::move(calls));
        sum = std::accumulate(r.begin(), r.end(), 0L);
      },
      asio::detached);
  ctx.run();
  CHECK(sum == 999L * 1000 / 2);
  CHECK(max_in_fn.load() <= 4);
  CHECK(max_in_fn.load() >= 1);
  pool.join();
}

TEST_CASE("a cancelled caller does not return before fn has finished", "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(1);
  asio::cancellation_signal cancel;
  std::atomic<bool> fn_started{false}, go{false}, fn_finished{false}, caller_done{false};
  bool finished_when_caller_resumed = false;
  std::string how;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        how = co_await sluice_test::ending_of(sluice::to_thread(pool.get_executor(), [&] {
          fn_started = true;
          wait_for(go);
          fn_finished = true;
        }));
        finished_when_caller_resumed = fn_finished.load();
        caller_done = true;
      },
      sluice_test::bind_slot(cancel.slot(), [](std::exception_ptr) {}));
  std::thread loop([&] { ctx.run(); });
  wait_for(fn_started);
  asio::post(ctx, [&] { cancel.emit(asio::cancellation_type::terminal); });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(caller_done.load());  // still waiting for fn
  go = true;
  loop.join();
  CHECK(caller_done.load());
  CHECK(finished_when_caller_resumed);
  CHECK(how == "aborted");
  pool.join();
}

TEST_CASE("a caller cancelled before the call does not run fn", "[to_thread]") {
  asio::io_context ctx;
  asio::thread_pool pool(1);
  asio::cancellation_signal cancel;
  std::atomic<bool> ran{false};
  std::string how;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await asio::this_coro::throw_if_cancelled(false);
        asio::steady_timer parked(co_await asio::this_coro::executor, std::chrono::hours(1));
        sluice::error_code ec;
        co_await parked.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        how = co_await sluice_test::ending_of(
            sluice::to_thread(pool.get_executor(), [&] { ran = true; }));
      },
      sluice_test::bind_slot(cancel.slot(), [](std::exception_ptr) {}));
  ctx.poll();
  cancel.emit(asio::cancellation_type::terminal);
  ctx.run();
  CHECK(how == "aborted");
  CHECK_FALSE(ran.load());
  pool.join();
}

TEST_CASE("task_group children hand blocking work to a pool and all finish before run returns",
          "[to_thread][task_group]") {
  asio::io_context ctx;
  asio::thread_pool pool(4);
  std::atomic<int> in_fn{0}, max_in_fn{0}, done{0};
  int children_done = 0;
  std::thread::id loop_thread;
  bool all_on_loop = true;
  auto child = [&](int) -> asio::awaitable<void> {
    co_await sluice::to_thread(pool.get_executor(), [&] {
      sluice_test::raise_peak(max_in_fn, ++in_fn);
      std::this_thread::sleep_for(200us);
      --in_fn;
      ++done;
    });
    all_on_loop = all_on_loop && std::this_thread::get_id() == loop_thread;
    ++children_done;
  };
  int done_at_return = -1;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await sluice::task_group::run(3, [&](sluice::task_group& g) -> asio::awaitable<void> {
          for (int i = 0; i < 50; ++i) g.spawn(child(i));
          co_return;
        });
        done_at_return = done.load();
      },
      asio::detached);
  std::thread t([&] {
    loop_thread = std::this_thread::get_id();
    ctx.run();
  });
  t.join();
  CHECK(done_at_return == 50);
  CHECK(children_done == 50);
  CHECK(all_on_loop);
  CHECK(max_in_fn.load() <= 3);
  pool.join();
}

TEST_CASE("the caller's loop destroyed while fn runs frees the caller and posts nothing into it",
          "[to_thread][lifetime]") {
  // ASan: the pool thread posted into the destroyed io_context (use after
  // free); the caller's frame is destroyed with its loop (LSan: no leak).
  using sluice_test::lifetime_counter;
  const int before = lifetime_counter::live();
  asio::thread_pool pool(1);
  std::atomic<bool> fn_started{false}, go{false}, fn_finished{false};
  bool resumed = false;
  {
    asio::io_context ctx;
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          lifetime_counter in_frame;
          co_await sluice::to_thread(pool.get_executor(), [&] {
            fn_started = true;
            wait_for(go);
            fn_finished = true;
            return std::string(100, 'x');  // a result the pool thread must free
          });
          resumed = true;
        },
        asio::detached);
    ctx.run_for(20ms);  // fn is running: the loop gives up waiting
    REQUIRE(fn_started.load());
    CHECK(lifetime_counter::live() == before + 1);
  }                                           // the loop dies while fn still runs
  CHECK(lifetime_counter::live() == before);  // the caller's frame went with its loop
  go = true;
  pool.join();
  CHECK(fn_finished.load());
  CHECK_FALSE(resumed);
}

TEST_CASE("a thread that destroys its loop right after run() races with no to_thread post",
          "[to_thread][lifetime]") {
  // TSan: the pool thread must be done with its post before the loop's
  // thread may destroy the io_context.
  asio::thread_pool pool(2);
  int sevens = 0;
  for (int round = 0; round < 200; ++round) {
    std::thread owner([&] {
      asio::io_context ctx;
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            sevens += co_await sluice::to_thread(pool.get_executor(), [] { return 7; }) == 7;
          },
          asio::detached);
      ctx.run();
    });
    owner.join();
  }
  pool.join();
  CHECK(sevens == 200);
}
