// SPDX-License-Identifier: BSL-1.0
// sluice::acquire_all: DESIGN.md "Providers that push back", semantics 3.
// Every timing is exact, in virtual time; the server-shape cases on real
// threads assert counts only.
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
#include <support/spawned.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
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

void raise_to(std::atomic<int>& max, int v) {
  int m = max.load();
  while (v > m && !max.compare_exchange_weak(m, v)) {
  }
}

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
      raise_to(c.max_cap, ++c.in_cap);
      if (with_pool) raise_to(c.max_pool, ++c.in_pool);
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
