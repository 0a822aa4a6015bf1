// SPDX-License-Identifier: BSL-1.0
// keyed_semaphore: DESIGN.md "Beyond asyncio", semantics 1, and pynenc's keyed
// concurrency scenarios (background/keyed-concurrency-pynenc.txt) on the
// simulated provider.
#include <sluice/keyed_semaphore.hpp>

#include <sluice/gather.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/death.hpp>
#include <support/ending.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <future>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using sluice::testing::latency::fixed;
using sluice_test::tasks_on_loop;
using keyed = sluice::keyed_semaphore<std::string>;

namespace {

// pynenc's demo: 4 operations for each of 3 accounts, enqueued operation by
// operation; the provider holds an account for 0.4 s per call and counts a
// collision whenever a second call for an account arrives while one is in
// flight.
struct job {
  std::string account, op;
};

std::vector<job> pynenc_jobs() {
  std::vector<job> jobs;
  for (const char* op : {"fetch_profile", "list_invoices", "update_metadata", "refresh_usage"})
    for (const char* account : {"acme", "globex", "initech"}) jobs.push_back({account, op});
  return jobs;
}

slow_service pynenc_provider() {
  return slow_service({.latency = fixed(400ms)});
}

// All jobs at once, each through `run_job` (a coroutine lambda: it must
// outlive the jobs, so it is passed by reference).
template <class RunJob>
std::vector<asio::awaitable<void>> all_jobs(RunJob& run_job) {
  std::vector<asio::awaitable<void>> v;
  for (auto& j : pynenc_jobs()) v.push_back(run_job(j));
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------
// The pynenc scenarios.

TEST_CASE("without control, jobs for the same account collide at the provider",
          "[keyed_semaphore]") {
  auto svc = pynenc_provider();
  virtual_loop loop;
  auto unguarded = [&](const job& j) {
    return svc.call(j.account, j.op);
  };
  loop.run(sluice::gather(all_jobs(unguarded)));
  CHECK(svc.calls() == 12);
  CHECK(svc.collisions() == 9);
  for (const char* a : {"acme", "globex", "initech"}) CHECK(svc.collisions(a) == 3);
  CHECK(loop.now() == 400ms);
}

TEST_CASE("keyed wait runs all 12 jobs with no collision, one lane per account",
          "[keyed_semaphore]") {
  auto svc = pynenc_provider();
  keyed per_account{1};
  virtual_loop loop;
  auto wait_for_account = [&](job j) -> asio::awaitable<void> {
    auto permit = co_await per_account.scoped_acquire(j.account);
    co_await svc.call(j.account, j.op);
  };
  loop.run(sluice::gather(all_jobs(wait_for_account)));
  CHECK(svc.calls() == 12);
  CHECK(svc.completed() == 12);
  CHECK(svc.collisions() == 0);
  for (const char* a : {"acme", "globex", "initech"}) CHECK(svc.max_in_flight(a) == 1);
  CHECK(svc.max_in_flight() == 3);
  CHECK(loop.now() == 1600ms);  // 4 calls of 0.4 s per account, the accounts in parallel
  // Each account's jobs ran in arrival order.
  std::vector<std::string> acme_ops;
  for (auto& r : svc.timeline())
    if (r.key == "acme") acme_ops.push_back(r.op);
  CHECK(acme_ops == std::vector<std::string>{"fetch_profile", "list_invoices", "update_metadata",
                                             "refresh_usage"});
  CHECK(per_account.keys() == 0);
}

TEST_CASE("keyed drop runs only the jobs whose account was free and drops the rest",
          "[keyed_semaphore]") {
  auto svc = pynenc_provider();
  keyed per_account{1};
  std::vector<std::string> dropped;
  virtual_loop loop;
  auto drop_if_busy = [&](job j) -> asio::awaitable<void> {
    auto permit = per_account.try_acquire(j.account);
    if (!permit) {
      dropped.push_back(j.account + "/" + j.op);
      co_return;
    }
    co_await svc.call(j.account, j.op);
  };
  loop.run(sluice::gather(all_jobs(drop_if_busy)));
  CHECK(svc.calls() == 3);
  CHECK(svc.collisions() == 0);
  CHECK(dropped.size() == 9);
  for (auto& r : svc.timeline()) CHECK(r.op == "fetch_profile");
  CHECK(loop.now() == 400ms);
  CHECK(per_account.keys() == 0);
}

TEST_CASE("per_key 2 allows exactly two calls per account at once", "[keyed_semaphore]") {
  // The provider allows two per account: a third is throttled.
  slow_service svc({.latency = fixed(400ms), .key_quota = {.max_in_flight = 2}});
  keyed per_account{2};
  std::size_t most_held = 0;
  virtual_loop loop;
  auto two_per_account = [&](job j) -> asio::awaitable<void> {
    auto permit = co_await per_account.scoped_acquire(j.account);
    most_held = std::max(most_held, 2 - per_account.value(j.account));
    co_await svc.call(j.account, j.op);
  };
  loop.run(sluice::gather(all_jobs(two_per_account)));
  CHECK(svc.calls() == 12);
  CHECK(svc.throttles() == 0);
  for (const char* a : {"acme", "globex", "initech"}) CHECK(svc.max_in_flight(a) == 2);
  CHECK(most_held == 2);
  CHECK(loop.now() == 800ms);

  // Without the keyed semaphore the same provider throttles.
  slow_service unguarded({.latency = fixed(400ms), .key_quota = {.max_in_flight = 2}});
  virtual_loop loop2;
  auto direct = [&](const job& j) {
    return unguarded.call(j.account, j.op);
  };
  loop2.run(sluice::gather(all_jobs(direct), sluice::return_exceptions));
  CHECK(unguarded.throttles() == 6);
}

// ---------------------------------------------------------------------------
// Semantics of one key, and independence of keys.

TEST_CASE("value waiters and keys are exact at every step", "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{h.loop.get_executor(), 2};
  CHECK(ks.per_key() == 2);
  CHECK(ks.keys() == 0);
  CHECK(ks.value("a") == 2);
  CHECK(ks.waiters("a") == 0);
  auto p1 = ks.try_acquire("a");
  REQUIRE(p1);
  CHECK(p1->key() == "a");
  CHECK(ks.keys() == 1);
  CHECK(ks.value("a") == 1);
  auto p2 = ks.try_acquire("a");
  REQUIRE(p2);
  CHECK(ks.value("a") == 0);
  CHECK_FALSE(ks.try_acquire("a"));
  CHECK(ks.keys() == 1);
  auto& w = h.spawn([&]() -> asio::awaitable<void> { co_await ks.acquire("a"); });
  h.poll();
  CHECK(ks.waiters("a") == 1);
  CHECK(ks.waiters("b") == 0);
  p1.reset();  // handed to the waiter
  CHECK(ks.value("a") == 0);
  CHECK(ks.waiters("a") == 0);
  h.poll();
  CHECK(w.succeeded());
  p2.reset();
  CHECK(ks.value("a") == 1);
  CHECK(ks.keys() == 1);
  ks.release("a");  // the waiter's permit, by hand
  CHECK(ks.value("a") == 2);
  CHECK(ks.keys() == 0);
}

TEST_CASE("a key's waiters are served in FIFO order when the head waiter is cancelled",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{1};
  auto holder = ks.try_acquire("k");
  REQUIRE(holder);
  std::vector<int> order;
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 4; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      auto p = co_await ks.scoped_acquire("k");
      order.push_back(i);
      co_await sluice::sleep(1s);
    }));
  }
  h.poll();
  CHECK(ks.waiters("k") == 4);
  t[0]->cancel();  // the head waiter
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(ks.waiters("k") == 3);
  CHECK(ks.keys() == 1);
  holder.reset();
  h.loop.run_for(10s);
  CHECK(order == std::vector<int>{2, 3, 4});
  CHECK(ks.keys() == 0);
}

