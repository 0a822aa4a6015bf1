// SPDX-License-Identifier: BSL-1.0
// Adversarial review of the streaming fan-out after the mu-fast merge: for_each's
// fast path, next_ref, the result ring and the deferred wakes.
#include <sluice/detail/result_ring.hpp>
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/service_calls.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
using sluice_test::call;
using sluice_test::iota_vec;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// A value whose move throws on demand (before touching the source).
struct fragile {
  static inline int moves_left = 1 << 30;
  int v = 0;
  explicit fragile(int x) : v(x) {}
  fragile(fragile&& o) : v(o.v) {
    if (moves_left-- <= 0) throw std::runtime_error("move");
    o.v = -1;
  }
  fragile& operator=(fragile&&) = delete;
};

}  // namespace

// ---- 5. the ring ---------------------------------------------------------

TEST_CASE("the result ring keeps FIFO order when it grows while wrapped", "[stream]") {
  sluice::detail::result_ring<std::string> r;
  std::vector<std::string> out;
  int next = 0;
  auto name = [](int i) {
    return std::string(40, 'x') + std::to_string(i);
  };
  // Wrap at every capacity, then grow while wrapped.
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 5 + 7 * round; ++i) r.emplace_back(name(next++));
    for (int i = 0; i < 3 + 2 * round; ++i) {
      out.push_back(std::move(r.front()));
      r.pop_front();
    }
  }
  while (!r.empty()) {
    out.push_back(std::move(r.front()));
    r.pop_front();
  }
  REQUIRE(out.size() == static_cast<std::size_t>(next));
  for (int i = 0; i < next; ++i) CHECK(out[static_cast<std::size_t>(i)] == name(i));
}

TEST_CASE("the result ring holds move-only values and frees them when cleared", "[stream]") {
  sluice::detail::result_ring<std::unique_ptr<int>> r;
  for (int i = 0; i < 6; ++i) r.emplace_back(std::make_unique<int>(i));
  for (int i = 0; i < 4; ++i) {
    CHECK(*r.front() == i);
    r.pop_front();
  }
  for (int i = 6; i < 20; ++i) r.emplace_back(std::make_unique<int>(i));  // grows wrapped
  CHECK(r.size() == 16);
  CHECK(*r.front() == 4);
  r.clear();
  CHECK(r.empty());
  r.emplace_back(std::make_unique<int>(99));  // leaks under ASan if clear() lost one
  CHECK(*r.front() == 99);
}

TEST_CASE("the result ring: a move that throws while it grows loses nothing", "[stream]") {
  sluice::detail::result_ring<fragile> r;
  fragile::moves_left = 1 << 30;
  for (int i = 0; i < 8; ++i) r.emplace_back(i);
  r.pop_front();
  r.emplace_back(8);        // full and wrapped: head 1
  fragile::moves_left = 3;  // the 4th move throws: while growing, if it moves them
  try {
    r.emplace_back(9);
  } catch (const std::runtime_error&) {
  }
  fragile::moves_left = 1 << 30;
  std::vector<int> seen;
  while (!r.empty()) {
    seen.push_back(r.front().v);
    r.pop_front();
  }
  if (seen.size() == 9) seen.pop_back();  // 9 was stored after all
  CHECK(seen == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("a stream whose result's move throws when handed out loses no result", "[stream]") {
  virtual_loop loop;
  fragile::moves_left = 1 << 30;
  std::vector<int> seen;
  std::string how;
  auto task = [&](int i) -> asio::awaitable<fragile> {
    co_await sluice::sleep(1s);
    co_return fragile(i);
  };
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(task, iota_vec(4), 4);
    auto first = co_await s.next();
    seen.push_back(first->v);
    fragile::moves_left = 0;
    try {
      auto second = co_await s.next();
      seen.push_back(second->v);
    } catch (const std::runtime_error&) {
      how = "threw";
    }
    fragile::moves_left = 1 << 30;
    while (auto r = co_await s.next()) seen.push_back(r->v);
  });
  CHECK(how == "threw");
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<int>{0, 1, 2, 3});
}

// ---- 1. backpressure ------------------------------------------------------

