// SPDX-License-Identifier: BSL-1.0
// sluice::acquire_all: DESIGN.md "Providers that push back", semantics 3.
// Every timing is exact, in virtual time; the server-shape cases on real
// threads assert counts only.
// g++ 12 at -O1 (the TSan build) reports -Wmismatched-new-delete for the
// frame of an acquire_all of four strand and shared budgets: a false positive
// (Asio's awaitable frames pair their own operator new and delete), as
// policy_test.cpp notes. Before the includes: the
// warning is reported in acquire_all.hpp, where the frame is instantiated.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <sluice/acquire_all.hpp>

#include <sluice/adaptive_limit.hpp>

#include <sluice/gather.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/strand_bound.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/token_bucket.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/peak.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice_test::tasks_on_loop;
namespace latency = sluice::testing::latency;
using ns = std::chrono::nanoseconds;

namespace {

ns now_of(const asio::any_io_executor& ex) {
  return sluice::now(ex).time_since_epoch();
}

// The FIFO schedule a client that knows the quotas could best achieve: call i
// starts at the earliest t >= the previous start at which fewer than `rpm`
// starts, and at most `tpm - tokens[i]` tokens, lie in (t - window, t], and
// fewer than `in_flight` calls run. An oracle written apart from the library.
std::vector<ns> fifo_bound(const std::vector<std::size_t>& tokens, const std::vector<ns>& lat,
                           std::size_t rpm, std::size_t tpm, std::size_t in_flight, ns window) {
  std::vector<ns> start(tokens.size()), end(tokens.size());
  ns t{0};
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    for (;;) {
      ns next = t;
      std::vector<std::pair<ns, std::size_t>> in_window;  // (start, tokens), oldest first
      std::vector<ns> running;
      for (std::size_t j = 0; j < i; ++j) {
        if (start[j] > t - window) in_window.emplace_back(start[j], tokens[j]);
        if (end[j] > t) running.push_back(end[j]);
      }
      if (in_window.size() >= rpm)
        next = std::max(next, in_window[in_window.size() - rpm].first + window);
      std::size_t used = 0;
      for (auto& w : in_window) used += w.second;
      for (std::size_t k = 0; used + tokens[i] > tpm; ++k) {
        used -= in_window[k].second;
        next = std::max(next, in_window[k].first + window);
      }
      std::sort(running.begin(), running.end());
      if (running.size() >= in_flight) next = std::max(next, running[running.size() - in_flight]);
      if (next == t) break;
      t = next;
    }
    start[i] = t;
    end[i] = t + lat[i];
  }
  return start;
}

}  // namespace

TEST_CASE("RPM, TPM and concurrency at once: zero throttles, the schedule the quotas imply",
          "[acquire_all]") {
  // 300 prompts of 200..2,600 tokens; the provider: 60 RPM and 40,000 TPM
  // (rolling minute) and 8 in flight; the client takes all three together.
  constexpr std::size_t prompts = 300;
  std::vector<std::size_t> tokens;
  for (std::size_t i = 0; i < prompts; ++i) tokens.push_back(200 + sluice::detail::mix(i) % 2401);
  const auto lat_model = latency::uniform(2s, 8s, 42);
  std::vector<ns> lat;
  for (std::size_t i = 0; i < prompts; ++i) lat.push_back(lat_model({i, "", "", tokens[i]}));

  slow_service llm({.latency = latency::from([&](const sluice::testing::call_info& c) {
                      return lat[std::stoul(std::string(c.key))];
                    }),
                    .quota = {.max_in_flight = 8,
                              .calls_per_window = 60,
                              .window = 1min,
                              .tokens_per_window = 40000}});
  sluice::semaphore in_flight{8};
  sluice::rate_limiter rpm{60, 1min}, tpm{40000, 1min};
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> calls;
    for (std::size_t i = 0; i < prompts; ++i) {
      calls.push_back([](auto& sem, auto& r, auto& t, auto& svc, std::size_t idx,
                         std::size_t tok) -> asio::awaitable<void> {
        auto held = co_await sluice::acquire_all(sem, r, t.weighted(tok));
        co_await svc.call(std::to_string(idx), "", tok);
      }(in_flight, rpm, tpm, llm, i, tokens[i]));
    }
    co_await sluice::gather(std::move(calls));
  });
  CHECK(llm.throttles() == 0);
  CHECK(llm.completed() == prompts);
  const auto bound = fifo_bound(tokens, lat, 60, 40000, 8, 1min);
  std::vector<ns> starts;
  for (const auto& r : llm.timeline()) starts.push_back(r.start);
  CHECK(starts == bound);  // each call at the earliest instant the quotas allow, in order
  ns makespan{0};
  for (std::size_t i = 0; i < prompts; ++i) makespan = std::max(makespan, bound[i] + lat[i]);
  CHECK(loop.now() == makespan);
}