TEST_CASE("try_acquire fails while a key has waiters, and a re-acquire queues at the back",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{1};
  std::vector<int> order;
  REQUIRE(ks.try_acquire("k").has_value());  // taken and released at once
  auto held = ks.try_acquire("k");
  REQUIRE(held);
  for (int i = 2; i <= 3; ++i) {
    h.spawn([&, i]() -> asio::awaitable<void> {
      co_await ks.acquire("k");
      order.push_back(i);
      ks.release("k");
    });
  }
  h.poll();
  auto& one = h.spawn([&]() -> asio::awaitable<void> {
    held.reset();
    CHECK_FALSE(ks.try_acquire("k"));  // no barging past the waiters
    co_await ks.acquire("k");
    order.push_back(1);
    ks.release("k");
  });
  h.poll();
  CHECK(one.succeeded());
  CHECK(order == std::vector<int>{2, 3, 1});
  CHECK(ks.keys() == 0);
}

TEST_CASE("a busy key never delays another key", "[keyed_semaphore]") {
  slow_service svc({.latency = fixed(1s)});
  keyed ks{1};
  std::vector<std::chrono::nanoseconds> b_started;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto busy = [&]() -> asio::awaitable<void> {
      auto p = co_await ks.scoped_acquire("a");
      co_await sluice::sleep(1h);
    };
    auto queued_on_a = [&]() -> asio::awaitable<void> {
      auto p = co_await ks.scoped_acquire("a");  // waits the whole hour
    };
    auto b_jobs = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 3; ++i) {
        auto p = co_await ks.scoped_acquire("b");
        b_started.push_back(loop.now());
        co_await svc.call("b");
      }
    };
    co_await (busy() && queued_on_a() && b_jobs());
  });
  CHECK(b_started == std::vector<std::chrono::nanoseconds>{0s, 1s, 2s});
  CHECK(loop.now() == 1h);
  CHECK(ks.keys() == 0);
}