TEST_CASE("for_each bursts with a body that throws mid-burst await every task", "[for_each]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  std::vector<nanoseconds> started;
  std::size_t handed = 0, most = 0;
  std::string how;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<int> local(64, 7);  // used by the tasks: ASan if one outlives the call
    auto work = [&](int i) -> asio::awaitable<int> {
      started.push_back(loop.now());
      most = std::max(most, started.size() - handed);
      auto r = co_await call(svc, i);
      co_return r + local[static_cast<std::size_t>(i)] - 7;
    };
    how = co_await sluice_test::ending_of(
        sluice::for_each(sluice::map_unordered(work, iota_vec(40), 4), [&](int r) {
          ++handed;
          if (r == 9) throw std::logic_error("body");
        }));
  });
  CHECK(how == "body");
  CHECK(handed == 10);
  CHECK(most == 4);
  CHECK(svc.in_flight() == 0);
  // 4 start at 0, then each burst of 4 frees 4 slots at once; the slots
  // freed at 3 s by 8 and 9 start nothing (the stream stops first).
  CHECK(started.size() == 12);
  for (std::size_t i = 0; i < started.size(); ++i) CHECK(started[i] == std::chrono::seconds(i / 4));
}

namespace {
// A move-only value whose move throws once for v == 3 once `armed`.
struct touchy {
  static inline bool armed = false;
  int v = 0;
  explicit touchy(int x) : v(x) {}
  touchy(touchy&& o) : v(o.v) {
    if (armed && v == 3) {
      armed = false;  // once
      throw std::runtime_error("move of 3");
    }
    o.v = -1;
  }
  touchy& operator=(touchy&&) = delete;
};
}  // namespace

TEST_CASE("results waiting when a later result's move throws are still yielded intact",
          "[stream]") {
  // Limit 10. 0 at 1 s (read at once), 1..8 at 2 s wait unread (8 results:
  // the ring is full), 9 at 3 s arms the throwing move: storing it grows the
  // ring, which moves the 8 waiting results. The failure is the stream's
  // (fail fast), but the results that finished before it must come out as
  // they were (DESIGN: results that finished before the failure are yielded).
  virtual_loop loop;
  touchy::armed = false;
  std::vector<int> seen;
  std::string how;
  auto task = [&](int i) -> asio::awaitable<touchy> {
    co_await sluice::sleep(i == 0 ? 1s : i <= 8 ? 2s : 3s);
    if (i == 9) touchy::armed = true;
    co_return touchy(i);
  };
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(task, iota_vec(10), 10);
    auto first = co_await s.next();
    seen.push_back(first->v);
    co_await sluice::sleep(5s);
    for (;;) {  // a throw when 3 is handed out (if 3 was never moved before) leaves 3 there
      try {
        while (auto r = co_await s.next()) seen.push_back(r->v);
        break;
      } catch (const std::runtime_error& e) {
        how = e.what();
      }
    }
  });
  touchy::armed = false;
  CHECK(how == "move of 3");
  if (seen.size() == 10) seen.pop_back();  // 9 was stored after all
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8});
}

// ---- 2. no lost wakeup ------------------------------------------------------

TEST_CASE("chained stages consumed by for_each run at their limits with exact timing",
          "[for_each]") {
  for (std::size_t up : {std::size_t{8}, std::size_t{1}}) {
    for (std::size_t down : {std::size_t{4}, std::size_t{1}}) {
      for (int body_kind = 0; body_kind < 3; ++body_kind) {
        virtual_loop loop;
        std::size_t g_now = 0, g_max = 0, f_now = 0, f_max = 0;
        std::vector<int> seen;
        auto g = [&](int i) -> asio::awaitable<int> {
          g_max = std::max(g_max, ++g_now);
          co_await sluice::sleep(std::chrono::milliseconds(10 + 10 * (i % 3)));
          --g_now;
          co_return i;
        };
        auto f = [&](int i) -> asio::awaitable<int> {
          f_max = std::max(f_max, ++f_now);
          if (i % 4 != 0) co_await sluice::sleep(std::chrono::milliseconds(5 * (i % 5)));
          --f_now;
          co_return i;
        };
        auto st = sluice::map_unordered(f, sluice::map_unordered(g, iota_vec(50), up), down);
        if (body_kind == 0) {
          loop.run(sluice::for_each(std::move(st), [&](int r) { seen.push_back(r); }));
        } else if (body_kind == 1) {
          loop.run(sluice::for_each(std::move(st), [&](int r) -> asio::awaitable<void> {
            seen.push_back(r);
            if (r % 2) co_await sluice::sleep(3ms);
          }));
        } else {
          loop.run(sluice::for_each(std::move(st), [&](int r) -> asio::awaitable<bool> {
            seen.push_back(r);
            co_await asio::post(asio::use_awaitable);
            co_return true;
          }));
        }
        INFO("up " << up << " down " << down << " body " << body_kind);
        std::sort(seen.begin(), seen.end());
        CHECK(seen == iota_vec(50));
        CHECK(g_max <= up);
        CHECK(f_max <= down);
        CHECK(g_now == 0);
        CHECK(f_now == 0);
      }
    }
  }
}

