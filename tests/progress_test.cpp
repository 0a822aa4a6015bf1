// SPDX-License-Identifier: BSL-1.0
#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/progress.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/lazy_tasks.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using sluice::progress_info;
using sluice::testing::virtual_loop;
using std::chrono::milliseconds;

namespace {

// One report as the test compares it: instant (ms) and counts.
struct row {
  long long at_ms;
  std::optional<std::size_t> total;
  std::size_t started, done, failed, in_flight, waiting;
  bool operator==(const row&) const = default;
};

std::ostream& operator<<(std::ostream& os, const row& r) {
  os << "{t=" << r.at_ms << "ms total=" << (r.total ? std::to_string(*r.total) : "-")
     << " started=" << r.started << " done=" << r.done << " failed=" << r.failed
     << " in_flight=" << r.in_flight << " waiting=" << r.waiting << "}";
  return os;
}

// Records every report; checks the invariant on each.
struct recorder {
  std::vector<row> rows;
  void operator()(const progress_info& p) {
    CHECK(p.started == p.done + p.failed + p.in_flight);
    CHECK(p.finished() == p.done + p.failed);
    rows.push_back({std::chrono::duration_cast<milliseconds>(p.elapsed).count(), p.total, p.started,
                    p.done, p.failed, p.in_flight, p.waiting});
  }
};

auto record(recorder& r, sluice::clock::duration every = 1s) {
  return sluice::progress([&r](const progress_info& p) { r(p); }, every);
}

asio::awaitable<int> nap(int ms, int value = 0) {
  co_await sluice::sleep(milliseconds(ms));
  co_return value;
}

asio::awaitable<int> nap_then_fail(int ms) {
  co_await sluice::sleep(milliseconds(ms));
  throw std::runtime_error("task failed");
}

std::vector<asio::awaitable<int>> naps(std::vector<int> ms) {
  std::vector<asio::awaitable<int>> v;
  for (int d : ms) v.push_back(nap(d, d));
  return v;
}

}  // namespace

TEST_CASE("progress reports gather_with_concurrency at most once per period and once at the end",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  // Limit 2 over six 1 s tasks, every 1.5 s: nothing changes before 1 s; at
  // 1 s it is too early; at 2 s the first report (after the freed slot was
  // refilled), the next one would be due at 3.5 s: only the end at 3 s.
  auto out = loop.run(sluice::gather_with_concurrency(2, naps({1000, 1000, 1000, 1000, 1000, 1000}),
                                                      record(r, 1500ms)));
  CHECK(out.size() == 6);
  CHECK(r.rows == std::vector<row>{{2000, 6, 5, 3, 0, 2, 0}, {3000, 6, 6, 6, 0, 0, 0}});
}

TEST_CASE("progress reports come at the first change due, not on a timer of their own",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  // Every 1 s, but a single 10 s task: no change between 0 and 10 s, so no
  // report but the end (and the virtual clock is not kept jumping).
  loop.run(sluice::gather_with_concurrency(1, naps({10000}), record(r)));
  CHECK(r.rows == std::vector<row>{{10000, 1, 1, 1, 0, 0, 0}});
  CHECK(loop.now() == 10s);
}

TEST_CASE("progress with every zero reports every start and every end", "[progress]") {
  virtual_loop loop;
  recorder r;
  loop.run(sluice::gather_with_concurrency(1, naps({100, 200}), record(r, 0s)));
  CHECK(r.rows == std::vector<row>{{0, 2, 1, 0, 0, 1, 0},
                                   {100, 2, 2, 1, 0, 1, 0},
                                   {300, 2, 2, 2, 0, 0, 0}});  // also the end
}

TEST_CASE("progress counts failures of a settling gather and totals a sized range", "[progress]") {
  virtual_loop loop;
  recorder r;
  std::vector<asio::awaitable<int>> tasks;
  tasks.push_back(nap(100));
  tasks.push_back(nap_then_fail(200));
  tasks.push_back(nap(300));
  tasks.push_back(nap_then_fail(400));
  auto out = loop.run(sluice::gather_with_concurrency(4, std::move(tasks),
                                                      sluice::return_exceptions, record(r, 250ms)));
  REQUIRE(out.size() == 4);
  CHECK(!out[1].has_value());
  // 250 ms due: the first change after it is the end of the 300 ms task.
  CHECK(r.rows == std::vector<row>{{300, 4, 4, 2, 1, 1, 0}, {400, 4, 4, 2, 2, 0, 0}});
}