TEST_CASE("a million distinct keys leave no entry behind", "[keyed_semaphore]") {
  sluice::keyed_semaphore<int> ks{1};
  std::size_t most_keys = 0;
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i = 0; i < 1'000'000; ++i) {
      if (i % 2 == 0) {
        auto p = co_await ks.scoped_acquire(i);
        most_keys = std::max(most_keys, ks.keys());
      } else {
        auto p = ks.try_acquire(i);
        most_keys = std::max(most_keys, ks.keys());
      }
    }
  });
  CHECK(most_keys == 1);
  CHECK(ks.keys() == 0);
}

TEST_CASE("a freed entry reused for the next key keeps no trace of the old one",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{2};
  { auto a = ks.try_acquire("a"); }  // "a" freed: its node is kept spare
  auto b1 = ks.try_acquire("b");     // ...and reused for "b"
  REQUIRE(b1);
  CHECK(b1->key() == "b");
  CHECK(ks.keys() == 1);
  CHECK(ks.value("a") == 2);
  CHECK(ks.value("b") == 1);
  auto b2 = ks.try_acquire("b");
  CHECK_FALSE(ks.try_acquire("b"));
  auto a = ks.try_acquire("a");
  REQUIRE(a);
  CHECK(ks.value("a") == 1);
  auto& w = h.spawn([&]() -> asio::awaitable<void> { co_await ks.acquire("b"); });
  h.poll();
  CHECK(ks.waiters("b") == 1);
  CHECK(ks.waiters("a") == 0);
  b1.reset();
  h.poll();
  CHECK(w.succeeded());
  b2.reset();
  ks.release("b");
  a.reset();
  CHECK(ks.keys() == 0);
  CHECK(ks.value("b") == 2);
}

TEST_CASE("a key's entry is freed when its last holder leaves after its waiters were cancelled",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{1};
  auto holder = ks.try_acquire("k");
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await ks.acquire("k"); });
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await ks.acquire("k"); });
  h.poll();
  b.cancel();
  a.cancel();
  h.poll();
  CHECK(a.cancelled());
  CHECK(b.cancelled());
  CHECK(ks.waiters("k") == 0);
  CHECK(ks.keys() == 1);  // still held
  holder.reset();
  CHECK(ks.keys() == 0);
}

// ---------------------------------------------------------------------------
// Cancellation at every suspension point.

TEST_CASE("a waiter granted then cancelled before it resumes hands its permit on",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{1};
  std::vector<int> order;
  auto holder = ks.try_acquire("k");
  std::vector<sluice_test::task*> t;
  for (int i = 1; i <= 2; ++i) {
    t.push_back(&h.spawn([&, i]() -> asio::awaitable<void> {
      co_await ks.acquire("k");
      order.push_back(i);
      ks.release("k");
    }));
  }
  h.poll();
  holder.reset();  // granted to 1...
  t[0]->cancel();  // ...which is cancelled before it runs: 2 gets the permit
  h.poll();
  CHECK(t[0]->cancelled());
  CHECK(t[1]->succeeded());
  CHECK(order == std::vector<int>{2});
  CHECK(ks.keys() == 0);

  // The same with nobody behind it: the entry is freed.
  holder = *ks.try_acquire("k");
  auto& last =
      h.spawn([&]() -> asio::awaitable<void> { auto p = co_await ks.scoped_acquire("k"); });
  h.poll();
  holder.reset();
  last.cancel();
  h.poll();
  CHECK(last.cancelled());
  CHECK(ks.keys() == 0);
}

