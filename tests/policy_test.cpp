// SPDX-License-Identifier: BSL-1.0
// Call policies: DESIGN.md "Call policies". The composition, shedding, the
// circuit breaker and provider-side accounting (linger), each state machine
// pinned in virtual time; one policy shared by sessions on strands of a
// 4-thread io_context.
#include <sluice/breaker.hpp>
#include <sluice/hedge.hpp>
#include <sluice/limits.hpp>
#include <sluice/policy.hpp>
#include <sluice/prometheus.hpp>
#include <sluice/retry_layer.hpp>
#include <sluice/shed.hpp>
#include <sluice/timeout_layer.hpp>

#include <sluice/adaptive_limit.hpp>
#include <sluice/gather.hpp>
#include <sluice/keyed_rate_limiter.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/strand_bound.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/token_bucket.hpp>

#include <support/asio.hpp>
#include <support/peak.hpp>

#include <examples/support/policy_scenarios.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// g++ 12 at -O1 (the TSan build) reports -Wmismatched-new-delete for the
// frames of the coroutine lambdas that hold a whole policy: a false positive
// (Asio's awaitable frames pair their own operator new and delete), as
// examples/llm_batch.cpp notes.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using ns = std::chrono::nanoseconds;

namespace {

ns now_ns(const asio::any_io_executor& ex) {
  return sluice::now(ex).time_since_epoch();
}

asio::awaitable<ns> vnow() {
  co_return now_ns(co_await asio::this_coro::executor);
}

// A layer that records when the call passed it, by name.
struct mark {
  std::string name;
  std::vector<std::string>* log;
  template <class Next>
  auto call(Next next) -> std::invoke_result_t<Next&> {
    log->push_back(name);
    co_return co_await next();
  }
};

// A provider call that takes `d` and then returns 1 or throws `E`.
template <class E = void>
asio::awaitable<int> work(ns d) {
  co_await sluice::sleep(d);
  if constexpr (!std::is_void_v<E>) throw E("provider failed");
  co_return 1;
}

// A call through `p` that fails after `d` (a provider error, caught here).
template <class P>
asio::awaitable<void> failing(P& p, ns d) {
  try {
    co_await p([d] { return work<std::runtime_error>(d); });
  } catch (const std::runtime_error&) {
  }
}

// What one call of a policy ended with, and when.
struct ended {
  ns at{};
  std::exception_ptr error;
  template <class E>
  bool is() const {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const E&) {
      return true;
    } catch (...) {
    }
    return false;
  }
};

// Runs `call()` after `delay`, recording its end.
template <class F>
asio::awaitable<void> at(ns delay, F call, ended& out) {
  co_await sluice::sleep(delay);
  try {
    co_await call();
  } catch (...) {
    out.error = std::current_exception();
  }
  out.at = co_await vnow();
}

// Four callers of `call` (each holding a place of `cap`, a limit of 1 with
// room for 2 waiters, for 1 s) at 0 s: three run one after another, the
// fourth, which saw 2 waiting, is shed at once. Returns how each ended.
template <class Limit, class Call>
std::vector<ended> three_run_one_shed(virtual_loop& loop, Limit& cap, Call call) {
  std::vector<ended> e(4);
  std::size_t waiters_at_shed = 0;
  loop.run([&]() -> asio::awaitable<void> {
    auto fourth = [&]() -> asio::awaitable<void> {
      waiters_at_shed = cap.waiters();
      co_await call();
    };
    co_await sluice::gather(at(0s, call, e[0]), at(0s, call, e[1]), at(0s, call, e[2]),
                            at(0s, fourth, e[3]));
  });
  CHECK(waiters_at_shed == 2);
  CHECK(e[0].at == 1s);
  CHECK(e[1].at == 2s);
  CHECK(e[2].at == 3s);
  CHECK(e[3].at == 0s);  // at once
  return e;
}

}  // namespace

// ---- composition ------------------------------------------------------------

TEST_CASE("a policy runs its layers in the user's order, outermost first, once per call",
          "[policy]") {
  std::vector<std::string> log;
  auto p = sluice::policy(mark{"outer", &log}, mark{"middle", &log}, mark{"inner", &log});
  virtual_loop loop;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    co_return co_await p([&]() -> asio::awaitable<int> {
      log.push_back("call");
      co_return 7;
    });
  });
  CHECK(v == 7);
  CHECK(log == std::vector<std::string>{"outer", "middle", "inner", "call"});
}

TEST_CASE("a retry outside the limit re-queues; inside it holds the permit through the backoff",
          "[policy]") {
  const sluice::backoff b{.first = 1s, .attempts = 2, .jitter = sluice::no_jitter};
  // A fails its first attempt (1 s, throttled), B waits for the one permit.
  const auto run = [&](bool retry_outside) {
    sluice::semaphore cap{1};
    ended a, b_end;
    ns b_start{};
    int attempts = 0;
    auto first_fails = [&]() -> asio::awaitable<int> {
      co_await sluice::sleep(1s);
      if (++attempts == 1) throw sluice::throttled_error("busy");
      co_return 1;
    };
    auto b_call = [&]() -> asio::awaitable<int> {
      b_start = co_await vnow();
      co_return co_await work(1s);
    };
    virtual_loop loop;
    loop.run([&]() -> asio::awaitable<void> {
      if (retry_outside) {
        auto p = sluice::policy(sluice::retry_layer(b), sluice::limits(cap));
        co_await sluice::gather(at(
                                    0s, [&] { return p(first_fails); }, a),
                                at(
                                    0s, [&] { return p(b_call); }, b_end));
      } else {
        auto p = sluice::policy(sluice::limits(cap), sluice::retry_layer(b));
        co_await sluice::gather(at(
                                    0s, [&] { return p(first_fails); }, a),
                                at(
                                    0s, [&] { return p(b_call); }, b_end));
      }
    });
    CHECK(!a.error);
    return std::pair{b_start, a.at};
  };
  // Outside: A's retry waits 1 s without the permit; B takes it at 1 s, A gets
  // it back at 2 s.
  CHECK(run(true) == std::pair{ns(1s), ns(3s)});
  // Inside: A keeps the permit through its backoff; B starts only at 3 s.
  CHECK(run(false) == std::pair{ns(3s), ns(3s)});
}

TEST_CASE("retry_layer passes the backoff's on_retry hook on and counts retries", "[policy]") {
  std::vector<std::pair<std::size_t, ns>> seen;
  auto p = sluice::policy(sluice::retry_layer(
      {.first = 1s,
       .attempts = 3,
       .jitter = sluice::no_jitter,
       .on_retry = [&](std::size_t attempt, const std::exception_ptr&, sluice::clock::duration d) {
         seen.emplace_back(attempt, d);
       }}));
  virtual_loop loop;
  int attempts = 0;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    co_return co_await p([&]() -> asio::awaitable<int> {
      if (++attempts < 3) throw sluice::throttled_error("busy");
      co_return attempts;
    });
  });
  CHECK(v == 3);
  CHECK(seen == std::vector<std::pair<std::size_t, ns>>{{1, 1s}, {2, 2s}});
  CHECK(p.get<0>().retries() == 2);
  CHECK(loop.now() == 3s);
}