TEST_CASE("progress of a failing gather counts the cancelled siblings and still reports the end",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  std::vector<asio::awaitable<int>> tasks;
  tasks.push_back(nap_then_fail(100));
  tasks.push_back(nap(1000));
  tasks.push_back(nap(1000));
  tasks.push_back(nap(1000));
  CHECK_THROWS_WITH(loop.run(sluice::gather_with_concurrency(3, std::move(tasks), record(r))),
                    "task failed");
  // The failure stops the pulling: the 4th task never starts; both siblings
  // are cancelled (they end with an exception).
  CHECK(r.rows == std::vector<row>{{100, 4, 3, 0, 3, 0, 0}});
}

TEST_CASE("progress of an unbounded gather over a lazy range has no total", "[progress]") {
  virtual_loop loop;
  recorder r;
  sluice_test::lazy_tasks<asio::awaitable<int>> tasks(
      3, [](std::size_t i) { return nap(static_cast<int>(100 * (i + 1))); });
  auto out = loop.run(sluice::gather(tasks, record(r, 150ms)));
  CHECK(out == std::vector<int>{0, 0, 0});
  CHECK(r.rows ==
        std::vector<row>{{200, std::nullopt, 3, 2, 0, 1, 0}, {300, std::nullopt, 3, 3, 0, 0, 0}});
}

TEST_CASE("progress of a variadic gather totals its tasks and keeps the tuple result",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  auto done = [&]() -> asio::awaitable<void> {
    co_await sluice::sleep(200ms);
  };
  auto out = loop.run(sluice::gather(nap(100, 1), nap(300, 2), done(), record(r, 150ms)));
  static_assert(std::is_same_v<decltype(out), std::tuple<int, int, std::monostate>>);
  CHECK(std::get<0>(out) == 1);
  CHECK(std::get<1>(out) == 2);
  // Due at 150 ms: the first change after it is the void task's end at 200 ms.
  CHECK(r.rows == std::vector<row>{{200, 3, 3, 2, 0, 1, 0}, {300, 3, 3, 3, 0, 0, 0}});
  CHECK(loop.now() == 300ms);
}

TEST_CASE("progress of a settling variadic gather counts the tasks that threw", "[progress]") {
  virtual_loop loop;
  recorder r;
  auto out = loop.run(sluice::gather(nap(100, 7), nap_then_fail(200), nap(300, 9),
                                     sluice::return_exceptions, record(r, 150ms)));
  static_assert(
      std::is_same_v<decltype(out),
                     std::tuple<sluice::outcome<int>, sluice::outcome<int>, sluice::outcome<int>>>);
  CHECK(std::get<0>(out).value() == 7);
  CHECK(!std::get<1>(out).has_value());
  CHECK(std::get<2>(out).value() == 9);
  CHECK(r.rows == std::vector<row>{{200, 3, 3, 1, 1, 1, 0}, {300, 3, 3, 2, 1, 0, 0}});
}

TEST_CASE("progress of a failing variadic gather counts the cancelled sibling", "[progress]") {
  virtual_loop loop;
  recorder r;
  CHECK_THROWS_WITH(loop.run(sluice::gather(nap_then_fail(100), nap(1000), record(r))),
                    "task failed");
  CHECK(r.rows == std::vector<row>{{100, 2, 2, 0, 2, 0, 0}});
  CHECK(loop.now() == 100ms);
  // A single task with progress, and a progress passed as an lvalue (copied).
  recorder r2;
  auto p = record(r2, 0s);
  auto one = loop.run(sluice::gather(nap(50, 5), p));
  CHECK(std::get<0>(one) == 5);
  CHECK(r2.rows.back() == row{50, 1, 1, 1, 0, 0, 0});
}

TEST_CASE("progress of an empty gather is one end report", "[progress]") {
  virtual_loop loop;
  recorder r;
  auto out = loop.run(sluice::gather(std::vector<asio::awaitable<int>>{}, record(r)));
  CHECK(out.empty());
  CHECK(r.rows == std::vector<row>{{0, 0, 0, 0, 0, 0, 0}});
}

TEST_CASE("progress of a cancelled gather reports the end after every task stopped", "[progress]") {
  virtual_loop loop;
  recorder r;
  CHECK_THROWS_AS(loop.run(sluice::with_timeout(
                      1500ms, sluice::gather_with_concurrency(
                                  2, naps({1000, 1000, 1000, 1000, 1000}), record(r)))),
                  sluice::timeout_error);
  // At 1 s the first worker to see its task end starts the 3rd task and
  // reports; the second one's task has ended but is not counted yet.
  CHECK(r.rows == std::vector<row>{{1000, 5, 3, 1, 0, 2, 0}, {1500, 5, 4, 2, 2, 0, 0}});
}