TEST_CASE("no start is recorded in one window while the caller waits on another", "[acquire_all]") {
  sluice::rate_limiter rpm{2, 1min}, tpm{100, 1min};
  virtual_loop loop;
  ns b_granted{-1};
  bool direct_at_10s = false, full_at_10s = false;
  loop.run([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto a = co_await sluice::acquire_all(rpm, tpm.weighted(100));  // t = 0: TPM full
    auto b = [&]() -> asio::awaitable<void> {
      auto held = co_await sluice::acquire_all(rpm, tpm.weighted(50));
      b_granted = now_of(ex);
    };
    auto probe = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(10s);
      direct_at_10s = rpm.try_acquire();  // B took no RPM start while waiting
      full_at_10s = !rpm.try_acquire();   // (A's and this one fill it)
    };
    std::vector<asio::awaitable<void>> both;
    both.push_back(b());
    both.push_back(probe());
    co_await sluice::gather(std::move(both));
  });
  CHECK(direct_at_10s);
  CHECK(full_at_10s);
  CHECK(b_granted ==
        60s);  // A's start and tokens leave at 60 s; the 10 s start still counts: 1 < 2
}

TEST_CASE("a rate start is recorded at the instant of the grant of all", "[acquire_all]") {
  sluice::semaphore one{1};
  sluice::rate_limiter rpm{1, 1min};
  virtual_loop loop;
  std::vector<ns> granted;
  loop.run([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto holder = [&]() -> asio::awaitable<void> {
      auto p = co_await one.scoped_acquire();
      co_await sluice::sleep(10s);
    };
    auto both = [&]() -> asio::awaitable<void> {
      auto held = co_await sluice::acquire_all(one, rpm);  // waits for the permit until 10 s
      granted.push_back(now_of(ex));
    };
    auto rate_only = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(1s);
      auto held = co_await sluice::acquire_all(rpm);  // one minute after the start at 10 s
      granted.push_back(now_of(ex));
    };
    std::vector<asio::awaitable<void>> v;
    v.push_back(holder());
    v.push_back(both());
    v.push_back(rate_only());
    co_await sluice::gather(std::move(v));
  });
  CHECK(granted == std::vector<ns>{10s, 70s});
}

TEST_CASE("FIFO among acquire_all callers: a heavy request at the head is not overtaken",
          "[acquire_all]") {
  sluice::rate_limiter tpm{100, 1min};
  sluice::semaphore other{1};
  virtual_loop loop;
  std::vector<std::pair<std::string, ns>> order;
  loop.run([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto take = [&](std::string who, ns at, std::size_t n) -> asio::awaitable<void> {
      co_await sluice::sleep(at);
      auto held = co_await sluice::acquire_all(tpm.weighted(n));
      order.emplace_back(who, now_of(ex));
    };
    auto disjoint = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(3s);
      auto held = co_await sluice::acquire_all(other);
      order.emplace_back("D", now_of(ex));
    };
    std::vector<asio::awaitable<void>> v;
    v.push_back(take("A", 0s, 80));
    v.push_back(take("B", 1s, 50));  // waits for A's 80 to leave (60 s)
    v.push_back(take("C", 2s, 10));  // would fit now, but B is older
    v.push_back(disjoint());         // another budget: not held back
    co_await sluice::gather(std::move(v));
  });
  CHECK(order ==
        std::vector<std::pair<std::string, ns>>{{"A", 0s}, {"D", 3s}, {"B", 60s}, {"C", 60s}});
}

TEST_CASE("a cancelled acquire_all holds nothing and recorded nothing", "[acquire_all]") {
  sluice::semaphore sem{1};
  sluice::rate_limiter rpm{1, 1min};
  sluice::token_bucket bucket{1.0, 1};
  tasks_on_loop t;
  auto& holder = t.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire();
    co_await sluice::sleep(1h);
  });
  // Waits on the semaphore (the rate budgets are free): cancelled there.
  auto& waiting = t.spawn([&]() -> asio::awaitable<void> {
    auto held = co_await sluice::acquire_all(rpm, sem, bucket);
  });
  t.loop.run_for(5s);
  REQUIRE(sem.waiters() == 1);
  waiting.cancel();
  t.poll();
  CHECK(waiting.cancelled());
  CHECK(sem.waiters() == 0);
  CHECK(rpm.try_acquire());     // no start was recorded for it
  CHECK(bucket.try_acquire());  // nor a token taken
  holder.cancel();
  t.poll();
  CHECK(sem.value() == 1);

  // Cancelled before the call: takes nothing, throws operation_aborted.
  bool reached = false;
  auto& early = t.spawn([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::sleep(1s);
    } catch (const sluice::system_error&) {
    }
    reached = true;  // the cancellation stays requested
    auto held = co_await sluice::acquire_all(sem, rpm);
  });
  t.poll();
  early.cancel();
  t.loop.run_for(2s);
  CHECK(reached);
  CHECK(early.cancelled());
  CHECK(sem.value() == 1);
  CHECK(sem.waiters() == 0);
}

