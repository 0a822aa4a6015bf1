// SPDX-License-Identifier: BSL-1.0
// sluice::retry and sluice::retry_budget: DESIGN.md "Providers that push
// back", semantics 1. Every timing is exact, in virtual time.
#include <sluice/retry.hpp>

#include <sluice/gather.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/spawned.hpp>
#include <support/virtual_timers.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice_test::pending_timers;
using sluice_test::tasks_on_loop;
namespace latency = sluice::testing::latency;
using ns = std::chrono::nanoseconds;

namespace {

// A provider that refuses its first `failures` calls with `E`, recording
// when each attempt started (virtual time) and which object it threw.
struct flaky {
  std::size_t failures = 0;
  std::vector<ns> attempts;
  std::vector<const void*> thrown;

  template <class E = sluice::throttled_error>
  asio::awaitable<int> call() {
    attempts.push_back(sluice::now(co_await asio::this_coro::executor).time_since_epoch());
    if (attempts.size() <= failures) {
      try {
        throw E("attempt " + std::to_string(attempts.size()));
      } catch (const E& e) {
        thrown.push_back(&e);
        throw;
      }
    }
    co_return static_cast<int>(attempts.size());
  }
};

// An error with an identity and no hint.
struct numbered_error : std::runtime_error {
  explicit numbered_error(const std::string& what) : std::runtime_error(what) {}
};

// A provider error carrying a Retry-After hint, the way a user writes one.
struct http_429 : std::runtime_error, sluice::retry_after {
  http_429(const std::string& what, sluice::clock::duration d)
      : std::runtime_error(what), sluice::retry_after{d} {}
};

std::vector<ns> gaps(const std::vector<ns>& at) {
  std::vector<ns> g;
  for (std::size_t i = 1; i < at.size(); ++i) g.push_back(at[i] - at[i - 1]);
  return g;
}

// The attempt times of one retry call that fails `failures` times.
std::vector<ns> schedule(sluice::backoff p, std::size_t failures) {
  flaky f{failures, {}, {}};
  virtual_loop loop;
  try {
    loop.run([&]() -> asio::awaitable<int> {
      co_return co_await sluice::retry(p, [&] { return f.call(); });
    });
  } catch (const sluice::throttled_error&) {
  }
  return f.attempts;
}

}  // namespace

TEST_CASE("without jitter the waits are first * 2^k: 100, 200, 400 ms, then the value", "[retry]") {
  flaky f{3, {}, {}};
  virtual_loop loop;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry(
        sluice::backoff{.first = 100ms, .max = 30s, .attempts = 6, .jitter = sluice::no_jitter},
        [&] { return f.call(); });
  });
  CHECK(v == 4);
  CHECK(f.attempts == std::vector<ns>{0ms, 100ms, 300ms, 700ms});
  CHECK(loop.now() == 700ms);
}

TEST_CASE("the wait is capped at max", "[retry]") {
  const auto at = schedule({.first = 1s, .max = 3s, .attempts = 6, .jitter = sluice::no_jitter}, 5);
  CHECK(gaps(at) == std::vector<ns>{1s, 2s, 3s, 3s, 3s});
  CHECK(at.size() == 6);
}

TEST_CASE("full jitter: each wait in [0, base), the same on every run, another for another seed",
          "[retry]") {
  const sluice::backoff p{.first = 1s, .max = 8s, .attempts = 5, .jitter = sluice::full_jitter};
  const auto a = schedule(p, 10), b = schedule(p, 10);
  CHECK(a == b);  // reproducible under the test loop
  REQUIRE(a.size() == 5);
  const std::vector<ns> base{1s, 2s, 4s, 8s};
  const auto g = gaps(a);
  for (std::size_t k = 0; k < g.size(); ++k) {
    CHECK(g[k] >= 0s);
    CHECK(g[k] < base[k]);
  }
  CHECK(g != base);
  auto q = p;
  q.seed = 7;
  const auto c = schedule(q, 10), d = schedule(q, 10);
  CHECK(c == d);
  CHECK(c != a);
}