TEST_CASE("a caller cancelled before it called a busy key holds nothing and waits for nothing",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  keyed ks{1};
  auto holder = ks.try_acquire("k");
  auto& t = h.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    try {
      co_await sluice::sleep(1h);  // cancelled here...
    } catch (const sluice::system_error&) {
    }
    co_await asio::this_coro::throw_if_cancelled(true);
    auto p = co_await ks.scoped_acquire("k");  // ...then calls
  });
  h.poll();
  t.cancel();
  h.poll();
  CHECK(t.cancelled());
  CHECK(ks.waiters("k") == 0);
  CHECK(ks.value("k") == 0);
  holder.reset();
  CHECK(ks.keys() == 0);
}

TEST_CASE("a timeout racing a grant on a key never loses a permit", "[keyed_semaphore]") {
  virtual_loop loop;
  keyed ks{1};
  int got = 0, timed_out = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto holder = [&]() -> asio::awaitable<void> {
      auto p = co_await ks.scoped_acquire("k");
      co_await sluice::sleep(1s);
    };
    auto contender = [&]() -> asio::awaitable<void> {
      auto r = co_await (ks.scoped_acquire("k") || sluice::sleep(1s));
      (r.index() == 0 ? got : timed_out) += 1;
    };
    co_await (holder() && contender() && contender());
  });
  CHECK(got + timed_out == 2);
  CHECK(ks.keys() == 0);
}

TEST_CASE("async_acquire works with use_awaitable, a plain callback and use_future",
          "[keyed_semaphore]") {
  virtual_loop loop;
  keyed ks{loop.get_executor(), 1};
  sluice::error_code cb = asio::error::would_block;
  ks.async_acquire("cb", [&](sluice::error_code ec) { cb = ec; });
  CHECK(ks.value("cb") == 0);  // taken at initiation, completed through a post
  std::future<void> fut = ks.async_acquire("fut", asio::use_future);
  loop.run([&]() -> asio::awaitable<void> {
    co_await ks.async_acquire("aw", asio::use_awaitable);
    ks.release("aw");
  });
  CHECK_FALSE(cb);
  fut.get();
  CHECK(ks.keys() == 2);
  ks.release("cb");
  ks.release("fut");
  CHECK(ks.keys() == 0);
}

TEST_CASE("callback waiters on a key: cancelled before the grant aborts, after it keeps the permit",
          "[keyed_semaphore]") {
  virtual_loop loop;
  keyed ks{loop.get_executor(), 1};
  auto holder = ks.try_acquire("k");
  asio::cancellation_signal s1, s2;
  sluice::error_code e1 = asio::error::would_block, e2 = asio::error::would_block;
  ks.async_acquire(
      "k", asio::bind_cancellation_slot(s1.slot(), [&](sluice::error_code ec) { e1 = ec; }));
  ks.async_acquire(
      "k", asio::bind_cancellation_slot(s2.slot(), [&](sluice::error_code ec) { e2 = ec; }));
  s1.emit(asio::cancellation_type::terminal);
  holder.reset();                              // granted to the second
  s2.emit(asio::cancellation_type::terminal);  // too late
  loop.poll();
  CHECK(e1 == asio::error::operation_aborted);
  CHECK_FALSE(e2);
  CHECK(ks.value("k") == 0);
  ks.release("k");
  CHECK(ks.keys() == 0);
}