TEST_CASE("a call's weight takes that many units of each weighted budget, 1 without a weight",
          "[policy]") {
  virtual_loop loop;
  sluice::semaphore cap{8};
  sluice::rate_limiter tpm{loop.get_executor(), 100, 1min};
  auto p = sluice::policy(sluice::limits(cap, sluice::weighted(tpm)));
  std::vector<ended> e(4);
  loop.run([&]() -> asio::awaitable<void> {
    auto call = [&](std::size_t n) {
      return [&, n] {
        return p([] { return work(0s); }, sluice::weight(n));
      };
    };
    auto unweighted = [&] {
      return p([] { return work(0s); });
    };
    // 60 at 0 s; 50 does not fit until the 60 leave the window at 60 s, and
    // 39 and the unweighted call (1) wait behind it in acquire_all's FIFO.
    co_await sluice::gather(at(0s, call(60), e[0]), at(0s, call(50), e[1]), at(0s, call(39), e[2]),
                            at(0s, unweighted, e[3]));
  });
  CHECK(e[0].at == 0s);
  CHECK(e[1].at == 60s);
  CHECK(e[2].at == 60s);
  CHECK(e[3].at == 60s);
  CHECK(tpm.stats().in_use == 90);
  CHECK(cap.value() == 8);
  CHECK(tpm.stats().acquired == 4);
  // A weight the limiter could never grant: invalid_argument, nothing taken.
  ended big;
  loop.run([&]() -> asio::awaitable<void> {
    co_await at(
        0s, [&] { return p([] { return work(0s); }, sluice::weight(101)); }, big);
  });
  CHECK(big.is<std::invalid_argument>());
  CHECK(tpm.stats().acquired == 4);
  CHECK_THROWS_AS(sluice::weight(-1), std::invalid_argument);
}

TEST_CASE("a retry outside the weighted limits spends the call's weight again", "[policy]") {
  virtual_loop loop;
  sluice::rate_limiter tpm{loop.get_executor(), 100, 1min};
  auto p = sluice::policy(sluice::retry_layer({.first = 0s, .attempts = 2}),
                          sluice::limits(sluice::weighted(tpm)));
  int attempts = 0;
  const int v = loop.run([&]() -> asio::awaitable<int> {
    co_return co_await p(
        [&]() -> asio::awaitable<int> {
          if (++attempts == 1) throw sluice::throttled_error("busy");
          co_return attempts;
        },
        sluice::weight(60));
  });
  // The first attempt's 60 units stay in the window: the retry's 60 fit only
  // when they leave it.
  CHECK(v == 2);
  CHECK(loop.now() == 60s);
  CHECK(tpm.stats().acquired == 2);
}

TEST_CASE("async_call completes a callback with the result or the exception", "[policy]") {
  auto p = sluice::policy(sluice::timeout(1s));
  virtual_loop loop;
  int value = 0;
  std::exception_ptr error;
  p.async_call(
      loop.get_executor(), [] { return work(2s); },
      [&](std::exception_ptr e, int v) {
        error = e;
        value = v;
      });
  loop.run_for(3s);
  CHECK(value == 0);
  REQUIRE(error);
  CHECK_THROWS_AS(std::rethrow_exception(error), sluice::timeout_error);
  CHECK(p.get<0>().timeouts() == 1);
}

// ---- shedding ---------------------------------------------------------------

TEST_CASE("shed: past max_waiting a call fails at once with overloaded_error, nothing queued",
          "[policy][shed]") {
  sluice::semaphore cap{1};
  auto p = sluice::policy(sluice::shed(cap, {.max_waiting = 2, .retry_after = 3s}));
  virtual_loop loop;
  const auto e = three_run_one_shed(
      loop, cap, [&]() -> asio::awaitable<void> { co_await p([] { return work(1s); }); });
  REQUIRE(e[3].is<sluice::overloaded_error>());
  try {
    std::rethrow_exception(e[3].error);
  } catch (const sluice::overloaded_error& x) {
    CHECK(x.after == 3s);
    CHECK(sluice::retryable(e[3].error));
  }
  const auto s = p.get<0>().stats();
  CHECK(s.admitted == 3);
  CHECK(s.shed == 1);
  CHECK(s.waiting == 0);
  CHECK(cap.value() == 1);
}

TEST_CASE("shed: max_waiting 0 passes exactly the calls the limit grants at once",
          "[policy][shed]") {
  sluice::semaphore cap{2};
  auto p = sluice::policy(sluice::shed(cap, {.max_waiting = 0}));
  std::vector<ended> e(3);
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    auto call = [&] {
      return p([] { return work(1s); });
    };
    co_await sluice::gather(at(0s, call, e[0]), at(0s, call, e[1]), at(0s, call, e[2]));
  });
  CHECK(!e[0].error);
  CHECK(!e[1].error);
  CHECK(e[2].is<sluice::overloaded_error>());
  CHECK(e[2].at == 0s);
  CHECK(p.get<0>().stats().shed == 1);
}

TEST_CASE("shed: a wait that lasts max_wait is given up with overloaded_error, holding nothing",
          "[policy][shed]") {
  sluice::semaphore cap{1};
  auto p = sluice::policy(sluice::shed(cap, {.max_wait = 500ms}));
  std::vector<ended> e(2);
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    auto call = [&] {
      return p([] { return work(1s); });
    };
    co_await sluice::gather(at(0s, call, e[0]), at(0s, call, e[1]));
  });
  CHECK(e[0].at == 1s);
  CHECK(!e[0].error);
  CHECK(e[1].at == 500ms);
  CHECK(e[1].is<sluice::overloaded_error>());
  const auto s = p.get<0>().stats();
  CHECK(s.shed_waiting == 1);
  CHECK(s.admitted == 1);
  CHECK(cap.value() == 1);
  CHECK(cap.waiters() == 0);
}

TEST_CASE("shed wraps a rate limiter: starts over the quota wait, one past the bound is shed",
          "[policy][shed]") {
  virtual_loop loop;
  sluice::rate_limiter rps{loop.get_executor(), 1, 1s};
  auto p = sluice::policy(sluice::shed(rps, {.max_waiting = 1}));
  std::vector<ended> e(3);
  loop.run([&]() -> asio::awaitable<void> {
    auto call = [&] {
      return p([] { return work(0s); });
    };
    co_await sluice::gather(at(0s, call, e[0]), at(0s, call, e[1]), at(0s, call, e[2]));
  });
  CHECK(e[0].at == 0s);
  CHECK(e[1].at == 1s);
  CHECK(!e[1].error);
  CHECK(e[2].at == 0s);
  CHECK(e[2].is<sluice::overloaded_error>());
}

TEST_CASE("shed wraps a strand_bound limit: the try on the strand, then the bound",
          "[policy][shed]") {
  virtual_loop loop;
  sluice::strand_bound<sluice::semaphore> cap{asio::make_strand(loop.get_executor()), 1};
  auto p = sluice::policy(sluice::shed(cap, {.max_waiting = 1}));
  std::vector<ended> e(3);
  loop.run([&]() -> asio::awaitable<void> {
    auto call = [&] {
      return p([] { return work(1s); });
    };
    co_await sluice::gather(at(0s, call, e[0]), at(0s, call, e[1]), at(0s, call, e[2]));
  });
  CHECK(e[0].at == 1s);
  CHECK(e[1].at == 2s);
  CHECK(!e[1].error);
  CHECK(e[2].at == 0s);
  CHECK(e[2].is<sluice::overloaded_error>());
  CHECK(p.get<0>().stats().admitted == 2);
}