TEST_CASE("equal jitter: each wait in [base / 2, base)", "[retry]") {
  const auto g =
      gaps(schedule({.first = 1s, .max = 8s, .attempts = 5, .jitter = sluice::equal_jitter}, 10));
  const std::vector<ns> base{1s, 2s, 4s, 8s};
  REQUIRE(g.size() == 4);
  for (std::size_t k = 0; k < g.size(); ++k) {
    CHECK(g[k] >= base[k] / 2);
    CHECK(g[k] < base[k]);
  }
}

TEST_CASE("backoff::delay maps a draw onto the jitter's range", "[retry]") {
  sluice::backoff p{.first = 100ms, .max = 1s, .jitter = sluice::no_jitter};
  CHECK(p.delay(0, 0.5) == 100ms);
  CHECK(p.delay(3, 0.5) == 800ms);
  CHECK(p.delay(4, 0.5) == 1s);
  CHECK(p.delay(200, 0.5) == 1s);  // no overflow
  p.jitter = sluice::full_jitter;
  CHECK(p.delay(1, 0.5) == 100ms);
  CHECK(p.delay(1, 0.0) == 0ms);
  p.jitter = sluice::equal_jitter;
  CHECK(p.delay(1, 0.0) == 100ms);
  CHECK(p.delay(1, 0.5) == 150ms);
}

TEST_CASE("callers that fail together do not retry together", "[retry]") {
  std::vector<flaky> f(8, flaky{1, {}, {}});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> calls;
    for (auto& x : f)
      calls.push_back(sluice::retry({.first = 1s, .attempts = 2}, [&x] { return x.call(); }));
    co_await sluice::gather(std::move(calls));
  });
  std::vector<ns> second;
  for (auto& x : f) {
    REQUIRE(x.attempts.size() == 2);
    second.push_back(x.attempts[1]);
  }
  std::sort(second.begin(), second.end());
  CHECK(std::adjacent_find(second.begin(), second.end()) == second.end());
}

TEST_CASE("a retry_after hint wins over the backoff, exactly", "[retry]") {
  std::vector<ns> attempts;
  virtual_loop loop;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry({.first = 1ms, .attempts = 3, .jitter = sluice::no_jitter},
                                     [&]() -> asio::awaitable<int> {
                                       attempts.push_back(loop.now());
                                       if (attempts.size() == 1) throw http_429("429", 7s);
                                       if (attempts.size() == 2)
                                         throw http_429("429", -1s);  // reads as 0
                                       co_return 3;
                                     });
  });
  CHECK(v == 3);
  CHECK(attempts == std::vector<ns>{0s, 7s, 7s});
}

TEST_CASE("slow_service's throttles are retried at the instant the provider's window admits them",
          "[retry]") {
  // 2 starts per 10 s, 5 callers at t = 0: the provider's Retry-After says
  // when a start leaves the window, so each retry is admitted at once.
  slow_service svc(
      {.latency = latency::fixed(1s), .quota = {.calls_per_window = 2, .window = 10s}});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> calls;
    for (int i = 0; i < 5; ++i)
      calls.push_back(sluice::retry({.first = 1ms, .attempts = 10}, [&] { return svc.call(); }));
    co_await sluice::gather(std::move(calls));
  });
  CHECK(svc.completed() == 5);
  CHECK(svc.throttles() == 3 + 1);  // t = 0: three; t = 10 s: one of the two retrying
  std::vector<ns> ok;
  for (const auto& r : svc.timeline())
    if (r.result == sluice::testing::call_result::ok) ok.push_back(r.start);
  CHECK(ok == std::vector<ns>{0s, 0s, 10s, 10s, 20s});
  CHECK(loop.now() == 21s);
}

TEST_CASE("after the last attempt the last exception is rethrown unchanged", "[retry]") {
  flaky f{10, {}, {}};
  virtual_loop loop;
  const void* caught = nullptr;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::retry({.first = 1s,
                              .attempts = 4,
                              .jitter = sluice::no_jitter,
                              .retry_if =
                                  [](auto&&) {
                                    return true;
                                  }},
                             [&] { return f.call<numbered_error>(); });
    } catch (const numbered_error& e) {
      caught = &e;
      CHECK(std::string(e.what()) == "attempt 4");
    }
  });
  CHECK(f.attempts == std::vector<ns>{0s, 1s, 3s, 7s});
  REQUIRE(f.thrown.size() == 4);
  CHECK(caught == f.thrown.back());  // the same object, not a copy
  CHECK(loop.now() == 7s);
}

