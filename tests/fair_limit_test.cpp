// SPDX-License-Identifier: BSL-1.0
#include <sluice/adaptive_limit.hpp>
#include <sluice/fair_limit.hpp>
#include <sluice/policy.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/shed.hpp>
#include <sluice/strand_bound.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <examples/support/fair_share_scenario.hpp>
#include <support/peak.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

using fair_rate = sluice::fair_limit<sluice::rate_limiter, std::string>;
using fair_sem = sluice::fair_limit<sluice::semaphore, std::string>;

// Takes `n` units of `key`, recording the key and the instant of the grant.
asio::awaitable<void> start(fair_rate& r, virtual_loop& loop, std::string key, std::size_t n,
                            std::vector<std::pair<std::string, nanoseconds>>& grants) {
  co_await r.acquire(key, n);
  grants.emplace_back(key, loop.now());
}

// Holds a permit of `key` for `hold`, recording the order of grants.
asio::awaitable<void> hold_for(fair_sem& sem, std::string key, nanoseconds hold,
                               std::vector<std::string>& grants) {
  auto p = co_await sem.scoped_acquire(key);
  grants.push_back(key);
  co_await sluice::sleep(hold);
}

// hold_for within `patience`; sets `timed_out` if it gave up waiting.
asio::awaitable<void> hold_or_give_up(fair_sem& sem, std::string key, nanoseconds hold,
                                      nanoseconds patience, std::vector<std::string>& grants,
                                      bool& timed_out) {
  try {
    co_await sluice::with_timeout(patience, hold_for(sem, std::move(key), hold, grants));
  } catch (const sluice::timeout_error&) {
    timed_out = true;
  }
}

}  // namespace

TEST_CASE(
    "an idle fair limit lets calls straight into its limit and a key without waiters "
    "takes nothing",
    "[fair_limit]") {
  virtual_loop loop;
  fair_rate rpm{3, 1s};
  std::vector<std::pair<std::string, nanoseconds>> grants;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      for (int i = 0; i < 4; ++i) g.spawn(start(rpm, loop, "a", 1, grants));
      co_return;
    });
  });
  // Only "a" asks: its 3 starts go at once, the fourth when the window lets it.
  using g = std::pair<std::string, nanoseconds>;
  CHECK(grants == std::vector<g>{{"a", 0s}, {"a", 0s}, {"a", 0s}, {"a", 1s}});
  CHECK(rpm.waiters() == 0);
  CHECK(rpm.stats("a").share == 1.0);
  CHECK(rpm.stats("a").waiting == 0);
  CHECK(rpm.underlying().waiters() == 0);
}

TEST_CASE("contended units rotate between waiting keys in proportion to their weights",
          "[fair_limit]") {
  // 50 units per 10 ms; every call takes 50 (one per window). Weights are
  // credit per round in units: "a" gets two calls' worth, "b" and "c" one.
  virtual_loop loop;
  sluice::fair_limit<sluice::rate_limiter, std::string> r{50, 10ms};
  r.set_weight("a", 100);
  r.set_weight("b", 50);
  r.set_weight("c", 50);
  std::vector<std::pair<std::string, nanoseconds>> grants;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      g.spawn(start(r, loop, "x", 50, grants));  // fills the window at 0
      for (int i = 0; i < 6; ++i) g.spawn(start(r, loop, "a", 50, grants));
      for (int i = 0; i < 3; ++i) g.spawn(start(r, loop, "b", 50, grants));
      for (int i = 0; i < 3; ++i) g.spawn(start(r, loop, "c", 50, grants));
      co_return;
    });
  });
  std::vector<std::string> order;
  for (std::size_t i = 0; i < grants.size(); ++i) {
    order.push_back(grants[i].first);
    CHECK(grants[i].second == milliseconds(10 * i));  // one per window, none late
  }
  // The first "a" found the gate idle and went into the limit's queue; the
  // rest rotate: a a | b | c | a a | b | c | a | b | c.
  CHECK(order ==
        std::vector<std::string>{"x", "a", "a", "a", "b", "c", "a", "a", "b", "c", "a", "b", "c"});
}