// ---- shed_options of the limits themselves -----------------------------------

namespace {

// The error a task ended with, if it was a shed: its Retry-After.
std::optional<ns> shed_after(const ended& e) {
  try {
    if (e.error) std::rethrow_exception(e.error);
  } catch (const sluice::overloaded_error& x) {
    return ns(x.after);
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("semaphore{ex, n, {.max_waiting}}: one waiter past the bound is shed at once",
          "[policy][shed]") {
  virtual_loop loop;
  sluice::semaphore cap{loop.get_executor(), 1, {.max_waiting = 2, .retry_after = 3s}};
  const auto e = three_run_one_shed(loop, cap, [&]() -> asio::awaitable<void> {
    auto p = co_await cap.scoped_acquire();
    co_await sluice::sleep(1s);
  });
  CHECK(shed_after(e[3]) == ns(3s));
  const auto s = cap.stats();
  CHECK(s.shed == 1);
  CHECK(s.acquired == 3);
  CHECK(s.cancelled == 0);
  CHECK(cap.value() == 1);
  CHECK(cap.max_waiters() == 2);  // the shed caller never queued
}

TEST_CASE("bounded_semaphore{.max_wait}: a waiter leaves at its deadline, the next keeps its turn",
          "[policy][shed]") {
  virtual_loop loop;
  sluice::bounded_semaphore cap{loop.get_executor(), 1, {.max_wait = 1500ms}};
  std::vector<ended> e(4);
  loop.run([&]() -> asio::awaitable<void> {
    auto hold = [&](ns d) {
      return [&, d]() -> asio::awaitable<void> {
        co_await cap.acquire();
        co_await sluice::sleep(d);
        cap.release();
      };
    };
    // 0 holds 2 s; 1 (from 0 s) reaches 1.5 s first and leaves; 2 (from
    // 1 s, deadline 2.5 s) is granted at 2 s; 3 (from 1.2 s) leaves at 2.7 s.
    co_await sluice::gather(at(0s, hold(2s), e[0]), at(0s, hold(1s), e[1]), at(1s, hold(1s), e[2]),
                            at(1200ms, hold(1s), e[3]));
  });
  CHECK(e[0].at == 2s);
  CHECK(e[1].at == 1500ms);
  CHECK(shed_after(e[1]) == ns(1s));  // the default Retry-After
  CHECK(e[2].at == 3s);
  CHECK(!e[2].error);
  CHECK(e[3].at == 2700ms);
  CHECK(e[3].is<sluice::overloaded_error>());
  CHECK(cap.stats().shed == 2);
  CHECK(cap.value() == 1);
  CHECK(cap.waiters() == 0);
}

TEST_CASE("a semaphore's max_wait serves a loop per batch, one dying with a waiter queued",
          "[policy][shed][lifetime]") {
  // The wait bound's timer runs on the clock of the waiter it bounds: a loop
  // destroyed with a waiter queued takes the waiter and that timer with it,
  // and the next loop's waiter is shed at its own deadline (ASan: nothing of
  // the dead loop is read).
  sluice::semaphore cap{asio::any_io_executor{}, 1, {.max_wait = 1s}};
  auto hold = [&](ns d) {
    return [&, d]() -> asio::awaitable<void> {
      auto p = co_await cap.scoped_acquire();
      co_await sluice::sleep(d);
    };
  };
  {
    auto long_hold = hold(1h);  // outlives the loop and its coroutines
    virtual_loop loop;
    asio::co_spawn(loop.get_executor(), long_hold(), asio::detached);
    asio::co_spawn(loop.get_executor(), long_hold(), asio::detached);  // queued, deadline 1 s
    loop.run_for(500ms);
    CHECK(cap.waiters() == 1);
  }
  CHECK(cap.waiters() == 0);
  CHECK(cap.value() == 1);
  virtual_loop loop;
  std::vector<ended> e(2);
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::gather(at(0s, hold(2s), e[0]), at(0s, hold(2s), e[1]));
  });
  CHECK(e[0].at == 2s);
  CHECK(!e[0].error);
  CHECK(e[1].at == 1s);
  CHECK(e[1].is<sluice::overloaded_error>());
  CHECK(cap.stats().shed == 1);
  CHECK(cap.value() == 1);
}

TEST_CASE("a limit's shed bound: pre-cancelled callers get operation_aborted, callbacks the code",
          "[policy][shed]") {
  virtual_loop loop;
  sluice::semaphore cap{loop.get_executor(), 1, {.max_waiting = 0}};
  sluice::error_code cb;
  bool pre_cancelled_aborted = false;
  loop.run([&]() -> asio::awaitable<void> {
    co_await cap.acquire();
    cap.async_acquire([&](sluice::error_code ec) { cb = ec; });  // full: shed through a post
    // A caller whose cancellation was requested before it called is refused
    // as cancelled, not shed (and takes nothing).
    asio::cancellation_signal sig;
    co_await asio::co_spawn(
        co_await asio::this_coro::executor,
        [&]() -> asio::awaitable<void> {
          co_await asio::this_coro::throw_if_cancelled(false);
          sig.emit(asio::cancellation_type::terminal);
          try {
            co_await cap.acquire();
          } catch (const sluice::system_error& e) {
            pre_cancelled_aborted = e.code() == asio::error::operation_aborted;
          }
        },
        asio::bind_cancellation_slot(sig.slot(), asio::use_awaitable));
    cap.release();
  });
  CHECK(cb == sluice::overloaded_code());
  CHECK(pre_cancelled_aborted);
  CHECK(cap.stats().shed == 1);
  CHECK(cap.value() == 1);
  CHECK_THROWS_AS(sluice::semaphore(asio::any_io_executor{}, 1, {.linger = 1s}),
                  std::invalid_argument);
  CHECK_THROWS_AS(sluice::semaphore(asio::any_io_executor{}, 1, {.max_wait = 0s}),
                  std::invalid_argument);
}

TEST_CASE(
    "rate_limiter{.max_waiting, .max_wait}: shed at once when the window says so, or at "
    "the deadline",
    "[policy][shed]") {
  virtual_loop loop;
  sluice::rate_limiter rps{loop.get_executor(), 1, 10s, {.max_wait = 5s, .retry_after = 7s}};
  sluice::rate_limiter one_waiting{loop.get_executor(), 1, 1s, {.max_waiting = 1}};
  std::vector<ended> e(4), w(3);
  loop.run([&]() -> asio::awaitable<void> {
    auto start = [&] {
      return rps.acquire();
    };
    auto start1 = [&] {
      return one_waiting.acquire();
    };
    // A at 0 s. D at 1 s would wait until 10 s (9 s > 5 s): shed at once. B
    // at 6 s waits 4 s. C at 7 s: 3 s at the head, but behind B its start is
    // at 20 s: it leaves at its deadline, 12 s.
    co_await sluice::gather(at(0s, start, e[0]), at(6s, start, e[1]), at(7s, start, e[2]),
                            at(1s, start, e[3]), at(0s, start1, w[0]), at(0s, start1, w[1]),
                            at(0s, start1, w[2]));
  });
  CHECK(e[0].at == 0s);
  CHECK(e[1].at == 10s);
  CHECK(!e[1].error);
  CHECK(e[2].at == 12s);
  CHECK(shed_after(e[2]) == ns(7s));
  CHECK(e[3].at == 1s);
  CHECK(shed_after(e[3]) == ns(7s));
  CHECK(rps.stats().shed == 2);
  CHECK(rps.stats().acquired == 2);
  CHECK(rps.waiters() == 0);
  CHECK(w[0].at == 0s);
  CHECK(w[1].at == 1s);
  CHECK(w[2].at == 0s);
  CHECK(w[2].is<sluice::overloaded_error>());
  CHECK(one_waiting.stats().shed == 1);
  CHECK(one_waiting.stats().acquired == 2);
}

TEST_CASE("token_bucket{.max_wait}: a grant due at the very deadline wins; one later leaves then",
          "[policy][shed]") {
  virtual_loop loop;
  sluice::token_bucket tb{loop.get_executor(), 1.0, 1, {.max_wait = 2s}};
  std::vector<ended> e(4);
  loop.run([&]() -> asio::awaitable<void> {
    auto take = [&] {
      return tb.acquire();
    };
    co_await sluice::gather(at(0s, take, e[0]), at(0s, take, e[1]), at(0s, take, e[2]),
                            at(0s, take, e[3]));
  });
  CHECK(e[0].at == 0s);
  CHECK(e[1].at == 1s);
  CHECK(e[2].at == 2s);
  CHECK(!e[2].error);
  CHECK(e[3].at == 2s);
  CHECK(e[3].is<sluice::overloaded_error>());
  CHECK(tb.stats().shed == 1);
  CHECK(tb.stats().acquired == 3);
}

namespace {

// Three callers of `take()` at 0 s on a limit of 1 place that holds it 1 s
// (or a rate of 1 per second) with room for 1 waiter: the first runs at
// once, the second at 1 s, the third is shed at once. Returns how each ended.
template <class Take>
std::vector<ended> two_run_one_shed(virtual_loop& loop, Take take) {
  std::vector<ended> e(3);
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::gather(at(0s, take, e[0]), at(0s, take, e[1]), at(0s, take, e[2]));
  });
  CHECK(e[0].at == 1s);
  CHECK(e[1].at == 2s);
  CHECK(!e[1].error);
  CHECK(e[2].at == 0s);
  CHECK(shed_after(e[2]) == ns(2s));
  return e;
}

}  // namespace