TEST_CASE("a non-retryable exception is rethrown at once", "[retry]") {
  flaky f{10, {}, {}};
  virtual_loop loop;
  CHECK_THROWS_AS(loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry({.first = 1s, .attempts = 4},
                                     [&] { return f.call<numbered_error>(); });
  }),
                  numbered_error);
  CHECK(f.attempts.size() == 1);
  CHECK(loop.now() == 0s);
}

TEST_CASE("max_elapsed: no wait that would end past it; the last error passes at once", "[retry]") {
  const auto at =
      schedule({.first = 1s, .attempts = 10, .max_elapsed = 5s, .jitter = sluice::no_jitter}, 10);
  CHECK(at == std::vector<ns>{0s, 1s, 3s});  // the next wait (4 s) would end at 7 s
  const auto exact =
      schedule({.first = 1s, .attempts = 10, .max_elapsed = 7s, .jitter = sluice::no_jitter}, 10);
  CHECK(exact == std::vector<ns>{0s, 1s, 3s, 7s});  // ending at the cap is allowed
}

TEST_CASE("cancelling the caller stops a sleeping retry at once, nothing left running", "[retry]") {
  flaky f{10, {}, {}};
  tasks_on_loop t;
  auto& task = t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::retry({.first = 10s, .attempts = 5, .jitter = sluice::no_jitter},
                           [&] { return f.call(); });
  });
  t.loop.run_for(3s);
  REQUIRE(pending_timers(t.loop) == 1);  // the retry's wait
  task.cancel();
  t.poll();
  CHECK(task.cancelled());
  CHECK(t.loop.now() == 3s);
  CHECK(pending_timers(t.loop) == 0);
  CHECK(f.attempts.size() == 1);
  t.loop.run_for(1min);
  CHECK(f.attempts.size() == 1);
}

TEST_CASE("a caller cancelled during an attempt is not retried; that attempt's error passes",
          "[retry]") {
  std::size_t attempts = 0;
  tasks_on_loop t;
  auto& task = t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::retry({.first = 1s, .attempts = 5}, [&]() -> asio::awaitable<void> {
      ++attempts;
      try {
        co_await sluice::sleep(10s);
      } catch (const sluice::system_error&) {
      }
      throw sluice::throttled_error("the provider said no while we were cancelled");
    });
  });
  t.loop.run_for(2s);
  task.cancel();
  t.loop.run_for(1min);
  REQUIRE(task.done);
  CHECK_THROWS_AS(task.rethrow(), sluice::throttled_error);
  CHECK(attempts == 1);
}

TEST_CASE("each attempt re-acquires the limits fn takes; none is held during the wait", "[retry]") {
  sluice::semaphore one{1};
  flaky f{1, {}, {}};
  ns other_got{-1};
  // Named lambdas: a coroutine lambda's captures live in the lambda object.
  auto retrying = [&]() -> asio::awaitable<void> {
    co_await sluice::retry({.first = 5s, .attempts = 2, .jitter = sluice::no_jitter},
                           [&]() -> asio::awaitable<int> {
                             auto p = co_await one.scoped_acquire();
                             co_await sluice::sleep(1s);
                             co_return co_await f.call();
                           });
  };
  auto other = [&]() -> asio::awaitable<void> {
    auto p = co_await one.scoped_acquire();
    other_got = sluice::now(co_await asio::this_coro::executor).time_since_epoch();
    co_await sluice::sleep(2s);
  };
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> work;
    work.push_back(retrying());
    work.push_back(other());
    co_await sluice::gather(std::move(work));
  });
  CHECK(other_got == 1s);  // while the retry waits (1 s .. 6 s), not after it
  CHECK(f.attempts == std::vector<ns>{1s, 7s});
}