TEST_CASE("limit 1 with inline tasks and a for_each body drains every input", "[for_each]") {
  virtual_loop loop;
  std::size_t n = 0;
  auto f = [](int i) -> asio::awaitable<int> {
    co_return i;
  };
  loop.run(sluice::for_each(sluice::map_unordered(f, iota_vec(1000), 1), [&](int) { ++n; }));
  CHECK(n == 1000);
  std::size_t m = 0;
  loop.run(sluice::for_each(sluice::map_unordered(f, iota_vec(1000), 7),
                            [&](int) -> asio::awaitable<void> {
                              ++m;
                              co_return;
                            }));
  CHECK(m == 1000);
}

TEST_CASE("for_each on another strand than the one that started the stream gets every burst",
          "[for_each]") {
  virtual_loop loop;
  auto first = asio::make_strand(loop.get_executor());
  auto second = asio::make_strand(loop.get_executor());
  slow_service svc({.latency = latency::fixed(100ms)});
  using stream_type =
      decltype(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(1), 1));
  std::optional<stream_type> s;
  std::vector<int> seen;
  std::size_t on_second = 0;
  bool done = false;
  auto rethrow = [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  };
  asio::co_spawn(
      first,
      [&]() -> asio::awaitable<void> {
        s.emplace(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(40), 5));
        auto r = co_await s->next();
        seen.push_back(*r);
      },
      rethrow);
  loop.run_for(150ms);
  asio::co_spawn(
      second,
      [&]() -> asio::awaitable<void> {
        co_await sluice::for_each(std::move(*s), [&](int r) -> asio::awaitable<void> {
          seen.push_back(r);
          on_second += second.running_in_this_thread() ? 1 : 0;
          if (r % 3 == 0) co_await sluice::sleep(30ms);
        });
        done = true;
      },
      rethrow);
  loop.run_for(20s);
  CHECK(done);
  CHECK(seen.size() == 40);
  CHECK(on_second == 39);
  CHECK(svc.max_in_flight() == 5);
  CHECK(svc.in_flight() == 0);
}

TEST_CASE("a settling stream with failing tasks under for_each at limit 1 and 3", "[for_each]") {
  for (std::size_t limit : {std::size_t{1}, std::size_t{3}}) {
    virtual_loop loop;
    std::size_t ok = 0, failed = 0;
    auto f = [](int i) -> asio::awaitable<int> {
      if (i % 2) co_await sluice::sleep(10ms);
      if (i % 3 == 0) throw std::runtime_error("x");
      co_return i;
    };
    loop.run(
        sluice::for_each(sluice::map_unordered(f, iota_vec(30), limit, sluice::return_exceptions),
                         [&](sluice::outcome<int> r) { (r ? ok : failed) += 1; }));
    CHECK(ok == 20);
    CHECK(failed == 10);
  }
}

// ---- 4. lifetimes ---------------------------------------------------------

TEST_CASE("a stream moved while its next() is pending keeps yielding from the new one",
          "[stream]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  using stream_type =
      decltype(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(1), 1));
  std::optional<stream_type> a, b;
  std::vector<int> seen;
  a.emplace(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(6), 2));
  auto& reader = t.spawn([&]() -> asio::awaitable<void> {
    auto r = co_await a->next();  // pending while a is moved into b
    seen.push_back(*r);
    while (auto x = co_await b->next()) seen.push_back(*x);
  });
  t.poll();
  b.emplace(std::move(*a));
  a.reset();  // the moved-from stream goes: nothing of the pending call may go with it
  t.loop.run_for(10s);
  CHECK(reader.succeeded());
  std::sort(seen.begin(), seen.end());
  CHECK(seen == iota_vec(6));
  CHECK(svc.in_flight() == 0);
}