TEST_CASE(
    "every limit kind takes shed_options: one past max_waiting is shed at once, inside its "
    "wait",
    "[policy][shed]") {
  const sluice::shed_options one{.max_waiting = 1, .retry_after = 2s};
  const auto hold = [](auto /*permit, held 1 s*/) -> asio::awaitable<void> {
    co_await sluice::sleep(1s);
  };
  SECTION("keyed_semaphore, per key") {
    virtual_loop loop;
    sluice::keyed_semaphore<std::string> per_user{loop.get_executor(), 1, one};
    two_run_one_shed(loop, [&]() -> asio::awaitable<void> {
      co_await hold(co_await per_user.scoped_acquire("alice"));
    });
    CHECK(per_user.stats().shed == 1);
    CHECK(per_user.keys() == 0);
  }
  SECTION("keyed_rate_limiter, per key") {
    virtual_loop loop;
    sluice::keyed_rate_limiter<std::string> per_user{loop.get_executor(), 1, 1s, one};
    two_run_one_shed(loop, [&]() -> asio::awaitable<void> {
      co_await per_user.acquire("alice");
      co_await sluice::sleep(1s);
    });
    CHECK(per_user.stats().shed == 1);
  }
  SECTION("adaptive_limit") {
    virtual_loop loop;
    sluice::adaptive_limit cap{loop.get_executor(),
                               {.initial = 1, .min = 1, .max = 1, .shed = one}};
    two_run_one_shed(
        loop, [&]() -> asio::awaitable<void> { co_await hold(co_await cap.scoped_acquire()); });
    CHECK(cap.stats().shed == 1);
    CHECK(cap.in_flight() == 0);
    // A drop at the floor: the algorithm backs off, the limit stays at min.
    loop.run([&]() -> asio::awaitable<void> { (co_await cap.scoped_acquire()).dropped(); });
    CHECK(cap.limit() == 1);
    CHECK(cap.in_flight() == 0);
  }
  SECTION("shared_semaphore") {
    virtual_loop loop;
    sluice::shared_semaphore cap{loop.get_executor(), 1, one};
    two_run_one_shed(
        loop, [&]() -> asio::awaitable<void> { co_await hold(co_await cap.scoped_acquire()); });
    CHECK(cap.stats().shed == 1);
    CHECK(cap.value() == 1);
    CHECK_THROWS_AS(sluice::shared_semaphore(loop.get_executor(), 1, {.max_wait = 1s}),
                    std::invalid_argument);
  }
  SECTION("strand_bound<semaphore>, the bound checked on the strand") {
    virtual_loop loop;
    sluice::strand_bound<sluice::semaphore> cap{asio::make_strand(loop.get_executor()), 1, one};
    two_run_one_shed(
        loop, [&]() -> asio::awaitable<void> { co_await hold(co_await cap.scoped_acquire()); });
    CHECK(cap.underlying().stats().shed == 1);
  }
  SECTION("keyed_semaphore{.max_wait}: a key's waiter leaves at its deadline, other keys go on") {
    virtual_loop loop;
    sluice::keyed_semaphore<std::string> per_user{loop.get_executor(), 1, {.max_wait = 500ms}};
    std::vector<ended> e(3);
    loop.run([&]() -> asio::awaitable<void> {
      auto take = [&](std::string key) {
        return [&, key]() -> asio::awaitable<void> {
          co_await hold(co_await per_user.scoped_acquire(key));
        };
      };
      co_await sluice::gather(at(0s, take("a"), e[0]), at(0s, take("a"), e[1]),
                              at(0s, take("b"), e[2]));
    });
    CHECK(e[0].at == 1s);
    CHECK(e[1].at == 500ms);
    CHECK(e[1].is<sluice::overloaded_error>());
    CHECK(e[2].at == 1s);
    CHECK(per_user.keys() == 0);
  }
}

// ---- circuit breaker --------------------------------------------------------

namespace {

struct transitions {
  std::vector<std::pair<sluice::breaker_state, sluice::breaker_state>> seen;
  auto hook() {
    return [this](sluice::breaker_state from, sluice::breaker_state to) {
      seen.emplace_back(from, to);
    };
  }
};

using bs = sluice::breaker_state;

}  // namespace