TEST_CASE("a per-attempt timeout is retried; the caller's deadline is not", "[retry]") {
  std::size_t attempts = 0;
  virtual_loop loop;
  auto slow_then_fast = [&]() -> asio::awaitable<int> {
    ++attempts;
    co_await sluice::sleep(attempts < 3 ? 10s : 1s);
    co_return 42;
  };
  const int v = loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry({.first = 1s, .attempts = 5, .jitter = sluice::no_jitter},
                                     [&] { return sluice::with_timeout(2s, slow_then_fast()); });
  });
  CHECK(v == 42);
  CHECK(attempts == 3);
  CHECK(loop.now() == 2s + 1s + 2s + 2s + 1s);

  attempts = 0;
  virtual_loop loop2;
  CHECK_THROWS_AS(loop2.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::with_timeout(
        4s, sluice::retry({.first = 1s, .attempts = 5, .jitter = sluice::no_jitter},
                          [&] { return sluice::with_timeout(2s, slow_then_fast()); }));
  }),
                  sluice::timeout_error);
  CHECK(loop2.now() == 4s);  // attempt 2 (from 3 s) cancelled by the deadline, not retried
  CHECK(attempts == 2);
}

TEST_CASE("retryable: throttles, timeouts and hinted errors; not cancellation nor the rest",
          "[retry]") {
  using sluice::retryable;
  CHECK(retryable(std::make_exception_ptr(sluice::throttled_error("429"))));
  CHECK(retryable(std::make_exception_ptr(sluice::timeout_error(1s))));
  CHECK(retryable(std::make_exception_ptr(http_429("429", 1s))));
  CHECK(retryable(std::make_exception_ptr(sluice::testing::throttled_error("429", 0, "k", 2s))));
  CHECK(retryable(
      std::make_exception_ptr(sluice::system_error(make_error_code(asio::error::timed_out)))));
  CHECK_FALSE(retryable(std::make_exception_ptr(
      sluice::system_error(make_error_code(asio::error::operation_aborted)))));
  CHECK_FALSE(retryable(std::make_exception_ptr(std::runtime_error("bad request"))));
  CHECK_FALSE(retryable(std::make_exception_ptr(sluice::testing::service_error("500", 0, "k"))));
  CHECK_FALSE(retryable(std::make_exception_ptr(42)));
  CHECK_FALSE(retryable(nullptr));
  CHECK(sluice::retry_after_of(std::make_exception_ptr(http_429("429", 3s))) == 3s);
  CHECK(sluice::retry_after_of(std::make_exception_ptr(http_429("429", -3s))) == 0s);
  CHECK_FALSE(sluice::retry_after_of(std::make_exception_ptr(sluice::throttled_error("429"))));
}

TEST_CASE("retry returns move-only values and void", "[retry]") {
  virtual_loop loop;
  auto p = loop.run([&]() -> asio::awaitable<std::unique_ptr<int>> {
    co_return co_await sluice::retry(
        {}, []() -> asio::awaitable<std::unique_ptr<int>> { co_return std::make_unique<int>(5); });
  });
  CHECK(*p == 5);
  int calls = 0;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::retry({.first = 1s}, [&]() -> asio::awaitable<void> {
      if (++calls < 2) throw sluice::throttled_error("again");
      co_return;
    });
  });
  CHECK(calls == 2);
}

TEST_CASE("bad policies throw invalid_argument at the call, before any attempt", "[retry]") {
  int calls = 0;
  auto fn = [&]() -> asio::awaitable<void> {
    ++calls;
    co_return;
  };
  CHECK_THROWS_AS((void)sluice::retry({.attempts = 0}, fn), std::invalid_argument);
  CHECK_THROWS_AS((void)sluice::retry({.first = -1s}, fn), std::invalid_argument);
  CHECK_THROWS_AS((void)sluice::retry({.max = -1s}, fn), std::invalid_argument);
  CHECK_THROWS_AS((void)sluice::retry({.max_elapsed = -1s}, fn), std::invalid_argument);
  CHECK_THROWS_AS((void)sluice::retry({.retry_if = {}}, fn), std::invalid_argument);
  CHECK_THROWS_AS(sluice::retry_budget({.ratio = -0.1}), std::invalid_argument);
  CHECK_THROWS_AS(sluice::retry_budget({.ratio = std::numeric_limits<double>::infinity()}),
                  std::invalid_argument);
  CHECK_THROWS_AS(sluice::retry_budget({.per = 0s}), std::invalid_argument);
  CHECK(calls == 0);
}