TEST_CASE("a stream destroyed while another coroutine awaits its next() ends that call",
          "[stream]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  using stream_type =
      decltype(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(1), 1));
  std::optional<stream_type> s;
  s.emplace(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(6), 2));
  std::optional<std::optional<int>> got;
  auto& reader = t.spawn([&]() -> asio::awaitable<void> { got.emplace(co_await s->next()); });
  t.loop.run_for(500ms);
  s.reset();
  t.loop.run_for(10s);
  CHECK(reader.succeeded());
  REQUIRE(got);
  CHECK_FALSE(*got);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() == 2);
}

// A consumer suspended in next() (variants 0 and 3) is owned by the stream's
// state, whose frames own the state in turn (wait_next's shared_ptr): the
// loop's shutdown (detail::loop_service) breaks that cycle, so every variant
// must free everything (LeakSanitizer) and use nothing freed (ASan).
TEST_CASE("an io_context destroyed mid-stream uses nothing freed and leaks nothing (ASan)",
          "[stream]") {
  for (int variant = 0; variant < 4; ++variant) {
    INFO("variant " << variant);
    std::optional<slow_service> svc;
    auto l = std::make_unique<virtual_loop>();
    svc.emplace(slow_service::options{.latency = latency::fixed(1s)});
    auto body = [&, variant]() -> asio::awaitable<void> {
      auto s = sluice::map_unordered([&](int i) { return call(*svc, i); }, iota_vec(50), 4);
      if (variant == 0) {
        // consumer waiting, workers running
        while (auto r = co_await s.next()) {
        }
      } else if (variant == 1) {
        // results waiting, workers parked, consumer asleep
        auto r = co_await s.next();
        (void)r;
        co_await sluice::sleep(100s);
      } else if (variant == 2) {
        // for_each with an awaitable body, burst pending
        co_await sluice::for_each(
            std::move(s), [&](int) -> asio::awaitable<void> { co_await sluice::sleep(10s); });
      } else {
        // a chain
        co_await sluice::for_each(
            sluice::map_unordered([](int i) -> asio::awaitable<int> { co_return i; }, std::move(s),
                                  2),
            [&](int) {});
      }
    };
    asio::co_spawn(l->get_executor(), body(), [](std::exception_ptr) {});
    l->run_for(1500ms);
    l.reset();  // the loop goes with everything pending
    svc.reset();
  }
}

// ---- 3. cancellation --------------------------------------------------------

TEST_CASE("for_each cancelled at the instant a burst arrives waits for every task", "[for_each]") {
  // The canceller's timer fires at 1 s, when results 0..3 arrive: before
  // them (armed first) or after them (armed last).
  for (bool cancel_first : {true, false}) {
    for (int body_kind = 0; body_kind < 2; ++body_kind) {
      INFO("cancel first " << cancel_first << " body " << body_kind);
      sluice_test::tasks_on_loop t;
      std::optional<slow_service> svc;
      svc.emplace(slow_service::options{.latency = latency::fixed(1s)});
      std::string how;
      std::vector<int> seen;
      std::size_t in_flight_at_end = 99;
      nanoseconds ended_at{};
      sluice_test::task* consumer = nullptr;
      if (cancel_first) {
        t.spawn([&]() -> asio::awaitable<void> {
          co_await sluice::sleep(1s);
          consumer->cancel();
        });
      }
      consumer = &t.spawn([&]() -> asio::awaitable<void> {
        std::vector<int> local(100, 1);
        auto work = [&](int i) -> asio::awaitable<int> {
          auto r = co_await call(*svc, i);
          co_return r* local[static_cast<std::size_t>(i)];
        };
        auto s = sluice::map_unordered(work, iota_vec(100), 4);
        if (body_kind == 0) {
          how = co_await sluice_test::ending_of(
              sluice::for_each(std::move(s), [&](int r) { seen.push_back(r); }));
        } else {
          how = co_await sluice_test::ending_of(
              sluice::for_each(std::move(s), [&](int r) -> asio::awaitable<void> {
                seen.push_back(r);
                co_await sluice::sleep(10ms);
              }));
        }
        in_flight_at_end = svc->in_flight();
        ended_at = t.loop.now();
      });
      if (!cancel_first) {
        t.spawn([&]() -> asio::awaitable<void> {
          co_await sluice::sleep(1s);
          consumer->cancel();
        });
      }
      t.loop.run_for(30s);
      CHECK(consumer->done);
      CHECK(how == "aborted");
      CHECK(in_flight_at_end == 0);
      CHECK(svc->in_flight() == 0);
      for (std::size_t i = 0; i + 1 < seen.size(); ++i) CHECK(seen[i] < seen[i + 1]);
      CHECK(seen.size() <= 4);
      CHECK(ended_at == 1s);  // tasks 4.. were cancelled at once and waited for
    }
  }
}