TEST_CASE("breaker: opens at the failure-rate threshold once minimum_calls ended, not before",
          "[policy][breaker]") {
  transitions t;
  auto p = sluice::policy(sluice::breaker({.failure_rate = 0.5,
                                           .window = 4,
                                           .minimum_calls = 4,
                                           .open_for = 10s,
                                           .on_state_change = t.hook()}));
  auto& brk = p.get<0>();
  virtual_loop loop;
  std::vector<ns> refused_retry_in;
  loop.run([&]() -> asio::awaitable<void> {
    // F, F, F: 100% failures, but only 3 calls: stays closed.
    for (int i = 0; i < 3; ++i) {
      co_await failing(p, 1s);
    }
    CHECK(brk.state() == bs::closed);
    CHECK(brk.stats().window_failures == 3);
    co_await p([] { return work(1s); });  // the 4th call: 3 of 4 failed >= 50%
    CHECK(brk.state() == bs::open);
    CHECK(co_await vnow() == 4s);
    co_await sluice::sleep(3s);
    try {
      co_await p([] { return work(1s); });
    } catch (const sluice::breaker_open_error& e) {
      refused_retry_in.push_back(e.retry_in());
    }
    CHECK(co_await vnow() == 7s);  // failed at once
  });
  CHECK(refused_retry_in == std::vector<ns>{7s});
  CHECK(t.seen == std::vector<std::pair<bs, bs>>{{bs::closed, bs::open}});
  const auto s = brk.stats();
  CHECK(s.calls == 4);
  CHECK(s.failures == 3);
  CHECK(s.not_permitted == 1);
  CHECK(s.opened == 1);
}

TEST_CASE("breaker: 1 failure in 4 stays closed under a 0.5 threshold; the count window slides",
          "[policy][breaker]") {
  auto p = sluice::policy(sluice::breaker({.failure_rate = 0.5, .window = 4, .minimum_calls = 4}));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    // F S S S: 25%. Then F: window S S S F (25%). Then F: S S F F -> 50%: open.
    const bool fails[] = {true, false, false, false, true};
    for (bool f : fails) {
      try {
        if (f)
          co_await p([] { return work<std::runtime_error>(1s); });
        else
          co_await p([] { return work(1s); });
      } catch (const std::runtime_error&) {
      }
      CHECK(p.get<0>().state() == bs::closed);
    }
    co_await failing(p, 1s);
    CHECK(p.get<0>().state() == bs::open);
  });
}

TEST_CASE(
    "breaker: after open_for, N trial calls pass half-open, one more is refused; success closes",
    "[policy][breaker]") {
  transitions t;
  auto p = sluice::policy(sluice::breaker({.failure_rate = 1.0,
                                           .window = 1,
                                           .minimum_calls = 1,
                                           .open_for = 5s,
                                           .half_open_calls = 2,
                                           .on_state_change = t.hook()}));
  virtual_loop loop;
  std::vector<ended> e(3);
  loop.run([&]() -> asio::awaitable<void> {
    co_await failing(p, 1s);
    CHECK(p.get<0>().state() == bs::open);  // at 1 s
    co_await sluice::sleep(5s - 1ns);
    ended early;
    co_await at(
        0s, [&] { return p([] { return work(1s); }); }, early);
    CHECK(early.is<sluice::breaker_open_error>());  // 1 ns before the trial time
    co_await sluice::sleep(1ns);
    auto call = [&] {
      return p([] { return work(2s); });
    };
    co_await sluice::gather(at(0s, call, e[0]), at(0s, call, e[1]), at(0s, call, e[2]));
  });
  CHECK(!e[0].error);
  CHECK(!e[1].error);
  CHECK(e[0].at == 8s);
  CHECK(e[2].is<sluice::breaker_open_error>());
  CHECK(e[2].at == 6s);
  CHECK(p.get<0>().state() == bs::closed);
  CHECK(t.seen == std::vector<std::pair<bs, bs>>{{bs::closed, bs::open},
                                                 {bs::open, bs::half_open},
                                                 {bs::half_open, bs::closed}});
}

TEST_CASE("breaker: a failed trial reopens it for another open_for", "[policy][breaker]") {
  transitions t;
  auto p = sluice::policy(sluice::breaker(
      {.window = 1, .minimum_calls = 1, .open_for = 5s, .on_state_change = t.hook()}));
  virtual_loop loop;
  ns retry_in{};
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 2; ++i) {
      co_await failing(p, 1s);  // at 0 s, then the trial at 6 s
      if (i == 0) co_await sluice::sleep(5s);
    }
    CHECK(co_await vnow() == 7s);
    try {
      co_await p([] { return work(1s); });
    } catch (const sluice::breaker_open_error& e) {
      retry_in = e.retry_in();
    }
  });
  CHECK(retry_in == 5s);
  CHECK(t.seen == std::vector<std::pair<bs, bs>>{{bs::closed, bs::open},
                                                 {bs::open, bs::half_open},
                                                 {bs::half_open, bs::open}});
  CHECK(p.get<0>().stats().opened == 2);
}

TEST_CASE("breaker: the slow-call rate opens it; a call exactly slow_call long is not slow",
          "[policy][breaker]") {
  auto p = sluice::policy(
      sluice::breaker({.slow_call_rate = 0.5, .slow_call = 2s, .window = 2, .minimum_calls = 2}));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    co_await p([] { return work(2s); });
    co_await p([] { return work(2s); });
    CHECK(p.get<0>().state() == bs::closed);
    CHECK(p.get<0>().stats().window_slow == 0);
    co_await p([] { return work(2s + 1ns); });  // 1 slow of the last 2: 50%
    CHECK(p.get<0>().state() == bs::open);
  });
}

TEST_CASE("breaker: a time window forgets calls older than window_time", "[policy][breaker]") {
  auto p = sluice::policy(
      sluice::breaker({.failure_rate = 0.5, .window_time = 10s, .minimum_calls = 2}));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    co_await failing(p, 1s);      // ends at 1 s
    co_await sluice::sleep(10s);  // 11 s: the failure at 1 s left the window
    co_await p([] { return work(0s); });
    CHECK(p.get<0>().state() == bs::closed);
    CHECK(p.get<0>().stats().window_calls == 1);
    co_await failing(p, 0s);
    CHECK(p.get<0>().state() == bs::open);  // 1 of 2 in the window
  });
}

TEST_CASE("breaker: a cancelled trial is not recorded and gives its place back",
          "[policy][breaker]") {
  auto p = sluice::policy(sluice::breaker({.window = 1, .minimum_calls = 1, .open_for = 1s}));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    co_await failing(p, 0s);
    co_await sluice::sleep(1s);
    // The trial is cancelled by a timeout around the policy.
    CHECK_THROWS_AS(co_await sluice::with_timeout(1s, p([] { return work(5s); })),
                    sluice::timeout_error);
    CHECK(p.get<0>().state() == bs::half_open);
    co_await p([] { return work(1s); });  // the place is free again: a trial that succeeds
    CHECK(p.get<0>().state() == bs::closed);
  });
  CHECK(p.get<0>().stats().calls == 2);
}