TEST_CASE("a report that throws stops the reports; the gather runs on and rethrows it",
          "[progress]") {
  virtual_loop loop;
  int calls = 0;
  int finished = 0;
  auto task = [&](int ms) -> asio::awaitable<void> {
    co_await sluice::sleep(milliseconds(ms));
    ++finished;
  };
  std::vector<asio::awaitable<void>> tasks;
  for (int i = 0; i < 4; ++i) tasks.push_back(task(100 * (i + 1)));
  CHECK_THROWS_WITH(
      loop.run(sluice::gather(std::move(tasks), sluice::progress(
                                                    [&](const progress_info&) {
                                                      ++calls;
                                                      throw std::runtime_error("report broke");
                                                    },
                                                    100ms))),
      "report broke");
  CHECK(calls == 1);
  CHECK(finished == 4);
  CHECK(loop.now() == 400ms);
}

TEST_CASE("progress rejects a negative period", "[progress]") {
  CHECK_THROWS_AS(sluice::progress([](const progress_info&) {}, -1ms), std::invalid_argument);
}

TEST_CASE("progress of map_unordered counts a task done when it finishes, not when it is read",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  std::vector<int> ms{100, 200, 300, 400};
  std::vector<int> got;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([](int d) { return nap(d, d); }, ms, 2, record(r, 150ms)),
        [&](int v) -> asio::awaitable<void> {
          got.push_back(v);
          co_await sluice::sleep(1ms);
        });
  });
  CHECK(got.size() == 4);
  // 100: the 1st ends, is read, the 3rd starts (300 ms); 200: the 2nd ends
  // (due 150: report), is read, the 4th starts (400 ms); 400: the 3rd ends
  // (due 350); 600: the last one, which is also the end.
  CHECK(r.rows == std::vector<row>{
                      {200, 4, 3, 2, 0, 1, 0}, {400, 4, 4, 3, 0, 1, 0}, {600, 4, 4, 4, 0, 0, 0}});
}

TEST_CASE("progress of a settling map_unordered over an async source has no total", "[progress]") {
  virtual_loop loop;
  recorder r;
  std::vector<int> ms{100, 200, 300};
  std::size_t failures = 0;
  loop.run([&]() -> asio::awaitable<void> {
    auto upstream = sluice::map_unordered([](int d) { return nap(d, d); }, ms, 3);
    co_await sluice::for_each(sluice::map_unordered(
                                  [](int d) -> asio::awaitable<int> {
                                    if (d == 200) co_return co_await nap_then_fail(50);
                                    co_return co_await nap(50, d);
                                  },
                                  std::move(upstream), 1, sluice::return_exceptions, record(r, 0s)),
                              [&](sluice::outcome<int> o) { failures += o ? 0 : 1; });
  });
  CHECK(failures == 1);
  CHECK(r.rows == std::vector<row>{{100, std::nullopt, 1, 0, 0, 1, 0},
                                   {150, std::nullopt, 1, 1, 0, 0, 0},
                                   {200, std::nullopt, 2, 1, 0, 1, 0},
                                   {250, std::nullopt, 2, 1, 1, 0, 0},
                                   {300, std::nullopt, 3, 1, 1, 1, 0},
                                   {350, std::nullopt, 3, 2, 1, 0, 0}});
}

TEST_CASE("progress of a closed stream still ends with one report", "[progress]") {
  virtual_loop loop;
  recorder r;
  std::vector<int> ms{100, 1000, 1000};
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([](int d) { return nap(d, d); }, ms, 3, record(r)),
        [](int) { return false; });  // stop after the first result
  });
  CHECK(r.rows == std::vector<row>{{100, 3, 3, 1, 2, 0, 0}});
}

TEST_CASE("progress of a task_group reports children, with those waiting for a slot",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  auto child = [](int ms) -> asio::awaitable<void> {
    co_await sluice::sleep(milliseconds(ms));
  };
  loop.run(sluice::task_group::run(
      2,
      [&](sluice::task_group& g) -> asio::awaitable<void> {
        for (int i = 0; i < 5; ++i) g.spawn(child(1000));
        co_await sluice::sleep(2500ms);  // the body is not counted
        g.spawn(child(1000));
      },
      record(r, 500ms)));
  const auto none = std::nullopt;
  CHECK(r.rows == std::vector<row>{{1000, none, 3, 1, 0, 2, 2},
                                   {2000, none, 5, 3, 0, 2, 0},
                                   {2500, none, 6, 4, 0, 2, 0},
                                   {3000, none, 6, 5, 0, 1, 0},
                                   {3500, none, 6, 6, 0, 0, 0}});
}