TEST_CASE("a cancelled call at the gate or inside the limit holds nothing and the turn passes on",
          "[fair_limit]") {
  virtual_loop loop;
  fair_sem sem{1};
  std::vector<std::string> grants;
  bool a_gave_up = false, b_gave_up = false;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      g.spawn(hold_for(sem, "x", 100ms, grants));
      // "a" goes into the semaphore's queue (the gate was idle), "b" and "c"
      // wait at the gate; "b" gives up at 20 ms (at the gate), "a" at 40
      // (inside the limit), and the turn goes to "c".
      g.spawn(hold_or_give_up(sem, "a", 10ms, 40ms, grants, a_gave_up));
      g.spawn(hold_or_give_up(sem, "b", 10ms, 20ms, grants, b_gave_up));
      g.spawn(hold_for(sem, "c", 10ms, grants));
      co_return;
    });
  });
  CHECK(a_gave_up);
  CHECK(b_gave_up);
  CHECK(grants == std::vector<std::string>{"x", "c"});
  CHECK(loop.now() == 110ms);
  CHECK(sem.underlying().value() == 1);
  CHECK(sem.waiters() == 0);
  for (const char* k : {"a", "b", "c", "x"}) {
    CHECK(sem.stats(k).waiting == 0);
    CHECK(sem.stats(k).in_use == 0);
  }
}

TEST_CASE("a call cancelled after its turn came but before it resumed passes the turn on",
          "[fair_limit]") {
  sluice_test::tasks_on_loop h;
  fair_sem sem{1};
  std::vector<std::string> grants;
  sluice_test::task* b = nullptr;
  auto& x = h.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire("x");
    co_await sluice::sleep(10ms);
  });
  auto& a = h.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire("a");  // in the semaphore's queue
    grants.push_back("a");
    b->cancel();  // "b" was just handed the turn (its completion is posted)
  });
  b = &h.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire("b");
    grants.push_back("b");
  });
  auto& c = h.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire("c");
    grants.push_back("c");
  });
  h.loop.run_for(20ms);
  CHECK(x.succeeded());
  CHECK(a.succeeded());
  CHECK(b->cancelled());
  CHECK(c.succeeded());
  CHECK(grants == std::vector<std::string>{"a", "c"});
  CHECK(sem.underlying().value() == 1);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("a caller cancelled before it called is refused by a fair limit even when it is idle",
          "[fair_limit]") {
  sluice_test::tasks_on_loop h;
  fair_sem sem{1};
  fair_rate rpm{5, 1s};
  int got = 0;
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    try {
      auto p = co_await sem.scoped_acquire("k");  // ...then calls, throw_if_cancelled off
      ++got;
    } catch (const sluice::system_error&) {
    }
    co_await rpm.acquire("k", 2);
    ++got;
  });
  h.poll();
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(got == 0);
  CHECK(sem.underlying().value() == 1);
  CHECK(sem.stats("k").in_use == 0);
  CHECK(rpm.underlying().try_acquire(5));  // no start was taken
  CHECK(sem.keys() == 0);
}

TEST_CASE("destroying a fair limit ends the calls at its gate and in its limit", "[fair_limit]") {
  sluice_test::tasks_on_loop h;
  auto rpm = std::make_unique<fair_rate>(1, 1h);
  auto call = [&rpm](const char* k) {
    return [&rpm, k]() -> asio::awaitable<void> {
      co_await rpm->acquire(k);
    };
  };
  auto& x = h.spawn(call("x"));  // takes the window's one start
  auto& a = h.spawn(call("a"));  // waits inside the rate limiter
  auto& b = h.spawn(call("b"));  // waits at the gate
  h.poll();
  CHECK(x.succeeded());
  CHECK(rpm->waiters() == 2);
  CHECK(rpm->underlying().waiters() == 1);
  rpm.reset();
  h.poll();
  CHECK(a.cancelled());
  CHECK(b.cancelled());
}