TEST_CASE(
    "breaker: an is_failure hook that throws ends the call with callback_error and frees "
    "the trial",
    "[policy][breaker]") {
  // The hook throws for a std::domain_error; every other error is a failure.
  auto p = sluice::policy(sluice::breaker({.window = 1,
                                           .minimum_calls = 1,
                                           .open_for = 1s,
                                           .is_failure = [](const std::exception_ptr& e) {
                                             try {
                                               std::rethrow_exception(e);
                                             } catch (const std::domain_error&) {
                                               throw std::logic_error("hook");
                                             } catch (...) {
                                             }
                                             return true;
                                           }}));
  virtual_loop loop;
  bool nested_is_call_error = false;
  loop.run([&]() -> asio::awaitable<void> {
    co_await failing(p, 0s);  // opens it
    co_await sluice::sleep(1s);
    try {
      co_await p([] { return work<std::domain_error>(0s); });  // the trial
    } catch (const sluice::callback_error& e) {
      try {
        std::rethrow_if_nested(e);
      } catch (const std::domain_error&) {
        nested_is_call_error = true;
      }
    }
    CHECK(p.get<0>().state() == bs::half_open);
    co_await p([] { return work(0s); });  // the trial's place is free: it closes
    CHECK(p.get<0>().state() == bs::closed);
  });
  CHECK(nested_is_call_error);
}

TEST_CASE("breaker: bad options are refused at construction", "[policy][breaker]") {
  CHECK_THROWS_AS(sluice::breaker({.failure_rate = 0}), std::invalid_argument);
  CHECK_THROWS_AS(sluice::breaker({.slow_call_rate = 1.5}), std::invalid_argument);
  CHECK_THROWS_AS(sluice::breaker({.window = 0}), std::invalid_argument);
  CHECK_THROWS_AS(sluice::breaker({.half_open_calls = 0}), std::invalid_argument);
}

// ---- provider-side accounting ----------------------------------------------

TEST_CASE(
    "linger: a timed-out call keeps its permit linger_for after it ended; the caller "
    "fails at the deadline",
    "[policy][linger]") {
  const auto run = [](ns linger) {
    sluice::semaphore cap{1};
    auto p = sluice::policy(sluice::limits(cap).linger_for(linger), sluice::timeout(1s));
    std::vector<ended> e(2);
    std::size_t lingering_mid = 0;
    virtual_loop loop;
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::gather(at(
                                  0s, [&] { return p([] { return work(10s); }); }, e[0]),
                              at(
                                  0s, [&] { return p([] { return work(0s); }); }, e[1]));
      lingering_mid = p.get<0>().lingering();
      co_await p.join();
      CHECK(co_await vnow() == ns(1s) + linger);
    });
    CHECK(e[0].is<sluice::timeout_error>());
    CHECK(e[0].at == 1s);
    CHECK(!e[1].error);
    CHECK(cap.value() == 1);
    return std::pair{e[1].at, lingering_mid};
  };
  // Without linger the waiting call gets the permit when the first timed out;
  // with 4 s it gets it at 1 + 4 s.
  CHECK(run(0s) == std::pair{ns(1s), std::size_t{0}});
  CHECK(run(4s) == std::pair{ns(5s), std::size_t{0}});
}

TEST_CASE("linger: two joins waiting at once both complete when the last permit goes",
          "[policy][linger]") {
  sluice::semaphore cap{1};
  auto p = sluice::policy(sluice::shed(cap, {.linger = 2s}), sluice::timeout(1s));
  virtual_loop loop;
  std::vector<ns> joined;
  loop.run([&]() -> asio::awaitable<void> {
    CHECK_THROWS_AS(co_await p([] { return work(5s); }), sluice::timeout_error);
    auto join = [&]() -> asio::awaitable<void> {
      co_await p.join();
      joined.push_back(co_await vnow());
    };
    co_await sluice::gather(join(), join());
  });
  CHECK(joined == std::vector<ns>{3s, 3s});
  CHECK(cap.value() == 1);
}

namespace {

// A held permit whose move throws once `fail` is set: hold() then fails
// before its timer coroutine exists.
struct throwing_held {
  bool* fail;
  int* alive;
  explicit throwing_held(bool* f, int* a) : fail(f), alive(a) { ++*alive; }
  throwing_held(throwing_held&& o) : fail(o.fail), alive(o.alive) {
    if (*fail) throw std::runtime_error("move");
    ++*alive;
  }
  throwing_held& operator=(throwing_held&&) = delete;
  ~throwing_held() { --*alive; }
};

}  // namespace

TEST_CASE("linger: a hold that fails to start counts nothing, so a join does not hang",
          "[policy][linger]") {
  virtual_loop loop;
  sluice::detail::linger_set set;
  bool fail = false;
  int alive = 0;
  set.hold(loop.get_executor(), throwing_held(&fail, &alive), sluice::clock::time_point{} + 1s);
  fail = true;
  CHECK_THROWS_AS(
      set.hold(loop.get_executor(), throwing_held(&fail, &alive), sluice::clock::time_point{} + 1s),
      std::runtime_error);
  CHECK(set.lingering() == 1);  // the first only
  CHECK(alive == 1);
  loop.run([&]() -> asio::awaitable<void> {
    co_await set.join(co_await asio::this_coro::executor);
    CHECK(co_await vnow() == 1s);
  });
  CHECK(set.lingering() == 0);
  CHECK(alive == 0);
}

TEST_CASE("linger on shed: a cancelled caller's permit stays for the linger, join awaits it",
          "[policy][linger][shed]") {
  sluice::semaphore cap{1};
  auto p = sluice::policy(sluice::shed(cap, {.linger = 3s}));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    CHECK_THROWS_AS(co_await sluice::with_timeout(2s, p([] { return work(10s); })),
                    sluice::timeout_error);
    CHECK(co_await vnow() == 2s);
    CHECK(p.get<0>().lingering() == 1);
    CHECK(cap.value() == 0);
    co_await p([] { return work(0s); });  // waits for the lingering permit
    CHECK(co_await vnow() == 5s);
    co_await p.join();
    CHECK(p.get<0>().lingering() == 0);
  });
  CHECK(cap.value() == 1);
}

// ---- hedged requests -------------------------------------------------------

namespace {

// A provider whose i-th attempt takes durations[i]; counts attempts that
// were cancelled and attempts in flight.
struct attempts {
  std::vector<ns> durations;
  std::size_t started = 0, cancelled = 0, in_flight = 0;
  std::vector<ns> starts = {};
  asio::awaitable<int> call() {
    const std::size_t i = started++;
    starts.push_back(co_await vnow());
    ++in_flight;
    try {
      co_await sluice::sleep(durations.at(i));
    } catch (...) {
      --in_flight;
      ++cancelled;
      throw;
    }
    --in_flight;
    co_return static_cast<int>(i);
  }
};

}  // namespace

TEST_CASE(
    "hedge: a second attempt starts at the delay; the first success wins, the loser is "
    "cancelled and awaited",
    "[policy][hedge]") {
  attempts a{{10s, 1s}};
  auto p = sluice::policy(sluice::hedge({.after = 2s, .budget = 1.0}));
  virtual_loop loop;
  const int winner = loop.run([&]() -> asio::awaitable<int> {
    const int w = co_await p([&] { return a.call(); });
    CHECK(a.in_flight == 0);  // the loser has ended before the call returned
    co_return w;
  });
  CHECK(winner == 1);
  CHECK(loop.now() == 3s);
  CHECK(a.starts == std::vector<ns>{0s, 2s});
  CHECK(a.cancelled == 1);
  const auto s = p.get<0>().stats();
  CHECK(s.calls == 1);
  CHECK(s.hedged == 1);
  CHECK(s.hedge_won == 1);
}