TEST_CASE("a grant given back when another budget is not free is exact", "[acquire_all]") {
  // The RPM limiter has a direct waiter, so acquire_all waits in its FIFO;
  // at its grant (20 s) the semaphore is busy: the start is given back, and a
  // direct caller at 21 s finds the window free, as if it had never been taken.
  sluice::rate_limiter rpm{1, 10s};
  sluice::semaphore sem{1};
  virtual_loop loop;
  std::vector<std::pair<std::string, ns>> order;
  loop.run([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    co_await rpm.acquire();  // t = 0: the window is full until 10 s
    auto direct = [&](std::string who, ns at) -> asio::awaitable<void> {
      co_await sluice::sleep(at);
      co_await rpm.acquire();
      order.emplace_back(who, now_of(ex));
    };
    auto busy = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(12s);
      auto p = co_await sem.scoped_acquire();
      co_await sluice::sleep(13s);  // until 25 s
    };
    auto all = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(1s);
      auto held = co_await sluice::acquire_all(rpm, sem);
      order.emplace_back("all", now_of(ex));
    };
    std::vector<asio::awaitable<void>> v;
    v.push_back(direct("first", 0s));    // granted at 10 s
    v.push_back(busy());                 // holds the permit 12 s .. 25 s
    v.push_back(all());                  // from 1 s, behind "first" in the RPM queue
    v.push_back(direct("second", 21s));  // the start at 20 s was given back
    co_await sluice::gather(std::move(v));
  });
  // all: granted a start at 20 s (permit busy: given back), the permit at 25 s
  // (RPM busy until 31 s: released), then the start at 31 s with the permit.
  CHECK(order ==
        std::vector<std::pair<std::string, ns>>{{"first", 10s}, {"second", 21s}, {"all", 31s}});
}

namespace {
// Five calls for keys a, a, b, b, c through acquire_all(for_key(accounts, k),
// extra...); the provider's start times by key.
template <class... Extra>
std::vector<std::pair<std::string, ns>> keyed_run(Extra&... extra) {
  sluice::keyed_semaphore<std::string> accounts{1};
  slow_service svc({.latency = latency::fixed(5s), .key_quota = {.max_in_flight = 1}});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> v;
    for (std::string key : {"a", "a", "b", "b", "c"}) {
      v.push_back([](auto& ks, auto& s, std::string k, auto&... x) -> asio::awaitable<void> {
        auto held = co_await sluice::acquire_all(sluice::for_key(ks, k), x...);
        CHECK(held.template get<0>().key() == k);
        co_await s.call(k);
      }(accounts, svc, key, extra...));
    }
    co_await sluice::gather(std::move(v));
  });
  CHECK(svc.throttles() == 0);
  std::vector<std::pair<std::string, ns>> starts;
  for (const auto& r : svc.timeline()) starts.emplace_back(r.key, r.start);
  return starts;
}
}  // namespace

TEST_CASE("a keyed_semaphore with its key and a token_bucket are budgets too", "[acquire_all]") {
  // Keys alone: calls for other keys are not held back by a busy one.
  CHECK(keyed_run() == std::vector<std::pair<std::string, ns>>{
                           {"a", 0s}, {"b", 0s}, {"c", 0s}, {"a", 5s}, {"b", 5s}});
  // With a shared token bucket (1 per second, bursts of 2) every call names
  // the bucket: FIFO, the second a first (5 s), then b (5 s, a token left),
  // the second b when its key frees (10 s), then c.
  sluice::token_bucket bucket{1.0, 2};
  CHECK(keyed_run(bucket) == std::vector<std::pair<std::string, ns>>{
                                 {"a", 0s}, {"a", 5s}, {"b", 5s}, {"b", 10s}, {"c", 10s}});
}

TEST_CASE("all_held releases its permits on destruction or release(), rate starts stay",
          "[acquire_all]") {
  sluice::semaphore sem{2};
  sluice::rate_limiter rpm{1, 1min};
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    {
      auto held = co_await sluice::acquire_all(sem, rpm);
      CHECK(sem.value() == 1);
      auto moved = std::move(held);
      CHECK(sem.value() == 1);
      CHECK(moved.get<1>().n == 1);
      moved.release();
      CHECK(sem.value() == 2);
      moved.release();
      CHECK(sem.value() == 2);
    }
    CHECK(sem.value() == 2);
    CHECK_FALSE(rpm.try_acquire());  // the start stays recorded
  });
}

TEST_CASE("a weight no limiter could grant is refused at the call", "[acquire_all]") {
  sluice::rate_limiter tpm{100, 1min};
  CHECK_THROWS_AS(tpm.weighted(101), std::invalid_argument);
  CHECK_THROWS_AS(tpm.weighted(0), std::invalid_argument);
}

TEST_CASE("an adaptive_limit is a budget; its permit reports the call's outcome", "[acquire_all]") {
  sluice::adaptive_limit cap{{.initial = 2, .min = 1, .max = 2}};
  sluice::rate_limiter rpm{4, 1min};
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<void>> v;
    for (int i = 0; i < 6; ++i) {
      v.push_back([](auto& c, auto& r, auto& s) -> asio::awaitable<void> {
        auto held = co_await sluice::acquire_all(c, r);
        co_await s.call();
        held.template get<0>().succeeded();
      }(cap, rpm, svc));
    }
    co_await sluice::gather(std::move(v));
  });
  std::vector<ns> starts;
  for (const auto& r : svc.timeline()) starts.push_back(r.start);
  CHECK(starts == std::vector<ns>{0s, 0s, 1s, 1s, 60s, 60s});  // 2 in flight, 4 a minute
  CHECK(svc.max_in_flight() == 2);
  CHECK(cap.successes() == 6);
  CHECK(cap.in_flight() == 0);
}