TEST_CASE("a retry budget caps retries at its ratio of first attempts in the window", "[retry]") {
  // 4 callers fail at once; ratio 0.5 allows 2 retries; the two retrying fail
  // again and are refused too (2 retries already in the window).
  sluice::retry_budget budget{{.ratio = 0.5, .per = 10s}};
  std::vector<flaky> f(4, flaky{10, {}, {}});
  virtual_loop loop;
  const auto results = loop.run([&]() -> asio::awaitable<std::vector<sluice::outcome<int>>> {
    std::vector<asio::awaitable<int>> calls;
    for (auto& x : f)
      calls.push_back(sluice::retry(
          {.first = 100ms, .attempts = 5, .jitter = sluice::no_jitter, .budget = &budget},
          [&x] { return x.call(); }));
    co_return co_await sluice::gather(std::move(calls), sluice::return_exceptions);
  });
  std::size_t attempts = 0, failed = 0;
  for (auto& x : f) attempts += x.attempts.size();
  for (auto& r : results) failed += r ? 0 : 1;
  CHECK(attempts == 4 + 2);
  CHECK(failed == 4);
  CHECK(budget.first_attempts() == 4);
  CHECK(budget.retries() == 2);
  CHECK(budget.refused() == 4);
  CHECK(loop.now() == 100ms);  // the refused errors passed at once
}

TEST_CASE("a retry budget's window slides; min_retries are always allowed", "[retry]") {
  sluice::retry_budget budget{{.ratio = 0.0, .per = 10s, .min_retries = 1}};
  flaky f{100, {}, {}};
  virtual_loop loop;
  auto one = [&]() -> asio::awaitable<void> {
    try {
      co_await sluice::retry(
          {.first = 1s, .attempts = 3, .jitter = sluice::no_jitter, .budget = &budget},
          [&] { return f.call(); });
    } catch (const sluice::throttled_error&) {
    }
  };
  loop.run([&]() -> asio::awaitable<void> {
    co_await one();  // t 0: fails, retry at 1 s (the one allowed), fails, refused
    co_await sluice::sleep(8s);
    co_await one();  // t 9: the retry at 0 s still counts (until 10 s): refused
    co_await sluice::sleep(2s);
    co_await one();  // t 11: it has left the window: one retry again
  });
  CHECK(f.attempts == std::vector<ns>{0s, 1s, 9s, 11s, 12s});
  CHECK(budget.refused() == 3);
}

TEST_CASE("a sleeping retry cancelled gives its place in the budget back", "[retry]") {
  sluice::retry_budget budget{{.ratio = 0.0, .per = 1min, .min_retries = 1}};
  flaky f{100, {}, {}};
  tasks_on_loop t;
  auto& first = t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::retry(
        {.first = 10s, .attempts = 2, .jitter = sluice::no_jitter, .budget = &budget},
        [&] { return f.call(); });
  });
  t.loop.run_for(1s);
  CHECK(budget.retries() == 1);
  first.cancel();
  t.poll();
  CHECK(first.cancelled());
  CHECK(budget.retries() == 0);
  auto& second = t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::retry(
        {.first = 10s, .attempts = 2, .jitter = sluice::no_jitter, .budget = &budget},
        [&] { return f.call(); });
  });
  t.loop.run_for(1min);
  CHECK(second.done);
  CHECK(f.attempts == std::vector<ns>{0s, 1s, 11s});  // the second caller got its retry
  CHECK(budget.refused() == 0);
}