TEST_CASE("waiters on a strand are handed a key's permits and resume on the strand",
          "[keyed_semaphore]") {
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  keyed ks{strand, 1};
  int resumed_on_strand = 0;
  std::vector<std::chrono::nanoseconds> acquired_at;
  for (int i = 0; i < 3; ++i) {
    asio::co_spawn(
        strand,
        [&]() -> asio::awaitable<void> {
          auto permit = co_await ks.scoped_acquire("k");
          resumed_on_strand += strand.running_in_this_thread() ? 1 : 0;
          acquired_at.push_back(loop.now());
          co_await sluice::sleep(1s);
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  loop.run_for(10s);
  CHECK(resumed_on_strand == 3);
  CHECK(acquired_at == std::vector<std::chrono::nanoseconds>{0s, 1s, 2s});
  CHECK(ks.keys() == 0);
}

// ---------------------------------------------------------------------------
// Bad input, destruction, affinity, customisation.

TEST_CASE("per_key 0 is rejected with invalid_argument", "[keyed_semaphore]") {
  CHECK_THROWS_AS(keyed{0}, std::invalid_argument);
  virtual_loop loop;
  CHECK_THROWS_AS(keyed(loop.get_executor(), 0), std::invalid_argument);
}

TEST_CASE("releasing a key that is not held throws logic_error and changes nothing",
          "[keyed_semaphore]") {
  virtual_loop loop;
  keyed ks{2};
  CHECK_THROWS_AS(ks.release("nobody"), std::logic_error);
  loop.run([&]() -> asio::awaitable<void> { co_await ks.acquire("a"); });
  CHECK(ks.value("a") == 1);
  ks.release("a");
  CHECK_THROWS_AS(ks.release("a"), std::logic_error);
  CHECK(ks.keys() == 0);
  CHECK(ks.value("a") == 2);
}

TEST_CASE("a bare callback on a keyed semaphore without an executor is rejected, keeping nothing",
          "[keyed_semaphore]") {
  keyed ks{1};
  CHECK_THROWS_AS(ks.async_acquire("k", [](sluice::error_code) {}), std::invalid_argument);
  CHECK(ks.keys() == 0);
}

TEST_CASE("destroying a keyed semaphore with waiters completes them with operation_aborted",
          "[keyed_semaphore]") {
  tasks_on_loop h;
  auto ks = std::make_unique<keyed>(1);
  // Holders that never release (permits must not outlive the keyed semaphore).
  auto& a_holder = h.spawn([&]() -> asio::awaitable<void> { co_await ks->acquire("a"); });
  auto& b_holder = h.spawn([&]() -> asio::awaitable<void> { co_await ks->acquire("b"); });
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await ks->acquire("a"); });
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await ks->acquire("b"); });
  h.poll();
  sluice::error_code cb_ec;
  ks->async_acquire(
      "b", asio::bind_executor(h.loop.get_executor(), [&](sluice::error_code ec) { cb_ec = ec; }));
  h.poll();
  CHECK(a_holder.succeeded());
  CHECK(b_holder.succeeded());
  CHECK(ks->waiters("b") == 2);
  ks.reset();
  h.poll();
  CHECK(a.cancelled());
  CHECK(b.cancelled());
  CHECK(cb_ec == asio::error::operation_aborted);
}

TEST_CASE("Hash and KeyEqual decide which keys are the same", "[keyed_semaphore]") {
  struct ci_hash {
    std::size_t operator()(const std::string& s) const {
      std::string l(s);
      std::transform(l.begin(), l.end(), l.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      return std::hash<std::string>{}(l);
    }
  };
  struct ci_equal {
    bool operator()(const std::string& a, const std::string& b) const {
      return std::equal(
          a.begin(), a.end(), b.begin(), b.end(),
          [](unsigned char x, unsigned char y) { return std::tolower(x) == std::tolower(y); });
    }
  };
  sluice::keyed_semaphore<std::string, ci_hash, ci_equal> ks{1};
  auto p = ks.try_acquire("ACME");
  REQUIRE(p);
  CHECK_FALSE(ks.try_acquire("acme"));
  CHECK(ks.try_acquire("globex"));
  CHECK(ks.keys() == 1);
}

#if SLUICE_AFFINITY_CHECKS && SLUICE_TEST_CAN_FORK
TEST_CASE("a keyed semaphore used from a thread that is not running its loop aborts naming it",
          "[keyed_semaphore][affinity]") {
  auto r = sluice_test::run_in_child([] {
    asio::io_context ctx;
    keyed ks{ctx.get_executor(), 1};
    std::optional<keyed::permit> p;
    auto busy = asio::make_work_guard(ctx);  // the loop keeps running on t
    std::promise<void> used;
    asio::post(ctx, [&] {
      p = ks.try_acquire("k");
      used.set_value();
    });
    std::thread t([&] { ctx.run(); });
    used.get_future().wait();
    ks.release("k");  // main thread, while the loop runs on t
    busy.reset();
    t.join();
  });
  CHECK(r.aborted);
  CHECK(r.stderr_text.find("sluice::keyed_semaphore") != std::string::npos);
}
#endif