TEST_CASE("a call cancelled after the older call it waited behind left takes nothing",
          "[acquire_all]") {
  // B waits behind A (both name `sem`). A is granted and leaves; A's caller
  // releases at once and cancels B before B resumes: B must not take the
  // permit and the RPM start it no longer wants.
  sluice::semaphore sem{1};
  sluice::rate_limiter rpm{1, 1min};
  tasks_on_loop t;
  sluice_test::task* b = nullptr;
  auto& holder = t.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire();
    co_await sluice::sleep(5s);
  });
  auto& a = t.spawn([&]() -> asio::awaitable<void> {
    auto held = co_await sluice::acquire_all(sem);
    held.release();
    b->cancel();  // B's wake-up is posted, B has not resumed
  });
  b = &t.spawn(
      [&]() -> asio::awaitable<void> { auto held = co_await sluice::acquire_all(sem, rpm); });
  t.loop.run_for(10s);
  CHECK(holder.succeeded());
  CHECK(a.succeeded());
  CHECK(b->cancelled());
  CHECK(sem.value() == 1);
  CHECK(sem.stats().acquired == 2);  // the holder's and A's
  CHECK(rpm.try_acquire());          // B recorded no start
}

TEST_CASE("a budget taken and given back without a wait is not counted", "[acquire_all]") {
  // The permit and the place are free at 0 s, the RPM start is not: the call
  // takes them, gives them back, waits for the start (60 s), takes them again.
  sluice::semaphore sem{1};
  sluice::adaptive_limit cap{{.initial = 2, .min = 1, .max = 2}};
  sluice::keyed_semaphore<std::string> accounts{1};
  sluice::rate_limiter rpm{1, 1min};
  virtual_loop loop;
  ns granted{-1};
  loop.run([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    co_await rpm.acquire();
    auto held =
        co_await sluice::acquire_all(sem, cap, sluice::for_key(accounts, std::string("a")), rpm);
    granted = now_of(ex);
    held.get<1>().succeeded();
  });
  CHECK(granted == 60s);
  CHECK(sem.stats().acquired == 1);
  CHECK(cap.stats().acquired == 1);
  CHECK(cap.stats().hold.count == 1);
  CHECK(cap.successes() == 1);
  CHECK(accounts.stats().acquired == 1);
  CHECK(rpm.stats().acquired == 2);
}

TEST_CASE("shared_semaphore and strand_bound budgets: all or none, FIFO, exact in virtual time",
          "[acquire_all]") {
  virtual_loop loop;
  sluice::shared_semaphore cap{1};
  sluice::strand_bound<sluice::rate_limiter> tpm{asio::make_strand(loop.get_executor()), 100, 1min};
  sluice::strand_bound<sluice::semaphore> other{asio::make_strand(loop.get_executor()), 1};
  std::vector<std::pair<std::string, ns>> order;
  bool direct_free_at_10s = false;
  loop.run([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    auto take = [&](std::string who, ns at, std::size_t n, ns hold) -> asio::awaitable<void> {
      co_await sluice::sleep(at);
      auto held = co_await sluice::acquire_all(cap, tpm.weighted(n));
      order.emplace_back(who, now_of(ex));
      co_await sluice::sleep(hold);
    };
    auto disjoint = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(3s);
      auto held = co_await sluice::acquire_all(other);
      order.emplace_back("D", now_of(ex));
    };
    auto probe = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(10s);  // B waits for the permit: it took no tokens
      direct_free_at_10s = co_await tpm.try_acquire(20);
    };
    std::vector<asio::awaitable<void>> v;
    v.push_back(take("A", 0s, 60, 20s));  // the permit until 20 s, 60 tokens until 60 s
    v.push_back(take("B", 1s, 20, 0s));   // waits for the permit (20 s)
    v.push_back(take("C", 2s, 10, 0s));   // behind B, though it names the same budgets
    v.push_back(disjoint());              // another budget: not held back
    v.push_back(probe());                 // 20 of the 40 free tokens
    co_await sluice::gather(std::move(v));
  });
  CHECK(direct_free_at_10s);
  // B at 20 s (the permit; 60 + 20 + 20 tokens fit), C then (its 10 do not
  // fit until A's 60 leave at 60 s).
  CHECK(order ==
        std::vector<std::pair<std::string, ns>>{{"A", 0s}, {"D", 3s}, {"B", 20s}, {"C", 60s}});
  CHECK(cap.value() == 1);
  CHECK(cap.stats().acquired == 3);
}