TEST_CASE("a call whose loop is destroyed while it has the turn hands the turn on",
          "[fair_limit]") {
  fair_rate r{1, 1h};  // real time: the window stays full for the whole test
  asio::io_context second;
  asio::cancellation_signal cancel_b;
  bool b_done = false;
  {
    auto first = std::make_unique<asio::io_context>();
    asio::co_spawn(*first, r.acquire("x"), asio::detached);  // takes the one start
    asio::co_spawn(*first, r.acquire("a"), asio::detached);  // has the turn, waits in the limiter
    first->poll();
    asio::co_spawn(
        second, r.acquire("b"),
        asio::bind_cancellation_slot(cancel_b.slot(), [&](std::exception_ptr) { b_done = true; }));
    second.poll();
    CHECK(r.waiters() == 2);
    CHECK(r.underlying().waiters() == 1);  // "a"; "b" waits at the gate
  }                                        // "a"'s loop ends: its frame is destroyed
  second.poll();
  CHECK(r.waiters() == 1);
  CHECK(r.underlying().waiters() == 1);  // "b" had the turn handed on and waits in the limiter
  cancel_b.emit(asio::cancellation_type::terminal);
  second.poll();
  CHECK(b_done);
  CHECK(r.waiters() == 0);
}

TEST_CASE("a fair limit rejects bad input with clear errors", "[fair_limit]") {
  CHECK_THROWS_AS((fair_sem{sluice::fair_options{.window = 0}, 1}), std::invalid_argument);
  fair_rate rpm{10, 1s};
  CHECK_THROWS_AS(rpm.set_weight("a", 0), std::invalid_argument);
  CHECK_THROWS_AS(rpm.set_weight("a", -1), std::invalid_argument);
  CHECK_THROWS_AS(rpm.set_weight("a", std::numeric_limits<double>::quiet_NaN()),
                  std::invalid_argument);
  CHECK_THROWS_AS(rpm.try_acquire("a", 0), std::invalid_argument);
  CHECK_THROWS_AS(rpm.try_acquire("a", 11), std::invalid_argument);
  virtual_loop loop;
  CHECK_THROWS_AS(loop.run(rpm.acquire("a", 11)), std::invalid_argument);  // at the call
  CHECK(rpm.keys() == 0);
  CHECK(rpm.waiters() == 0);
}

// ---- the noisy tenant on a rate-limited provider and an adaptive limit ----

namespace scenario = sluice_examples::fair_share;

TEST_CASE(
    "a noisy tenant's burst on a request rate leaves the quiet tenants' p99 wait within 2x "
    "under fair shares",
    "[fair_limit]") {
  const auto p99 = [](const scenario::waits& w) {
    return scenario::percentile(w.quiet, 99);
  };
  // 8 requests per sliding 50 ms.
  const nanoseconds alone = p99(scenario::run(false, scenario::fair_rate(8, 50ms)));
  CHECK(alone == 100ms);
  CHECK(p99(scenario::run(false, scenario::fifo_rate(8, 50ms))) == alone);
  CHECK(p99(scenario::run(true, scenario::fifo_rate(8, 50ms))) == 1350ms);
  CHECK(p99(scenario::run(true, scenario::fair_rate(8, 50ms))) == 150ms);
}

TEST_CASE(
    "a noisy tenant's burst of large calls on a token rate leaves the quiet tenants' p99 "
    "wait within 2x under fair shares",
    "[fair_limit]") {
  const auto p99 = [](const scenario::waits& w) {
    return scenario::percentile(w.quiet, 99);
  };
  // 800 tokens per sliding 50 ms; quiet calls take 100 tokens, noisy ones 200.
  const nanoseconds alone = p99(scenario::run(false, scenario::fair_rate(800, 50ms), 100, 200));
  CHECK(alone == 100ms);
  CHECK(p99(scenario::run(true, scenario::fifo_rate(800, 50ms), 100, 200)) == 2600ms);
  CHECK(p99(scenario::run(true, scenario::fair_rate(800, 50ms), 100, 200)) == 150ms);
}

TEST_CASE(
    "a noisy tenant's burst on an adaptive limit leaves the quiet tenants' p99 wait within "
    "2x under fair shares",
    "[fair_limit]") {
  const auto p99 = [](const scenario::waits& w) {
    return scenario::percentile(w.quiet, 99);
  };
  const nanoseconds alone = p99(scenario::run(false, scenario::fair_adaptive()));
  CHECK(alone == 100ms);
  CHECK(p99(scenario::run(true, scenario::fifo_adaptive())) == 1350ms);
  CHECK(p99(scenario::run(true, scenario::fair_adaptive())) == 150ms);
}

