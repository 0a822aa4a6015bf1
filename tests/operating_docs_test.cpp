// SPDX-License-Identifier: BSL-1.0
// The snippets of docs/operating.md and docs/fanout.md about progress reports,
// graceful shutdown and the filter stage, compiled and run. Each snippet sits
// verbatim between `// clang-format off` and `// clang-format on` (the page
// and this file stay identical line for line; ctest's docs_check compares them).
#include <sluice/filter.hpp>
#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/progress.hpp>
#include <sluice/queue.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

// asio::signal_set, as docs/operating.md's shutdown snippet includes it:
#include <sluice/asio.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <signal.h>
#include <unistd.h>

using namespace std::chrono_literals;

namespace {

asio::awaitable<int> call_api(int i) {
  co_await sluice::sleep(3s);
  co_return i;
}

struct job {
  int id;
};

}  // namespace

// ---- docs/operating.md: progress ------------------------------------------

TEST_CASE("operating.md: a progress report every 10 s of a 300-call batch", "[docs]") {
  sluice::testing::virtual_loop loop;
  std::vector<std::size_t> seen;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> calls;
    for (int i = 0; i < 300; ++i) calls.push_back(call_api(i));
    // clang-format off
auto report = [&](const sluice::progress_info& p) {
  std::printf("%zu/%zu done, %zu failed, %zu in flight\n", p.finished(), *p.total, p.failed,
              p.in_flight);
  seen.push_back(p.finished());
};
auto results = co_await sluice::gather_with_concurrency(8, std::move(calls),
                                                        sluice::progress(report, 10s));
    // clang-format on
    CHECK(results.size() == 300);
  });
  // 8 calls every 3 s: 38 rounds, 114 s; a report at 12 s (due 10 s), 24 s,
  // ... 108 s, and the end.
  CHECK(loop.now() == 114s);
  REQUIRE(seen.size() == 10);
  CHECK(seen.front() == 25);  // reported by the first worker to start the 5th round
  CHECK(seen.back() == 300);
}

// ---- docs/operating.md: graceful shutdown ---------------------------------

namespace {

std::size_t jobs_done = 0;

asio::awaitable<void> run_job(job) {
  co_await sluice::sleep(20ms);
  ++jobs_done;
}

}  // namespace

TEST_CASE("operating.md: SIGINT stops a job runner gracefully", "[docs]") {
  asio::io_context ctx;
  sluice::queue<job> jobs;
  for (int i = 0; i < 1000; ++i) REQUIRE(jobs.try_put(job{i}));
  bool returned = false;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto ex = co_await asio::this_coro::executor;
        auto interrupt = []() -> asio::awaitable<void> {
          co_await sluice::sleep(60ms);
          ::kill(::getpid(), SIGINT);
        };
        auto serve = [&]() -> asio::awaitable<void> {
          // clang-format off
sluice::stop_source stop;
asio::signal_set signals(ex, SIGINT, SIGTERM);
signals.async_wait([&](auto, int) { stop.request(5s); });  // running jobs get 5 s
co_await sluice::task_group::run(16, [&](sluice::task_group& g) -> asio::awaitable<void> {
  for (;;) {
    job j = co_await jobs.get();
    if (!co_await g.spawn_when_ready(run_job(j))) co_return;  // false: stopping
  }
}, stop);
signals.cancel();
          // clang-format on
          returned = true;
        };
        co_await sluice::gather(serve(), interrupt());
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  ctx.run();
  CHECK(returned);
  CHECK(jobs_done >= 16);
  CHECK(jobs_done + jobs.size() <= 1000);
}

// ---- docs/fanout.md: progress and the filter stage ------------------------

namespace {

struct blob {
  std::string key;
};

struct object_cache {
  std::set<std::string> keys;
  asio::awaitable<bool> contains(std::string key) {
    co_await sluice::sleep(10ms);
    co_return keys.count(key) != 0;
  }
};

asio::awaitable<blob> download(std::string key) {
  co_await sluice::sleep(1s);
  co_return blob{key};
}

}  // namespace

TEST_CASE("fanout.md: a filter stage drops the cached keys before the downloads", "[docs]") {
  sluice::testing::virtual_loop loop;
  object_cache cache{{"b", "d"}};
  std::vector<std::string> keys{"a", "b", "c", "d", "e"};
  std::vector<blob> stored;
  loop.run([&]() -> asio::awaitable<void> {
    // clang-format off
auto fresh = sluice::filter(
    [&](std::string key) -> asio::awaitable<std::optional<std::string>> {
      if (co_await cache.contains(key)) co_return std::nullopt;  // dropped here
      co_return key;
    },
    keys, 16);
co_await sluice::for_each(sluice::map_unordered(download, std::move(fresh), 4),
                          [&](blob b) { stored.push_back(std::move(b)); });
    // clang-format on
  });
  CHECK(stored.size() == 3);  // a, c, e: no download slot spent on b or d
  CHECK(loop.now() == 1010ms);
}

TEST_CASE("fanout.md: map_unordered with a progress report", "[docs]") {
  sluice::testing::virtual_loop loop;
  std::vector<std::string> keys{"a", "b", "c"};
  std::size_t reports = 0;
  loop.run([&]() -> asio::awaitable<void> {
    // clang-format off
auto progress = sluice::progress([&](const sluice::progress_info& p) {
  std::printf("%zu of %zu downloaded\n", p.done, *p.total);
  ++reports;
}, 500ms);
co_await sluice::for_each(sluice::map_unordered(download, keys, 2, std::move(progress)),
                          [&](blob) {});
    // clang-format on
  });
  CHECK(reports == 2);  // at 1 s (first two done; due at 0.5 s), and the end at 2 s
}