TEST_CASE("a caller cancelled before it calls takes nothing from budgets of any kind",
          "[acquire_all]") {
  tasks_on_loop t;
  sluice::shared_semaphore cap{1};
  sluice::strand_bound<sluice::semaphore> sem{asio::make_strand(t.loop.get_executor()), 0};
  sluice::strand_bound<sluice::rate_limiter> rpm{asio::make_strand(t.loop.get_executor()), 1, 1min};
  std::vector<std::string> how;
  auto& early = t.spawn([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::sleep(1s);
    } catch (const sluice::system_error&) {
    }
    co_await asio::this_coro::throw_if_cancelled(false);
    for (int i = 0; i < 2; ++i) {
      try {
        if (i == 0) {
          auto held = co_await sluice::acquire_all(cap, rpm);
        } else {
          co_await sem.acquire();  // no place free: it would wait
        }
        how.push_back("ok");
      } catch (const sluice::system_error& e) {
        how.push_back(e.code() == asio::error::operation_aborted ? "aborted" : e.what());
      }
    }
  });
  t.poll();
  early.cancel();
  t.loop.run_for(2s);
  CHECK(early.succeeded());
  CHECK(how == std::vector<std::string>{"aborted", "aborted"});
  CHECK(cap.value() == 1);
  CHECK(rpm.underlying().try_acquire());
  CHECK(sem.underlying().waiters() == 0);
}

namespace {

// What the server-shape sessions count outside the library.
struct counts {
  std::atomic<int> in_cap{0}, in_pool{0}, max_cap{0}, max_pool{0}, done{0};
};

// One session, on its own strand, with a loop-affine semaphore `own` of that
// strand, sharing `cap`, `pool` and `bucket` with every other session.
asio::awaitable<void> session(sluice::shared_semaphore& cap,
                              sluice::strand_bound<sluice::semaphore>& pool,
                              sluice::strand_bound<sluice::token_bucket>& bucket, counts& c,
                              std::shared_ptr<sluice::semaphore> own, int s, int rounds) {
  for (int r = 0; r < rounds; ++r) {
    const bool with_pool = (s + r) % 2 == 0;
    auto body = [&](auto& held) -> asio::awaitable<void> {
      sluice_test::raise_peak(c.max_cap, ++c.in_cap);
      if (with_pool) sluice_test::raise_peak(c.max_pool, ++c.in_pool);
      co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
      if (with_pool) --c.in_pool;
      --c.in_cap;
      held.release();
    };
    if (with_pool) {
      auto held = co_await sluice::acquire_all(*own, cap, pool, bucket.weighted(3));
      co_await body(held);
    } else {
      auto held = co_await sluice::acquire_all(cap, *own, bucket);
      co_await body(held);
    }
    ++c.done;
  }
}

}  // namespace

TEST_CASE("sessions on 4 threads mix their own budgets with shared ones: never over a cap",
          "[acquire_all][threads]") {
  // The server shape: one io_context run by 4 threads, each session on a
  // strand of its own with a loop-affine semaphore on that strand, all
  // sessions sharing a shared_semaphore, a strand_bound semaphore and a
  // strand_bound token bucket. Holders are counted outside the library.
  constexpr int sessions = 16, rounds = 25;
  asio::io_context ctx;
  counts c;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_error;
  // clang-format off
sluice::shared_semaphore cap{3};                                           // any thread
sluice::strand_bound<sluice::semaphore> pool{asio::make_strand(ctx), 2};   // any strand
sluice::strand_bound<sluice::token_bucket> bucket{asio::make_strand(ctx), 1e6, 1000};
  // clang-format on
  for (int s = 0; s < sessions; ++s) {
    auto strand = asio::make_strand(ctx);
    auto own = std::make_shared<sluice::semaphore>(strand, 1);
    asio::co_spawn(strand, session(cap, pool, bucket, c, own, s, rounds),
                   [&](std::exception_ptr e) {
                     if (!e) return;
                     ++failures;
                     std::lock_guard<std::mutex> lock(mu);
                     try {
                       std::rethrow_exception(e);
                     } catch (const std::exception& x) {
                       first_error = x.what();
                     }
                   });
  }
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { ctx.run(); });
  for (auto& th : threads) th.join();
  INFO(first_error);
  CHECK(failures.load() == 0);
  CHECK(c.done.load() == sessions * rounds);
  CHECK(c.max_cap.load() <= 3);
  CHECK(c.max_pool.load() <= 2);
  CHECK(cap.value() == 3);
  CHECK(pool.underlying().value() == 2);
}