TEST_CASE(
    "while every tenant is backlogged a fair limit's grants follow the weights "
    "(Jain's index >= 0.99)",
    "[fair_limit]") {
  const std::vector<double> weight = scenario::weights();
  const auto check_shares = [&](const std::vector<double>& got) {
    double sum = 0, wsum = 0;
    for (std::size_t t = 0; t < 10; ++t) {
      sum += got[t];
      wsum += weight[t];
    }
    CHECK(scenario::jain(got) >= 0.99);
    for (std::size_t t = 0; t < 10; ++t) {
      INFO("tenant " << t << ": " << got[t] << " of " << sum);
      CHECK(std::abs(got[t] / sum - weight[t] / wsum) <= 0.05 * weight[t] / wsum);
    }
  };
  const auto one = [](int, int) -> std::size_t {
    return 1;
  };
  SECTION("requests per window") {
    check_shares(scenario::backlogged_units(
        scenario::weighted_fair<sluice::rate_limiter>(std::size_t{8}, 10ms), one));
  }
  SECTION("tokens per window, calls of 50 to 150 tokens") {
    const auto tokens = [](int t, int k) -> std::size_t {
      return 50 + static_cast<std::size_t>((k * 37 + t * 11) % 101);
    };
    check_shares(scenario::backlogged_units(
        scenario::weighted_fair<sluice::rate_limiter>(std::size_t{800}, 10ms), tokens));
  }
  SECTION("an adaptive limit") {
    check_shares(scenario::backlogged_units(
        scenario::weighted_fair<sluice::adaptive_limit>(scenario::adaptive_options()), one));
  }
}

// ---- property: seeded interleavings against a reference model ----------

namespace {

// What the calls saw: per key the calls granted in grant order, the grant
// instants and units (rate), the permits held at once (semaphore).
struct seen {
  std::size_t in_use = 0, most = 0, granted = 0, cancelled = 0;
  std::map<int, std::vector<int>> order;
  std::vector<std::pair<nanoseconds, std::size_t>> starts;
};

using fair_rate_int = sluice::fair_limit<sluice::rate_limiter, int>;
using fair_sem_int = sluice::fair_limit<sluice::semaphore, int>;

asio::awaitable<void> model_call(fair_sem_int& sem, int key, int id, nanoseconds hold,
                                 nanoseconds patience, seen& m) {
  bool holding = false;
  try {
    auto p = co_await sluice::with_timeout(patience, sem.scoped_acquire(key));
    holding = true;
    m.order[key].push_back(id);
    ++m.granted;
    m.most = std::max(m.most, ++m.in_use);
    if (sem.stats(key).in_use == 0) throw std::logic_error("a held permit is not counted");
    co_await sluice::sleep(hold);
    --m.in_use;
  } catch (const sluice::timeout_error&) {
    if (holding) throw;
    ++m.cancelled;
  }
}

asio::awaitable<void> model_start(fair_rate_int& r, virtual_loop& loop, int key, int id,
                                  std::size_t n, nanoseconds patience, seen& m) {
  try {
    co_await sluice::with_timeout(patience, r.acquire(key, n));
    m.order[key].push_back(id);
    m.starts.emplace_back(loop.now(), n);
    ++m.granted;
  } catch (const sluice::timeout_error&) {
    ++m.cancelled;
  }
}

// The reference: a sliding window never holds more than `quota` units.
std::size_t most_in_window(const std::vector<std::pair<nanoseconds, std::size_t>>& starts,
                           nanoseconds per) {
  std::size_t most = 0;
  for (const auto& [at, n] : starts) {
    std::size_t in = 0;
    for (const auto& [t, k] : starts)
      if (t <= at && t > at - per) in += k;
    most = std::max(most, in);
  }
  return most;
}

}  // namespace