TEST_CASE("hedge: a first attempt that ends before the delay starts no hedge", "[policy][hedge]") {
  attempts a{{2s - 1ns}};
  auto p = sluice::policy(sluice::hedge({.after = 2s, .budget = 1.0}));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> { co_await p([&] { return a.call(); }); });
  CHECK(a.started == 1);
  CHECK(loop.now() == 2s - 1ns);
  CHECK(p.get<0>().stats().hedged == 0);
}

TEST_CASE("hedge: a failure before the hedge ends the call; after it, the other attempt decides",
          "[policy][hedge]") {
  auto p = sluice::policy(sluice::hedge({.after = 2s, .budget = 1.0}));
  virtual_loop loop;
  std::size_t calls = 0;
  loop.run([&]() -> asio::awaitable<void> {
    // Fails at 1 s: no hedge, the error at once.
    CHECK_THROWS_AS(co_await p([&] {
                      ++calls;
                      return work<std::runtime_error>(1s);
                    }),
                    std::runtime_error);
    CHECK(co_await vnow() == 1s);
    CHECK(calls == 1);
    // The first fails at 3 s, after the hedge started at 2 s; the hedge succeeds at 4 s.
    attempts a{{3s, 2s}};
    auto first_fails = [&]() -> asio::awaitable<int> {
      const int i = co_await a.call();
      if (i == 0) throw std::runtime_error("first attempt failed");
      co_return i;
    };
    const int winner = co_await p(first_fails);  // not inside CHECK: it evaluates twice
    CHECK(winner == 1);
    CHECK(co_await vnow() == 5s);
  });
}

TEST_CASE("hedge: the budget caps hedges at its ratio of calls", "[policy][hedge]") {
  auto p = sluice::policy(sluice::hedge({.after = 1s, .budget = 0.25}));
  virtual_loop loop;
  std::size_t attempts_made = 0;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 8; ++i)
      co_await p([&] {
        ++attempts_made;
        return work(2s);
      });
  });
  // Calls 4 and 8 may hedge (1 <= 0.25 * 4, 2 <= 0.25 * 8); the other six are over budget.
  const auto s = p.get<0>().stats();
  CHECK(s.hedged == 2);
  CHECK(s.over_budget == 6);
  CHECK(attempts_made == 10);
}

TEST_CASE("hedge: each attempt takes the limits inside it; a cancelled caller ends both",
          "[policy][hedge]") {
  sluice::semaphore cap{1};
  attempts a{{10s, 10s}};
  auto p = sluice::policy(sluice::hedge({.after = 1s, .budget = 1.0}), sluice::limits(cap));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    // The hedge waits for the one permit: it never starts before the first ends.
    CHECK_THROWS_AS(co_await sluice::with_timeout(5s, p([&] { return a.call(); })),
                    sluice::timeout_error);
  });
  CHECK(a.started == 1);
  CHECK(a.cancelled == 1);
  CHECK(cap.value() == 1);
  CHECK(p.get<0>().stats().hedged == 1);
}

TEST_CASE("tail latency: hedging at the p95 cuts the p99 at least 5x for at most 5% extra calls",
          "[policy][hedge][table]") {
  namespace sc = sluice_examples::policies;
  const auto plain = sc::run_tail(false);
  const auto hedged = sc::run_tail(true);
  CHECK(plain.provider == plain.calls);
  CHECK(hedged.p99 * 5 <= plain.p99);
  CHECK(hedged.extra() <= 0.05);
  // The figures of docs/provider-limits.md, exact in virtual time.
  CHECK(plain.p50 == 10942us);
  CHECK(plain.p99 == 1088ms);
  CHECK(hedged.p50 == 10942us);
  CHECK(hedged.p99 == 21919us);    // 49.6x shorter
  CHECK(hedged.provider == 5247);  // 4.94% extra calls
}

TEST_CASE("overload: with shedding no accepted call waits past the bound; without, waits grow",
          "[policy][shed][table]") {
  namespace sc = sluice_examples::policies;
  const auto queued = sc::run_overload(false);
  const auto shed = sc::run_overload(true);
  CHECK(queued.shed == 0);
  CHECK(shed.max_wait <= 200ms);
  CHECK(queued.p99_wait > 20s);
  // The figures of docs/provider-limits.md, exact in virtual time.
  CHECK(queued.arrived == 4800);
  CHECK(queued.accepted == 4800);
  CHECK(queued.p99_wait == 59350ms);
  CHECK(shed.accepted == 2408);
  CHECK(shed.shed == 2392);
  CHECK(shed.p99_wait == 187500us);
}

// ---- metrics ----------------------------------------------------------------

TEST_CASE("prometheus_text renders a limit and every layer of a policy, one group per metric",
          "[policy][prometheus]") {
  sluice::semaphore cap{2};
  auto p = sluice::policy(sluice::shed(cap, {.max_waiting = 0}),
                          sluice::breaker({.window = 1, .minimum_calls = 1}), sluice::timeout(1s));
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    co_await failing(p, 2s);  // times out: the breaker opens
    CHECK_THROWS_AS(co_await p([] { return work(0s); }), sluice::breaker_open_error);
  });
  sluice::prometheus_text m;
  m.add("backend", cap.stats()).add("provider", p);
  const std::string text = m.str();
  const auto has = [&](const std::string& line) {
    return text.find(line + "\n") != std::string::npos;
  };
  CHECK(has("# TYPE sluice_limit_acquired_total counter"));
  CHECK(has("sluice_limit_acquired_total{name=\"backend\"} 2"));
  CHECK(has("sluice_limit_in_use{name=\"backend\"} 0"));
  CHECK(has("sluice_limit_wait_seconds_count{name=\"backend\"} 2"));
  CHECK(has("sluice_shed_admitted_total{name=\"provider\",layer=\"0\"} 2"));
  CHECK(has("sluice_breaker_state{name=\"provider\",layer=\"1\",state=\"open\"} 1"));
  CHECK(has("sluice_breaker_state{name=\"provider\",layer=\"1\",state=\"closed\"} 0"));
  CHECK(has("sluice_breaker_not_permitted_total{name=\"provider\",layer=\"1\"} 1"));
  CHECK(has("sluice_timeout_timeouts_total{name=\"provider\",layer=\"2\"} 1"));
  // Each metric's HELP and TYPE appear once.
  std::size_t types = 0;
  for (std::size_t at = 0;
       (at = text.find("# TYPE sluice_breaker_state ", at)) != std::string::npos; ++at)
    ++types;
  CHECK(types == 1);
}

// ---- threads ----------------------------------------------------------------