TEST_CASE("on_retry is called once per retry with the failed attempt, its error and the wait",
          "[retry]") {
  struct call {
    std::size_t attempt;
    const void* error;
    ns delay;
    ns at;
  };
  std::vector<call> calls;
  flaky f{3, {}, {}};
  virtual_loop loop;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    const auto ex = co_await asio::this_coro::executor;
    co_return co_await sluice::retry(
        {.first = 100ms,
         .attempts = 6,
         .jitter = sluice::no_jitter,
         .on_retry =
             [&](std::size_t attempt, const std::exception_ptr& e, sluice::clock::duration d) {
               const void* thrown = nullptr;
               try {
                 std::rethrow_exception(e);
               } catch (const sluice::throttled_error& x) {
                 thrown = &x;
               }
               calls.push_back({attempt, thrown, d, sluice::now(ex).time_since_epoch()});
             }},
        [&] { return f.call(); });
  });
  CHECK(v == 4);
  REQUIRE(calls.size() == 3);  // three retries; the fourth attempt succeeded
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(calls[i].attempt == i + 1);
    CHECK(calls[i].error == f.thrown[i]);  // the attempt's own exception
    CHECK(calls[i].at == f.attempts[i]);   // before the wait
  }
  CHECK(calls[0].delay == 100ms);
  CHECK(calls[1].delay == 200ms);
  CHECK(calls[2].delay == 400ms);
}

TEST_CASE("on_retry is not called when no retry follows; a hint is the delay it sees", "[retry]") {
  std::vector<ns> delays;
  auto hook = [&](std::size_t, const std::exception_ptr&, sluice::clock::duration d) {
    delays.push_back(d);
  };
  virtual_loop loop;
  // A hinted error is retried after its hint; the last attempt's error is not.
  std::size_t n = 0;
  CHECK_THROWS_AS(loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::retry({.first = 1s, .attempts = 2, .on_retry = hook},
                           [&]() -> asio::awaitable<void> {
                             ++n;
                             throw http_429("slow down", 7s);
                             co_return;
                           });
  }),
                  http_429);
  CHECK(n == 2);
  CHECK(delays == std::vector<ns>{7s});
  // A non-retryable error, and a retry the budget refuses: no call.
  sluice::retry_budget budget{{.ratio = 0.0, .per = 1min}};
  flaky plain{10, {}, {}}, refused{10, {}, {}};
  CHECK_THROWS_AS(loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry({.attempts = 3, .on_retry = hook},
                                     [&] { return plain.call<numbered_error>(); });
  }),
                  numbered_error);
  CHECK_THROWS_AS(loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry({.attempts = 3, .budget = &budget, .on_retry = hook},
                                     [&] { return refused.call(); });
  }),
                  sluice::throttled_error);
  CHECK(delays.size() == 1);
  CHECK(budget.refused() == 1);
}

TEST_CASE("an exception from on_retry ends the call: no wait, no attempt, the budget place back",
          "[retry]") {
  sluice::retry_budget budget{{.ratio = 0.0, .per = 1min, .min_retries = 1}};
  flaky f{10, {}, {}};
  virtual_loop loop;
  CHECK_THROWS_WITH(loop.run([&]() -> asio::awaitable<int> {
    co_return co_await sluice::retry(
        {.first = 1s,
         .attempts = 3,
         .budget = &budget,
         .on_retry =
             [](std::size_t, const std::exception_ptr&, sluice::clock::duration) {
               throw std::runtime_error("logger down");
             }},
        [&] { return f.call(); });
  }),
                    "logger down");
  CHECK(f.attempts.size() == 1);
  CHECK(loop.now() == 0s);
  CHECK(budget.retries() == 0);
}