TEST_CASE("progress of a stopped task_group counts the cancelled children, not the unstarted",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  sluice::stop_source stop;
  auto child = [](int ms) -> asio::awaitable<void> {
    co_await sluice::sleep(milliseconds(ms));
  };
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::gather(
        sluice::task_group::run(
            2,
            [&](sluice::task_group& g) -> asio::awaitable<void> {
              g.spawn(child(200));
              for (int i = 0; i < 4; ++i) g.spawn(child(1000));
              co_return;
            },
            stop, record(r, 100ms)),
        [&]() -> asio::awaitable<void> {
          co_await sluice::sleep(500ms);
          stop.request(300ms);  // the two running get 300 ms, then are cancelled
        }());
  });
  // 200: the short child ends, a long one starts (report, next due at 300).
  // The stop at 500 drops the two waiting (they never start) and cancels the
  // running two at 800: the first to end is the first change due (a report),
  // the second is the end.
  const auto none = std::nullopt;
  CHECK(r.rows == std::vector<row>{{200, none, 3, 1, 0, 2, 2},
                                   {800, none, 3, 1, 1, 1, 0},
                                   {800, none, 3, 1, 2, 0, 0}});
  CHECK(loop.now() == 800ms);
}

TEST_CASE("a fan-out without progress keeps its state as it was", "[progress]") {
  // The hooks of a fan-out without progress are empty and take no space.
  STATIC_REQUIRE(std::is_empty_v<sluice::detail::no_progress>);
  using tasks = std::vector<asio::awaitable<int>>;
  STATIC_REQUIRE(sizeof(sluice::detail::gather_state<tasks, false>) ==
                 sizeof(sluice::detail::gather_state<tasks, false, sluice::detail::no_progress>));
  STATIC_REQUIRE(!sluice::detail::gather_state<tasks, false>::progress_type::enabled);
}

TEST_CASE("progress with the longest period reports only the end", "[progress]") {
  virtual_loop loop;
  recorder r;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::sleep(1s);  // the start is not at the clock's origin: t0 + every saturates
    auto tasks = naps(std::vector<int>{100, 200});
    co_await sluice::gather_with_concurrency(1, std::move(tasks),
                                             record(r, sluice::clock::duration::max()));
  });
  CHECK(r.rows == std::vector<row>{{300, 2, 2, 2, 0, 0, 0}});
}

TEST_CASE("the end report carries the end's elapsed time when no count changed since the last",
          "[progress]") {
  virtual_loop loop;
  recorder r;
  // The only child ends at 1 s (a report with the final counts); the body
  // goes on until 3 s: the end report says 3 s, with the same counts.
  loop.run(sluice::task_group::run(
      2,
      [&](sluice::task_group& g) -> asio::awaitable<void> {
        g.spawn([]() -> asio::awaitable<void> {
          co_await sluice::sleep(1s);
        }());
        co_await sluice::sleep(3s);
      },
      record(r, 0s)));
  const auto none = std::nullopt;
  REQUIRE(r.rows.size() >= 2);
  CHECK(r.rows[r.rows.size() - 2] == row{1000, none, 1, 1, 0, 0, 0});
  CHECK(r.rows.back() == row{3000, none, 1, 1, 0, 0, 0});
}

TEST_CASE("progress tells tasks waiting on a named limit from the running ones", "[progress]") {
  // The trial's reading: an unbounded gather of tasks behind a semaphore{8}
  // showed "492 in flight" with 8 calls at the provider.
  virtual_loop loop;
  sluice::semaphore provider{8};
  std::vector<progress_info> reports;
  auto call = [&]() -> asio::awaitable<void> {
    auto p = co_await provider.scoped_acquire();
    co_await sluice::sleep(1s);
  };
  std::vector<asio::awaitable<void>> tasks;
  for (int i = 0; i < 20; ++i) tasks.push_back(call());
  loop.run(sluice::gather(
      std::move(tasks), sluice::progress([&](const progress_info& p) { reports.push_back(p); }, 0s)
                            .waiting_on(provider)));
  REQUIRE(!reports.empty());
  for (const auto& p : reports) {
    // A start is reported before the task runs to its wait: it counts as
    // running until then (8 holders and the task just started).
    CHECK(p.running() <= 9);
    CHECK(p.in_flight == p.running() + p.waiting_on_limits);
  }
  // The first task to end (at 1 s): 19 in flight, 8 running (the 9th was
  // granted the freed permit), 11 waiting.
  const auto first_end = std::find_if(reports.begin(), reports.end(),
                                      [](const progress_info& p) { return p.done == 1; });
  REQUIRE(first_end != reports.end());
  CHECK(first_end->elapsed == 1s);
  CHECK(first_end->in_flight == 19);
  CHECK(first_end->running() == 8);
  CHECK(first_end->waiting_on_limits == 11);
  CHECK(reports.back().in_flight == 0);
  CHECK(reports.back().waiting_on_limits == 0);
  CHECK(loop.now() == 3s);
}