namespace {

// How an adversarial round cuts its acquire_all short.
enum class cut { none, terminal, partial, total, before };

// One attempt's cancellation: emitted on the attempt's strand only while the
// attempt runs (its slot is cleared when it completes).
struct attempt_state {
  asio::cancellation_signal signal;
  bool running = true;
};

// Holders of the shared budgets, counted outside the library.
struct holders {
  std::atomic<int> cap{0}, pool{0}, alim{0}, max_cap{0}, max_pool{0}, max_alim{0};
  std::atomic<int> ok{0}, aborted{0}, wrong{0}, rpm_units{0};
  std::mutex mu;
  std::string first_wrong;
  void note_wrong(std::string what) {
    ++wrong;
    std::lock_guard<std::mutex> lock(mu);
    if (first_wrong.empty()) first_wrong = std::move(what);
  }
};

struct hold_count {
  std::atomic<int>* in[4] = {};
  std::atomic<int>* max[4] = {};
  int n = 0;
  void add(std::atomic<int>& c, std::atomic<int>& m) {
    in[n] = &c;
    max[n] = &m;
    sluice_test::raise_peak(m, ++c);
    ++n;
  }
  ~hold_count() {
    for (int i = 0; i < n; ++i) --*in[i];
  }
};

// Which shared budgets a round names, and how many rpm units.
struct names {
  bool cap = false, pool = false, alim = false, own = false;
  int rpm = 0;
};

// One acquire_all: `take()` makes the call. Counts the holders while it
// holds, then releases them; `how == before` calls only once cancelled.
template <class Take>
asio::awaitable<void> attempt(Take take, cut how, int hold, names n, holders& h,
                              std::atomic<int>& own_in, std::atomic<int>& own_max) {
  if (how == cut::partial || how == cut::total)
    co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
  if (how == cut::before) {
    co_await asio::this_coro::throw_if_cancelled(false);
    const auto cs = co_await asio::this_coro::cancellation_state;
    while (cs.cancelled() == asio::cancellation_type::none)
      co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  }
  auto held = co_await take();
  if (how == cut::before) h.note_wrong("a caller cancelled before it called was granted");
  {
    hold_count c;
    if (n.cap) c.add(h.cap, h.max_cap);
    if (n.pool) c.add(h.pool, h.max_pool);
    if (n.alim) c.add(h.alim, h.max_alim);
    if (n.own) c.add(own_in, own_max);
    h.rpm_units += n.rpm;
    for (int i = 0; i < hold; ++i)
      co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  }
  held.release();
}

struct shared_budgets {
  sluice::shared_semaphore cap{3};
  sluice::strand_bound<sluice::semaphore> pool;
  sluice::strand_bound<sluice::adaptive_limit> alim;
  sluice::strand_bound<sluice::rate_limiter> rpm;
  sluice::strand_bound<sluice::token_bucket> bucket;
  explicit shared_budgets(asio::io_context& ctx)
      : pool{asio::make_strand(ctx), 2},
        alim{asio::make_strand(ctx),
             sluice::adaptive_limit::options{.initial = 2, .min = 2, .max = 2}},
        rpm{asio::make_strand(ctx), 1'000'000, std::chrono::hours(1)},
        bucket{asio::make_strand(ctx), 20000.0, 6} {}
};

// Runs the attempt for round `r` on this strand, cancelled as `how` says
// after `delay` posts, and waits for it.
template <class Take>
asio::awaitable<void> round_of(Take take, cut how, int delay, names n, holders& h,
                               std::atomic<int>& own_in, std::atomic<int>& own_max) {
  auto ex = co_await asio::this_coro::executor;
  auto st = std::make_shared<attempt_state>();
  asio::steady_timer finished{ex, asio::steady_timer::time_point::max()};
  bool done = false;
  asio::co_spawn(ex, attempt(take, how, 1 + delay % 4, n, h, own_in, own_max),
                 sluice_test::bind_slot(st->signal.slot(), [&, st](std::exception_ptr e) {
                   st->running = false;
                   done = true;
                   finished.cancel();
                   if (!e) {
                     ++h.ok;
                     if (how != cut::before) return;
                   }
                   try {
                     if (e) std::rethrow_exception(e);
                   } catch (const sluice::system_error& x) {
                     if (x.code() == asio::error::operation_aborted && how != cut::none) {
                       ++h.aborted;
                       return;
                     }
                     h.note_wrong(x.what());
                   } catch (const std::exception& x) {
                     h.note_wrong(x.what());
                   }
                 }));
  if (how != cut::none) {
    const auto type = how == cut::partial ? asio::cancellation_type::partial
                      : how == cut::total ? asio::cancellation_type::total
                                          : asio::cancellation_type::terminal;
    asio::co_spawn(
        ex,
        [st, delay, type]() -> asio::awaitable<void> {
          for (int i = 0; i < delay; ++i)
            co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
          if (st->running) st->signal.emit(type);
        },
        asio::detached);
  }
  if (!done) {
    try {
      co_await finished.async_wait(asio::use_awaitable);
    } catch (const sluice::system_error&) {  // cancelled by the attempt's end
    }
  }
}

// A session's two coroutines share `own` and `own_tb` (loop-affine, on the
// session's strand) and the process-wide budgets; round r names a mix.
asio::awaitable<void> adversarial_session(shared_budgets& b, holders& h, sluice::semaphore& own,
                                          sluice::token_bucket& own_tb, std::atomic<int>& own_in,
                                          std::atomic<int>& own_max, unsigned seed, int rounds) {
  std::minstd_rand rng(seed);
  for (int r = 0; r < rounds; ++r) {
    const cut how = static_cast<cut>(rng() % 5 == 0 ? 0 : rng() % 5);
    const int delay = static_cast<int>(rng() % 16);
    switch (rng() % 6) {
      case 0:
        co_await round_of(
            [&] { return sluice::acquire_all(own, b.cap, b.pool, b.bucket.weighted(3)); }, how,
            delay, {.cap = true, .pool = true, .own = true}, h, own_in, own_max);
        break;
      case 1:
        co_await round_of([&] { return sluice::acquire_all(b.cap, b.alim, b.rpm); }, how, delay,
                          {.cap = true, .alim = true, .rpm = 1}, h, own_in, own_max);
        break;
      case 2:
        co_await round_of([&] { return sluice::acquire_all(b.pool, b.alim, own_tb); }, how, delay,
                          {.pool = true, .alim = true}, h, own_in, own_max);
        break;
      case 3:
        co_await round_of([&] { return sluice::acquire_all(own, b.rpm.weighted(2), b.cap); }, how,
                          delay, {.cap = true, .own = true, .rpm = 2}, h, own_in, own_max);
        break;
      case 4:
        co_await round_of([&] { return sluice::acquire_all(b.bucket, b.pool, b.cap, b.alim); }, how,
                          delay, {.cap = true, .pool = true, .alim = true}, h, own_in, own_max);
        break;
      default:
        co_await round_of([&] { return sluice::acquire_all(b.cap, own); }, how, delay,
                          {.cap = true, .own = true}, h, own_in, own_max);
        break;
    }
  }
}

// Stops `ctx` if the test has not finished within `limit` (a lost wakeup
// would otherwise hang the suite); true when it had to.
struct watchdog {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::atomic<bool> fired{false};
  std::thread th;
  watchdog(asio::io_context& ctx, std::chrono::seconds limit)
      : th([this, &ctx, limit] {
          std::unique_lock<std::mutex> lock(mu);
          if (!cv.wait_for(lock, limit, [this] { return finished; })) {
            fired = true;
            ctx.stop();
          }
        }) {}
  void done() {
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
    }
    cv.notify_all();
    th.join();
  }
};

}  // namespace