TEST_CASE(
    "seeded interleavings of grants, cancellations and weight changes lose nothing "
    "through a fair limit",
    "[fair_limit]") {
  for (unsigned seed = 1; seed <= 100; ++seed) {
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    virtual_loop loop;
    const std::size_t cap = 1 + rng() % 4;
    const std::size_t quota = 1 + rng() % 10;
    const auto per = milliseconds(1 + rng() % 20);
    fair_sem_int sem{sluice::fair_options{.window = 1 + rng() % 20}, cap};
    fair_rate_int rate{quota, per};
    seen ms, mr;
    std::size_t calls = 0;
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
        for (int i = 0; i < 60; ++i) {
          const int key = static_cast<int>(rng() % 5);
          if (rng() % 4 == 0) {
            const double w = 0.25 * double(1 + rng() % 12);
            sem.set_weight(key, w);
            rate.set_weight(key, w);
          }
          const auto patience = milliseconds(rng() % 3 == 0 ? 1 + rng() % 40 : 100000);
          ++calls;
          g.spawn(model_call(sem, key, i, milliseconds(1 + rng() % 30), patience, ms));
          g.spawn(model_start(rate, loop, key, i, 1 + rng() % quota, patience, mr));
          if (rng() % 3 == 0) co_await sluice::sleep(milliseconds(rng() % 10));
        }
      });
    });
    for (seen* m : {&ms, &mr}) {
      CHECK(m->granted + m->cancelled == calls);
      for (auto& [k, ids] : m->order) CHECK(std::is_sorted(ids.begin(), ids.end()));  // FIFO
    }
    CHECK(ms.most <= cap);
    CHECK(most_in_window(mr.starts, per) <= quota);
    CHECK(sem.underlying().value() == cap);
    CHECK(sem.waiters() == 0);
    CHECK(rate.waiters() == 0);
    CHECK(rate.underlying().waiters() == 0);
    for (int k = 0; k < 5; ++k) {
      CHECK(sem.stats(k).in_use == 0);
      CHECK(sem.stats(k).waiting == 0);
      CHECK(rate.stats(k).waiting == 0);
    }
  }
}

// ---- threads and call policies -------------------------------------------

TEST_CASE("a fair limit works from any thread through strand_bound", "[fair_limit]") {
  asio::io_context ctx;
  sluice::strand_bound<sluice::fair_limit<sluice::semaphore, int>> sem{asio::make_strand(ctx), 2};
  sluice::strand_bound<sluice::fair_limit<sluice::rate_limiter, int>> rpm{asio::make_strand(ctx),
                                                                          1000, 1h};
  std::atomic<int> in_use{0}, most{0}, done{0};
  for (int i = 0; i < 40; ++i) {
    asio::co_spawn(
        asio::make_strand(ctx),
        [&, i]() -> asio::awaitable<void> {
          co_await rpm.acquire(i % 4, std::size_t{2});
          auto p = co_await sem.scoped_acquire(i % 4);
          const int now = ++in_use;
          sluice_test::raise_peak(most, now);
          co_await asio::post(asio::use_awaitable);
          --in_use;
          ++done;
        },
        asio::detached);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { ctx.run(); });
  for (auto& t : threads) t.join();
  CHECK(done == 40);
  CHECK(most <= 2);
  CHECK(sem.underlying().underlying().value() == 2);
  CHECK(!rpm.underlying().underlying().try_acquire(921));  // 80 of 1000 taken
  CHECK(rpm.underlying().underlying().try_acquire(920));
}

TEST_CASE("one key of a fair limit is a limit of its own inside a shed layer", "[fair_limit]") {
  virtual_loop loop;
  fair_sem sem{1};
  auto alice = sem.for_key("alice");
  auto p = sluice::policy(sluice::shed(alice, {.max_waiting = 1}));
  int ran = 0, shed = 0;
  auto call = [&]() -> asio::awaitable<void> {
    try {
      co_await p([&]() -> asio::awaitable<void> {
        ++ran;
        co_await sluice::sleep(10ms);
      });
    } catch (const sluice::overloaded_error&) {
      ++shed;
    }
  };
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
      for (int i = 0; i < 3; ++i) g.spawn(call());  // one runs, one waits, one is shed
      co_return;
    });
  });
  CHECK(ran == 2);
  CHECK(shed == 1);
  CHECK(loop.now() == 20ms);
  CHECK(sem.stats("alice").share == 1.0);
}