namespace {

// Runs `sessions` coroutines `session()`, each on its own strand of `ctx`,
// with 4 threads running `ctx` until every one has ended.
template <class Session>
void on_four_threads(asio::io_context& ctx, std::size_t sessions, Session session) {
  for (std::size_t s = 0; s < sessions; ++s)
    asio::co_spawn(asio::make_strand(ctx), session, asio::detached);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { ctx.run(); });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("one policy shared by sessions on strands of a 4-thread io_context",
          "[policy][threads]") {
  constexpr std::size_t sessions = 64, calls = 20, cap_n = 4;
  sluice::shared_semaphore cap{cap_n};
  asio::io_context ctx{4};
  sluice::strand_bound<sluice::rate_limiter> rps{asio::make_strand(ctx), 1000000, 1s};
  auto p =
      sluice::policy(sluice::shed(cap, {.max_waiting = 16}), sluice::limits(rps),
                     sluice::breaker({.failure_rate = 1.0, .window = 1000, .minimum_calls = 1000}));
  std::atomic<std::size_t> in_flight{0}, max_in_flight{0}, ok{0}, shed{0};
  on_four_threads(ctx, sessions, [&]() -> asio::awaitable<void> {
    for (std::size_t i = 0; i < calls; ++i) {
      try {
        co_await p([&]() -> asio::awaitable<int> {
          const std::size_t n = in_flight.fetch_add(1) + 1;
          sluice_test::raise_peak(max_in_flight, n);
          asio::steady_timer t(co_await asio::this_coro::executor, 100us);
          co_await t.async_wait(asio::use_awaitable);
          in_flight.fetch_sub(1);
          co_return 1;
        });
        ok.fetch_add(1);
      } catch (const sluice::overloaded_error&) {
        shed.fetch_add(1);
      }
    }
  });
  CHECK(ok + shed == sessions * calls);
  CHECK(max_in_flight <= cap_n);
  const auto s = p.get<0>().stats();
  CHECK(s.admitted == ok);
  CHECK(s.shed == shed);
  CHECK(s.waiting == 0);
  CHECK(p.get<2>().stats().calls == ok);
  CHECK(cap.value() == cap_n);
}

TEST_CASE("one retry_budget shared by a policy's sessions on strands of a 4-thread io_context",
          "[policy][threads]") {
  constexpr std::size_t sessions = 32, calls = 20;
  sluice::retry_budget budget{{.ratio = 0.5, .per = std::chrono::hours(1)}};
  asio::io_context ctx{4};
  auto p = sluice::policy(sluice::retry_layer({.first = 0s,
                                               .attempts = 2,
                                               .retry_if = [](const auto&) { return true; },
                                               .budget = &budget}));
  std::atomic<std::size_t> ok{0}, failed{0}, attempts{0};
  on_four_threads(ctx, sessions, [&]() -> asio::awaitable<void> {
    for (std::size_t i = 0; i < calls; ++i) {
      bool first = true;
      try {
        co_await p([&]() -> asio::awaitable<int> {
          attempts.fetch_add(1);
          if (std::exchange(first, false)) throw std::runtime_error("first attempt");
          co_return 1;
        });
        ok.fetch_add(1);
      } catch (const std::runtime_error&) {
        failed.fetch_add(1);
      }
    }
  });
  // Every call failed once: the budget allowed a retry (which succeeded) or
  // refused it, each decision counted once, never past half the firsts.
  CHECK(ok + failed == sessions * calls);
  CHECK(budget.first_attempts() == sessions * calls);
  CHECK(budget.retried() == ok);
  CHECK(budget.refused() == failed);
  CHECK(budget.retries() == ok);
  CHECK(ok <= sessions * calls / 2);
  CHECK(ok >= sessions * calls / 2 - 1);  // each refusal left retries at half the firsts
  CHECK(attempts == sessions * calls + ok);
  CHECK(p.get<0>().retries() == ok);
}

// ---- docs/provider-limits.md ----------------------------------------------

namespace {

struct http_backend {
  int calls = 0;
  asio::awaitable<std::string> get(std::string path) {
    ++calls;
    co_await sluice::sleep(100ms);
    if (path == "/fail") throw std::runtime_error("502 from the backend");
    co_return "body of " + path;
  }
};

struct response {
  int status = 0;
  std::string body;
  ns retry_after{};
};
response ok(std::string body) {
  return {200, std::move(body), {}};
}
response too_many_requests(ns after) {
  return {429, {}, after};
}
response unavailable(ns after) {
  return {503, {}, after};
}

template <class Policy>
asio::awaitable<response> serve(Policy& provider, http_backend& backend, std::string path) {
  // clang-format off
try {
  co_return ok(co_await provider([&] { return backend.get(path); }));
} catch (const sluice::overloaded_error& e) {
  co_return too_many_requests(e.after);   // 429 with Retry-After: shed, nothing queued
} catch (const sluice::breaker_open_error& e) {
  co_return unavailable(e.retry_in());    // 503 with Retry-After: the next trial call
}
  // clang-format on
}

}  // namespace

TEST_CASE("provider-limits.md: one policy of a breaker, retries, shedding, limits and a timeout",
          "[policy][docs]") {
  http_backend backend;
  const std::string path = "/v1/items";
  virtual_loop loop;
  std::uint64_t admitted = 0;
  const std::string body = loop.run([&]() -> asio::awaitable<std::string> {
    // clang-format off
sluice::semaphore cap{8};                               // 8 in flight at the provider
sluice::rate_limiter rpm{600, std::chrono::minutes(1)};
auto provider = sluice::policy(
    sluice::breaker({.failure_rate = 0.5, .window = 20, .minimum_calls = 10, .open_for = 30s}),
    sluice::retry_layer({.first = 100ms, .attempts = 3, .jitter = sluice::no_jitter}),
    sluice::shed(cap, {.max_waiting = 64, .retry_after = 2s, .linger = 5s}),
    sluice::limits(rpm),
    sluice::timeout(2s));
std::string reply = co_await provider([&] { return backend.get(path); });
    // clang-format on
    admitted = provider.get<2>().stats().admitted;
    co_await provider.join();
    co_return reply;
  });
  CHECK(body == "body of /v1/items");
  CHECK(backend.calls == 1);
  CHECK(admitted == 1);
  CHECK(loop.now() == 100ms);
}

TEST_CASE("provider-limits.md: a server answers a shed call 429 and an open breaker 503",
          "[policy][docs]") {
  http_backend backend;
  sluice::semaphore cap{1};
  auto provider =
      sluice::policy(sluice::breaker({.window = 1, .minimum_calls = 1, .open_for = 10s}),
                     sluice::shed(cap, {.max_waiting = 0, .retry_after = 2s}));
  virtual_loop loop;
  std::vector<response> r(2);
  response after_failure;
  loop.run([&]() -> asio::awaitable<void> {
    auto first = [&]() -> asio::awaitable<void> {
      r[0] = co_await serve(provider, backend, "/a");
    };
    auto second = [&]() -> asio::awaitable<void> {
      r[1] = co_await serve(provider, backend, "/b");
    };
    co_await sluice::gather(first(), second());
    CHECK_THROWS_AS(co_await serve(provider, backend, "/fail"), std::runtime_error);  // opens it
    after_failure = co_await serve(provider, backend, "/a");
  });
  CHECK(r[0].status == 200);
  CHECK(r[0].body == "body of /a");
  CHECK(r[1].status == 429);
  CHECK(r[1].retry_after == 2s);
  CHECK(after_failure.status == 503);
  CHECK(after_failure.retry_after == 10s);
  CHECK(backend.calls == 2);
}