TEST_CASE("retries() counts the window's retries, retried() every retry since construction",
          "[retry]") {
  // The trial's reading: 12 retries over two minutes, then retries() == 1.
  sluice::retry_budget budget{{.ratio = 1.0, .per = 10s}};
  flaky f{0, {}, {}};
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 12; ++i) {
      f.failures = f.attempts.size() + 1;  // this call's first attempt fails, its retry succeeds
      co_await sluice::retry(
          {.first = 1s, .attempts = 2, .jitter = sluice::no_jitter, .budget = &budget},
          [&] { return f.call(); });
      co_await sluice::sleep(9s);  // one call every 10 s
    }
    CHECK(budget.retries() == 1);  // in the window ending now: the last call's retry
    CHECK(budget.retried() == 12);
    co_await sluice::sleep(1min);
    f.failures = 0;
    co_await sluice::retry({.budget = &budget}, [&] { return f.call(); });
  });
  CHECK(f.attempts.size() == 25);
  CHECK(budget.first_attempts() == 1);
  CHECK(budget.retries() == 0);  // the window has moved past them all
  CHECK(budget.retried() == 12);
  CHECK(budget.refused() == 0);
}

TEST_CASE("a retry_if that throws ends the call with callback_error, the attempt's error nested",
          "[retry]") {
  flaky f{10, {}, {}};
  virtual_loop loop;
  const void* nested = nullptr;
  std::string what;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::retry({.attempts = 3,
                              .retry_if = [](const std::exception_ptr&) -> bool {
                                throw std::logic_error("classifier bug");
                              }},
                             [&] { return f.call(); });
    } catch (const sluice::callback_error& e) {
      what = e.what();
      CHECK_THROWS_WITH(std::rethrow_exception(e.callback_exception()), "classifier bug");
      try {
        std::rethrow_if_nested(e);
      } catch (const sluice::throttled_error& original) {
        nested = &original;
      }
    }
  });
  CHECK(what == "sluice::retry: retry_if threw: classifier bug");
  REQUIRE(f.thrown.size() == 1);
  CHECK(nested == f.thrown[0]);  // the attempt's own exception, not a copy
  CHECK(f.attempts.size() == 1);
}

TEST_CASE(
    "a caller cancelled at the instant its backoff wait ends is not retried, gives its place back",
    "[retry]") {
  // The canceller's timer is armed first for the same instant, so it runs
  // after the retry's wait has fired and before the retry resumes.
  sluice::retry_budget budget{{.ratio = 0.0, .per = 1min, .min_retries = 1}};
  flaky f{10, {}, {}};
  tasks_on_loop t;
  sluice_test::task* caller = nullptr;
  t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::sleep(1s);
    caller->cancel();
  });
  caller = &t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::retry(
        {.first = 1s, .attempts = 3, .jitter = sluice::no_jitter, .budget = &budget},
        [&] { return f.call(); });
  });
  t.loop.run_for(1min);
  REQUIRE(caller->done);
  CHECK(caller->cancelled());
  CHECK(f.attempts == std::vector<ns>{0s});  // no attempt at 1 s
  CHECK(budget.retries() == 0);              // the retry never ran: its place is back
  CHECK(budget.retried() == 0);
}

TEST_CASE("a retry_after of the clock's range makes no attempt at the end of virtual time",
          "[retry]") {
  virtual_loop loop;
  std::size_t attempts = 0;
  CHECK_THROWS_AS(loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::retry({.attempts = 3}, [&]() -> asio::awaitable<void> {
      ++attempts;
      throw http_429("429", sluice::clock::duration::max());
      co_return;
    });
  }),
                  sluice::testing::deadlock_error);
  CHECK(attempts == 1);
  CHECK(loop.now() == 0s);
}

TEST_CASE("backoff fields take any duration and saturate it instead of overflowing", "[retry]") {
  virtual_loop loop;
  std::size_t attempts = 0;
  // hours::max() in nanoseconds overflows: before, a negative `first` was refused.
  CHECK_THROWS_AS(loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::retry({.first = std::chrono::hours::max(),
                            .max = std::chrono::hours::max(),
                            .attempts = 3,
                            .jitter = sluice::no_jitter},
                           [&]() -> asio::awaitable<void> {
                             ++attempts;
                             throw sluice::throttled_error("429");
                             co_return;
                           });
  }),
                  sluice::testing::deadlock_error);
  CHECK(attempts == 1);
  const sluice::backoff b{.first = std::chrono::duration<double>(0.25),
                          .max = std::chrono::duration<double>(1e300)};
  CHECK(b.first == 250ms);
  CHECK(b.max == sluice::clock::duration::max());
}