TEST_CASE(
    "review: acquire_all on 4 threads, cancelled at every step, never over a cap, loses nothing",
    "[acquire_all][threads]") {
  // Sessions on strands of a 4-thread io_context mix their own loop-affine
  // budgets with a shared_semaphore and strand_bound semaphore, adaptive_limit,
  // rate_limiter and token_bucket (weighted too); rounds are cancelled after
  // 0-15 posts (terminal, partial, total) or before they call. Holders and rate
  // units are counted outside the library.
  constexpr int strands = 8, per_strand = 3, rounds = 60;
  asio::io_context ctx;
  holders h;
  shared_budgets b{ctx};
  struct own_budgets {
    sluice::semaphore sem;
    sluice::token_bucket tb;
    std::atomic<int> in{0}, max{0};
    explicit own_budgets(const asio::any_io_executor& s) : sem{s, 1}, tb{s, 2000.0, 2} {}
  };
  std::vector<std::unique_ptr<own_budgets>> owns;
  for (int s = 0; s < strands; ++s) {
    const asio::any_io_executor strand = asio::make_strand(ctx);
    owns.push_back(std::make_unique<own_budgets>(strand));
    auto& o = *owns.back();
    for (int k = 0; k < per_strand; ++k)
      asio::co_spawn(strand,
                     adversarial_session(b, h, o.sem, o.tb, o.in, o.max,
                                         static_cast<unsigned>(1 + s * per_strand + k), rounds),
                     [&](std::exception_ptr e) {
                       if (e) h.note_wrong("a session failed");
                     });
  }
  watchdog dog{ctx, std::chrono::seconds(600)};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { ctx.run(); });
  for (auto& th : threads) th.join();
  dog.done();
  INFO(h.first_wrong);
  CHECK(h.ok.load() > 0);  // both ways out were exercised
  CHECK(h.aborted.load() > 0);
  CHECK_FALSE(dog.fired.load());
  CHECK(h.wrong.load() == 0);
  CHECK(h.ok.load() + h.aborted.load() == strands * per_strand * rounds);
  CHECK(h.max_cap.load() <= 3);
  CHECK(h.max_pool.load() <= 2);
  CHECK(h.max_alim.load() <= 2);
  CHECK(b.cap.value() == 3);
  CHECK(b.cap.waiters() == 0);
  CHECK(b.pool.underlying().value() == 2);
  CHECK(b.alim.underlying().in_flight() == 0);
  CHECK(b.rpm.underlying().stats().in_use == static_cast<std::size_t>(h.rpm_units.load()));
  CHECK(b.bucket.underlying().waiters() == 0);
  for (auto& o : owns) {
    CHECK(o->max.load() <= 1);
    CHECK(o->sem.value() == 1);
    CHECK(o->tb.waiters() == 0);
  }
}

namespace {

struct loop_end_counts {
  std::atomic<int> in_cap{0}, max_cap{0}, in_pool{0}, max_pool{0}, rpm_units{0}, steady{0};
  std::atomic<int> granted{0}, wrong{0};
};

// One caller: all of cap, pool, own and (every other one) rpm; holds for a
// few posts. Its loop may be destroyed at any step.
asio::awaitable<void> batch_caller(sluice::shared_semaphore& cap,
                                   sluice::strand_bound<sluice::semaphore>& pool,
                                   sluice::strand_bound<sluice::rate_limiter>& rpm,
                                   sluice::semaphore& own, loop_end_counts& c, int k) {
  auto ex = co_await asio::this_coro::executor;
  for (int round = 0;; ++round) {
    const bool with_rpm = (k + round) % 2 == 0;
    auto hold = [&]([[maybe_unused]] auto held) -> asio::awaitable<void> {
      ++c.granted;
      if (with_rpm) ++c.rpm_units;
      hold_count h;
      h.add(c.in_cap, c.max_cap);
      h.add(c.in_pool, c.max_pool);
      for (int i = 0; i <= k % 3; ++i) co_await asio::post(ex, asio::use_awaitable);
    };
    if (with_rpm) {
      co_await hold(co_await sluice::acquire_all(cap, pool, own, rpm));
    } else {
      co_await hold(co_await sluice::acquire_all(own, pool, cap));
    }
  }
}

}  // namespace