TEST_CASE("for_each cancelled while its awaitable body runs with a burst waiting", "[for_each]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string how;
  std::vector<int> seen;
  std::size_t in_flight_at_end = 99;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    how = co_await sluice_test::ending_of(sluice::for_each(
        sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(100), 4),
        [&](int r) -> asio::awaitable<void> {
          seen.push_back(r);
          co_await sluice::sleep(300ms);
        }));
    in_flight_at_end = svc.in_flight();
  });
  t.loop.run_for(1500ms);  // at 1 s: 0..3 arrive; 0's body until 1.3 s, 1's until 1.6 s
  consumer.cancel();
  t.loop.run_for(10s);
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(seen == std::vector<int>{0, 1});
  CHECK(in_flight_at_end == 0);
  CHECK(svc.calls() == 6);  // 4 at 0 s, 4 and 5 when 0 and 1 were taken
  CHECK(svc.cancellations() == 2);
}

TEST_CASE(
    "for_each from a caller cancelled before the call with throw_if_cancelled off "
    "starts nothing",
    "[for_each]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string how;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1s);  // cancelled at once
    } catch (...) {
    }
    how = co_await sluice_test::ending_of(sluice::for_each(
        sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(10), 4), [&](int) {}));
  });
  t.poll();
  consumer.cancel();
  t.loop.run_for(10s);
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(svc.calls() == 0);
}

// ---- 2. async sources ---------------------------------------------------------

namespace {
// An async source that yields 0..n-1, every third item inline (no suspension),
// the others after 1 ms; counts overlapping next() calls.
struct mixed_source {
  int n = 0, i = 0;
  std::size_t active = 0, max_active = 0;
  asio::awaitable<std::optional<int>> next() {
    max_active = std::max(max_active, ++active);
    if (i % 3 != 0) co_await sluice::sleep(1ms);
    --active;
    if (i == n) co_return std::nullopt;
    co_return i++;
  }
};
}  // namespace

TEST_CASE("an async source that sometimes yields inline feeds for_each without a lost wakeup",
          "[for_each]") {
  for (std::size_t limit : {std::size_t{1}, std::size_t{2}, std::size_t{5}}) {
    INFO("limit " << limit);
    virtual_loop loop;
    mixed_source src{.n = 60};
    std::size_t now = 0, most = 0;
    std::vector<int> seen;
    auto f = [&](int i) -> asio::awaitable<int> {
      most = std::max(most, ++now);
      if (i % 2) co_await sluice::sleep(std::chrono::milliseconds(i % 7));
      --now;
      co_return i;
    };
    loop.run(
        sluice::for_each(sluice::map_unordered(f, src, limit), [&](int r) -> asio::awaitable<bool> {
          seen.push_back(r);
          if (r % 5 == 0) co_await sluice::sleep(2ms);
          co_return true;
        }));
    std::sort(seen.begin(), seen.end());
    CHECK(seen == iota_vec(60));
    CHECK(src.max_active == 1);
    CHECK(most <= limit);
    CHECK(now == 0);
  }
}

// ---- tasks that complete at once ------------------------------------------

TEST_CASE("a consumer reading tasks that complete at once gets every result in order of completion",
          "[stream]") {
  // A worker runs such tasks inline until the slots are full, then parks; the
  // consumer drains the buffer and the worker refills it: limits 1, 2, 64.
  for (std::size_t limit : {std::size_t{1}, std::size_t{2}, std::size_t{64}}) {
    virtual_loop loop;
    std::vector<int> seen;
    auto fn = [](int i) -> asio::awaitable<int> {
      co_return i;
    };
    loop.run([&]() -> asio::awaitable<void> {
      auto s = sluice::map_unordered(fn, iota_vec(500), limit);
      while (auto x = co_await s.next()) seen.push_back(*x);
    });
    INFO("limit " << limit);
    CHECK(seen == iota_vec(500));
  }
}