TEST_CASE("review: acquire_all callers' loops destroyed mid-call, batch after batch, free all",
          "[acquire_all][threads]") {
  // Two threads each make a loop per batch, start callers on it, run it
  // briefly and destroy it with calls waiting at every step (behind an older
  // call, on the shared_semaphore, on the strand_bound's strand, on their own
  // semaphore, holding). Meanwhile steady sessions on a 2-thread io_context
  // use the same budgets to the end. Nothing is lost; nothing hangs.
  constexpr int batches = 40, steady_sessions = 4, steady_rounds = 150;
  asio::io_context main_ctx;
  auto work = asio::make_work_guard(main_ctx);
  sluice::shared_semaphore cap{2};
  sluice::strand_bound<sluice::semaphore> pool{asio::make_strand(main_ctx), 1};
  sluice::strand_bound<sluice::rate_limiter> rpm{asio::make_strand(main_ctx), 1'000'000,
                                                 std::chrono::hours(1)};
  loop_end_counts c;
  std::atomic<int> steady_left{steady_sessions};
  for (int s = 0; s < steady_sessions; ++s) {
    asio::co_spawn(
        asio::make_strand(main_ctx),
        [&]() -> asio::awaitable<void> {
          for (int r = 0; r < steady_rounds; ++r) {
            auto held = co_await sluice::acquire_all(cap, pool);
            hold_count h;
            h.add(c.in_cap, c.max_cap);
            h.add(c.in_pool, c.max_pool);
            co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
          }
          ++c.steady;
        },
        [&](std::exception_ptr e) {
          if (e) ++c.wrong;
          if (--steady_left == 0) work.reset();
        });
  }
  watchdog dog{main_ctx, std::chrono::seconds(600)};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) threads.emplace_back([&] { main_ctx.run(); });
  std::vector<std::thread> batchers;
  for (int t = 0; t < 2; ++t) {
    batchers.emplace_back([&, t] {
      std::minstd_rand rng(static_cast<unsigned>(7 + t));
      for (int b = 0; b < batches; ++b) {
        std::optional<sluice::semaphore> own;  // outlives the loop: its frames release to it
        asio::io_context loop;
        own.emplace(loop.get_executor(), 1);
        for (int k = 0; k < 4; ++k)
          asio::co_spawn(loop, batch_caller(cap, pool, rpm, *own, c, k), asio::detached);
        const int steps = static_cast<int>(rng() % 40);
        for (int i = 0; i < steps; ++i) {
          loop.poll();
          if (rng() % 4 == 0) std::this_thread::yield();
        }
      }  // the loop dies here, its callers mid-call
    });
  }
  for (auto& th : batchers) th.join();
  for (auto& th : threads) th.join();
  dog.done();
  CHECK_FALSE(dog.fired.load());
  CHECK(c.wrong.load() == 0);
  CHECK(c.steady.load() == steady_sessions);
  CHECK(c.max_cap.load() <= 2);
  CHECK(c.max_pool.load() <= 1);
  CHECK(cap.value() == 2);
  CHECK(cap.waiters() == 0);
  CHECK(pool.underlying().value() == 1);
  CHECK(pool.underlying().waiters() == 0);
  CHECK(rpm.underlying().stats().in_use == static_cast<std::size_t>(c.rpm_units.load()));
  UNSCOPED_INFO("grants to callers whose loops died: " << c.granted.load());
}

TEST_CASE("review: a budget destroyed while acquire_all waits on it fails the call, not the others",
          "[acquire_all]") {
  // The waiting call throws operation_aborted holding nothing; the call that
  // waited behind it (sharing another budget) goes on.
  tasks_on_loop t;
  const auto ex = t.loop.get_executor();
  const bool on_strand = GENERATE(false, true);
  auto plain = std::make_unique<sluice::semaphore>(ex, 0);
  auto bound = std::make_unique<sluice::strand_bound<sluice::semaphore>>(asio::make_strand(ex), 0);
  sluice::semaphore shared{ex, 1};
  sluice::rate_limiter rpm{ex, 10, 1min};
  auto& first = t.spawn([&]() -> asio::awaitable<void> {
    if (on_strand) {
      auto held = co_await sluice::acquire_all(shared, *bound, rpm);
    } else {
      auto held = co_await sluice::acquire_all(shared, *plain, rpm);
    }
  });
  auto& second = t.spawn([&]() -> asio::awaitable<void> {
    auto held = co_await sluice::acquire_all(shared, rpm.weighted(2));
  });
  t.poll();
  REQUIRE_FALSE(first.done);
  REQUIRE_FALSE(second.done);  // behind the first: FIFO
  if (on_strand) {
    bound.reset();
  } else {
    plain.reset();
  }
  t.poll();
  CHECK(first.cancelled());
  CHECK(second.succeeded());
  CHECK(shared.value() == 1);
  CHECK(rpm.stats().in_use == 2);  // the second's two starts only
}
