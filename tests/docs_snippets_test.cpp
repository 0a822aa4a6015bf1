// SPDX-License-Identifier: BSL-1.0
// The snippets of README.md and the docs/ pages, compiled and run. Each
// snippet sits verbatim between `// clang-format off` and `// clang-format on`
// (so the page and this file stay identical line for line) in a test case
// that gives it the names it uses and checks what it did. ctest's docs_check
// (tests/docs/check_docs.py) fails when a ```cpp block of a page that names
// this file in its `<!-- snippets: ... -->` line is not found here. The Redis
// page's snippet lives in tests/redis_docs_test.cpp (it needs a
// redis-server). Add a page's new snippet to that page's section below.
#include <support/asio.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// ---- README.md: the quick start ------------------------------------------

// The names the quick start uses (at global scope, as in a user's file).
struct place_list {
  std::string category;
};

struct places_api {
  std::size_t calls = 0;
  std::size_t in_flight = 0;
  std::size_t max_in_flight = 0;
};

const std::vector<std::string> categories = {"grocery", "pharmacy", "school", "park",
                                             "gym",     "cafe",     "bank",   "library"};

std::size_t failures_logged = 0;

void log_failure(const std::exception_ptr& e) {
  if (e) ++failures_logged;
}

asio::awaitable<place_list> failing_search() {
  throw std::runtime_error("places api: 503");
  co_return place_list{};
}

asio::awaitable<place_list> find_nearby(places_api& api, std::string category);

std::vector<asio::awaitable<place_list>> more_searches(places_api& api) {
  std::vector<asio::awaitable<place_list>> v;
  v.push_back(find_nearby(api, "hospital"));
  v.push_back(failing_search());
  return v;
}

// clang-format off
#include <sluice/sluice.hpp>

asio::awaitable<place_list> find_nearby(places_api& api, std::string category);

asio::awaitable<void> discover(places_api& api) {
  std::vector<asio::awaitable<place_list>> searches;
  for (auto& c : categories) searches.push_back(find_nearby(api, c));

  // At most 5 calls in flight; the next starts the instant one finishes.
  // Results in input order. The first failure cancels the others, waits for
  // them, and is rethrown: nothing keeps running after this line.
  std::vector<place_list> found = co_await sluice::gather_with_concurrency(5, std::move(searches));

  // Or settle: every call runs, each slot holds a value or an exception.
  auto outcomes = co_await sluice::gather(more_searches(api), sluice::return_exceptions);
  for (auto& r : outcomes)
    if (!r) log_failure(r.error());
}
// clang-format on

#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

using namespace std::chrono_literals;

asio::awaitable<place_list> find_nearby(places_api& api, std::string category) {
  ++api.calls;
  api.max_in_flight = std::max(api.max_in_flight, ++api.in_flight);
  co_await sluice::sleep(1s);
  --api.in_flight;
  co_return place_list{std::move(category)};
}

TEST_CASE("README: the quick start bounds the searches and settles the rest", "[docs]") {
  sluice::testing::virtual_loop loop;
  places_api api;
  failures_logged = 0;
  loop.run(discover(api));
  CHECK(api.calls == 9);  // 8 categories and the hospital
  CHECK(api.max_in_flight == 5);
  CHECK(failures_logged == 1);
  CHECK(loop.now() == 3s);  // 8 one-second calls at 5 in flight (2 s), then 1 s settled
}

// ---- docs/testing.md --------------------------------------------------------

// clang-format off
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
using namespace sluice::testing;
// clang-format on

namespace {

std::vector<asio::awaitable<void>> make_calls(slow_service& api, std::size_t n) {
  std::vector<asio::awaitable<void>> calls;
  for (std::size_t i = 0; i < n; ++i) calls.push_back(api.call());
  return calls;
}

// Greedy list scheduling on `workers`: each call starts when the earliest
// worker frees up, in input order. The makespan bounded fan-out must reach.
std::chrono::nanoseconds greedy(const latency_model& model, std::size_t n, std::size_t workers) {
  std::vector<std::chrono::nanoseconds> free_at(workers, std::chrono::nanoseconds{0});
  std::chrono::nanoseconds end{0};
  for (std::size_t i = 0; i < n; ++i) {
    auto w = std::min_element(free_at.begin(), free_at.end());
    *w += model(call_info{i, "", ""});
    end = std::max(end, *w);
  }
  return end;
}

}  // namespace

TEST_CASE("testing.md: a bounded fan-out over slow_service ends at the greedy schedule", "[docs]") {
  const auto expected_makespan = greedy(latency::uniform(1s, 5s, 7), 14, 5);
  // clang-format off
slow_service api({.latency = latency::uniform(1s, 5s, /*seed*/ 7),
                  .failure = failures::at_calls({3}),
                  .quota = {.max_in_flight = 5}});
virtual_loop loop;
auto r = loop.run(sluice::gather_with_concurrency(5, make_calls(api, 14), sluice::return_exceptions));
REQUIRE(loop.now() == expected_makespan);  // exact, every run
REQUIRE(api.max_in_flight() == 5);
REQUIRE(api.throttles() == 0);
  // clang-format on
  REQUIRE(r.size() == 14);
  CHECK(!r[3]);
  CHECK(r[3].error_as<service_error>() != nullptr);
  CHECK(std::count_if(r.begin(), r.end(), [](auto& o) { return bool(o); }) == 13);
}

TEST_CASE("testing.md: slow_service's options, every field set", "[docs]") {
  // clang-format off
slow_service api({.latency = latency::fixed(1s),          // the default
                  .failure = failures::for_keys({"b"}),    // default: none fails
                  .quota = {.max_in_flight = 5, .calls_per_window = 10, .window = 1s},
                  .key_quota = {.max_in_flight = 1},                // the same, per key
                  .time_scale = 1.0,                       // multiplies latencies (real-time demos)
                  .record_timeline = true});               // off for million-call benchmarks
  // clang-format on
  virtual_loop loop;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<sluice::outcome<void>>> {
    std::vector<asio::awaitable<void>> calls;
    for (const char* k : {"a", "b", "a"}) calls.push_back(api.call(k));
    co_return co_await sluice::gather(std::move(calls), sluice::return_exceptions);
  }());
  REQUIRE(r.size() == 3);
  CHECK(r[0]);
  CHECK(r[1].error_as<service_error>() != nullptr);    // key "b" fails
  CHECK(r[2].error_as<throttled_error>() != nullptr);  // a second "a" while one runs
  CHECK(api.timeline().size() == 3);
  CHECK(loop.now() == 1s);
}

// ---- docs/fanout.md ---------------------------------------------------------

namespace {

struct object_store {
  slow_service& api;
  asio::awaitable<std::size_t> size_of(std::string key) {
    co_await api.call(key);
    co_return key.size();
  }
};

}  // namespace

TEST_CASE("fanout.md: map_unordered read by for_each, at most 5 in flight", "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::sequence({1s, 2s, 3s})});
  object_store store{api};
  const std::vector<std::string> keys = {"a", "bb", "ccc", "dddd", "eeeee", "ffffff", "g"};
  std::size_t total = 0;
  loop.run([&]() -> asio::awaitable<void> {
    // clang-format off
co_await sluice::for_each(
    sluice::map_unordered([&](std::string key) { return store.size_of(std::move(key)); }, keys, 5),
    [&](std::size_t n) { total += n; });  // completion order; at most 5 in flight
// Here every task has finished, however for_each was left.
    // clang-format on
    CHECK(api.in_flight() == 0);
  }());
  CHECK(total == 22);
  CHECK(api.calls() == 7);
  CHECK(api.max_in_flight() == 5);
}

TEST_CASE("fanout.md: a crawl spawns what it discovers into one task group", "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  // A site of 15 pages: page i links to 2i+1 and 2i+2 (a binary tree), and back to the root.
  auto fetch_links = [&](std::string url) -> asio::awaitable<std::vector<std::string>> {
    co_await api.call(url);
    const int i = std::stoi(url);
    std::vector<std::string> links{"0"};
    for (int c : {2 * i + 1, 2 * i + 2})
      if (c < 15) links.push_back(std::to_string(c));
    co_return links;
  };
  std::set<std::string> seen{"0"};
  const std::string root = "0";
  loop.run([&]() -> asio::awaitable<void> {
    // clang-format off
std::function<asio::awaitable<void>(sluice::task_group&, std::string)> crawl;
crawl = [&](sluice::task_group& g, std::string url) -> asio::awaitable<void> {
  for (auto& link : co_await fetch_links(url))
    if (seen.insert(link).second) g.spawn(crawl(g, link));   // discovered while running
};
co_await sluice::task_group::run(8, [&](sluice::task_group& g) -> asio::awaitable<void> {
  g.spawn(crawl(g, root));
  co_return;
});  // every page crawled, or the first error after everything stopped
         // clang-format on
  }());
  CHECK(seen.size() == 15);
  CHECK(api.calls() == 15);
  CHECK(api.in_flight() == 0);
  CHECK(loop.now() == 4s);  // one level of the tree per second: 1, 2, 4, 8 pages
}

// ---- docs/primitives.md (and docs/operating.md) -----------------------------

namespace {

struct request {
  int id;
};
struct reply {
  int id;
};

struct gauges {
  std::vector<std::pair<std::string, std::size_t>> seen;
  void gauge(std::string name, std::size_t v) { seen.emplace_back(std::move(name), v); }
};

}  // namespace

TEST_CASE("primitives.md: a semaphore bounds the calls; its gauges show the queue", "[docs]") {
  virtual_loop loop;
  slow_service backend_api({.latency = latency::fixed(1s), .quota = {.max_in_flight = 5}});
  auto send = [&](request r) -> asio::awaitable<reply> {
    co_await backend_api.call();
    co_return reply{r.id};
  };
  gauges metrics;
  loop.run([&]() -> asio::awaitable<void> {
    // clang-format off
sluice::semaphore backend{5};                       // at most 5 calls in flight, process-wide
auto call = [&](request r) -> asio::awaitable<reply> {
  auto permit = co_await backend.scoped_acquire();  // released at scope exit
  co_return co_await send(r);
};
metrics.gauge("free", backend.value());             // 0 while waiters() > 0: the cap is too tight
metrics.gauge("waiting", backend.waiters());
    // clang-format on
    std::vector<asio::awaitable<reply>> calls;
    for (int i = 0; i < 12; ++i) calls.push_back(call(request{i}));
    auto replies = co_await sluice::gather(std::move(calls));
    CHECK(replies[11].id == 11);
  }());
  REQUIRE(metrics.seen.size() == 2);
  CHECK(metrics.seen[0].second == 5);
  CHECK(metrics.seen[1].second == 0);
  CHECK(backend_api.throttles() == 0);
  CHECK(backend_api.max_in_flight() == 5);
  CHECK(loop.now() == 3s);
}

TEST_CASE("primitives.md: one strand shares a semaphore among 4 threads", "[docs]") {
  std::vector<request> requests;
  for (int i = 0; i < 40; ++i) requests.push_back(request{i});
  std::size_t done = 0, max_held = 0, held = 0;
  auto on_done = [&](std::exception_ptr e) {
    if (!e) ++done;  // on the strand
  };
  auto call = [&](sluice::semaphore& backend, request) -> asio::awaitable<void> {
    auto permit = co_await backend.scoped_acquire();
    max_held = std::max(max_held, ++held);
    co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
    --held;
  };
  // clang-format off
asio::io_context ctx{4};
auto strand = asio::make_strand(ctx);
sluice::semaphore backend{strand, 5};       // or sluice::semaphore backend{5}
for (auto& r : requests) asio::co_spawn(strand, call(backend, r), on_done);
std::vector<std::thread> pool;
for (int i = 0; i < 4; ++i) pool.emplace_back([&] { ctx.run(); });
for (auto& t : pool) t.join();
std::size_t free = backend.value();         // fine: the loop's threads were joined
  // clang-format on
  CHECK(free == 5);
  CHECK(done == 40);
  CHECK(max_held == 5);
}

// ---- docs/threads.md --------------------------------------------------------

namespace {

std::string sha256(const std::string& bytes) {  // a stand-in: CPU work off the loop
  return std::to_string(std::hash<std::string>{}(bytes));
}

}  // namespace

TEST_CASE("threads.md: to_thread runs the function on the pool, the caller resumes on its loop",
          "[docs]") {
  asio::io_context ctx;
  const std::string bytes = "hello";
  std::string result;
  std::thread::id caller_before, caller_after;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        caller_before = std::this_thread::get_id();
        // clang-format off
asio::thread_pool pool{4};
std::string digest = co_await sluice::to_thread(pool.get_executor(), [&] { return sha256(bytes); });
        // clang-format on
        caller_after = std::this_thread::get_id();
        result = digest;
        pool.join();
      },
      asio::detached);
  ctx.run();
  CHECK(result == sha256("hello"));
  CHECK(caller_before == caller_after);
}

// ---- docs/provider-limits.md ------------------------------------------------

namespace {

struct document {
  int id;
};
struct verdict {
  int id;
};

struct llm_api {
  slow_service& api;
  asio::awaitable<verdict> assess(document d) {
    co_await api.call();
    co_return verdict{d.id};
  }
};

}  // namespace

TEST_CASE("provider-limits.md: a semaphore and a rate limiter in front of the call", "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s),
                    .quota = {.max_in_flight = 4, .calls_per_window = 60, .window = 1min}});
  llm_api llm{api};
  auto verdicts = loop.run([&]() -> asio::awaitable<std::vector<verdict>> {
    // clang-format off
sluice::semaphore in_flight{4};                      // the provider's concurrency limit
sluice::rate_limiter rpm{60, std::chrono::minutes(1)};   // and its rate limit
auto assess = [&](document d) -> asio::awaitable<verdict> {
  auto permit = co_await in_flight.scoped_acquire();
  co_await rpm.acquire();                            // acquire(n) for a batch request
  co_return co_await llm.assess(d);
};
    // clang-format on
    std::vector<asio::awaitable<verdict>> calls;
    for (int i = 0; i < 80; ++i) calls.push_back(assess(document{i}));
    co_return co_await sluice::gather(std::move(calls));
  }());
  CHECK(verdicts.size() == 80);
  CHECK(api.throttles() == 0);
  CHECK(api.max_in_flight() == 4);
  CHECK(loop.now() == 65s);  // 60 start in the first 15 s (4 a second), the other 20 from 60 s on
}

namespace {
struct completion_api {
  slow_service& api;
  asio::awaitable<std::string> complete(std::string prompt, std::size_t tokens = 500) {
    co_await api.call(prompt, "complete", tokens);
    co_return "reply to " + prompt;
  }
};
}  // namespace

TEST_CASE("provider-limits.md: retry with backoff, the provider's hint and a budget", "[docs]") {
  virtual_loop loop;
  // 2 calls per second; the rest are throttled with a Retry-After hint.
  slow_service api(
      {.latency = latency::fixed(100ms), .quota = {.calls_per_window = 2, .window = 1s}});
  completion_api llm{api};
  auto replies = loop.run([&]() -> asio::awaitable<std::vector<std::string>> {
    // clang-format off
sluice::retry_budget budget{{.ratio = 0.1, .per = 10s, .min_retries = 10}};  // a cap on retries
auto policy = sluice::backoff{.first = 100ms, .max = 30s, .attempts = 6,
                              .jitter = sluice::full_jitter, .budget = &budget};
auto ask = [&](std::string prompt) -> asio::awaitable<std::string> {
  co_return co_await sluice::retry(policy, [&] {
    return sluice::with_timeout(2s, llm.complete(prompt));  // a timeout is retried too
  });
};
    // clang-format on
    std::vector<std::string> out;
    for (int i = 0; i < 20; ++i) out.push_back(co_await ask("p" + std::to_string(i)));
    CHECK(budget.first_attempts() == 20);
    CHECK(budget.retries() == 9);
    co_return out;
  }());
  // 20 prompts of 100 ms one after the other: the third in each second is
  // throttled and retried when the provider's hint says (the next second).
  CHECK(replies.size() == 20);
  CHECK(api.throttles() == 9);
  CHECK(loop.now() == 9200ms);
}

TEST_CASE("provider-limits.md: acquire_all takes RPM, TPM and a permit in one instant", "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(5s),
                    .quota = {.max_in_flight = 8,
                              .calls_per_window = 60,
                              .window = 1min,
                              .tokens_per_window = 40000}});
  completion_api llm{api};
  loop.run([&]() -> asio::awaitable<void> {
    // clang-format off
sluice::semaphore in_flight{8};
sluice::rate_limiter rpm{60, 1min}, tpm{40000, 1min};  // the published quotas
auto ask = [&](std::string prompt, std::size_t tokens) -> asio::awaitable<std::string> {
  auto held = co_await sluice::acquire_all(in_flight, rpm, tpm.weighted(tokens));
  co_return co_await llm.complete(prompt, tokens);  // held releases the permit at scope exit
};
    // clang-format on
    std::vector<asio::awaitable<std::string>> calls;
    for (int i = 0; i < 100; ++i) calls.push_back(ask("p" + std::to_string(i), 1000));
    co_await sluice::gather(std::move(calls));
  }());
  CHECK(api.throttles() == 0);
  CHECK(api.completed() == 100);
  // 40 prompts of 1,000 tokens a minute, 8 at a time: 0-20 s, 60-80 s, and
  // the last 20 from 120 s (the last at 130 s).
  CHECK(loop.now() == 135s);
}

TEST_CASE("provider-limits.md: a deadline keeps what finished", "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::sequence({1s, 5s, 2s})});
  std::vector<std::string> used, logged;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<std::string>> calls;
    for (std::string k : {"a", "b", "c"})
      calls.push_back([](slow_service& api, std::string k) -> asio::awaitable<std::string> {
        co_await api.call(k);
        co_return k;
      }(api, k));
    auto use = [&](const std::string& v) {
      used.push_back(v);
    };
    auto log = [&](const std::exception_ptr& e) {
      try {
        std::rethrow_exception(e);
      } catch (const sluice::timeout_error&) {
        logged.push_back("timeout");
      }
    };
    // clang-format off
auto results = co_await sluice::gather(std::move(calls), sluice::return_exceptions,
                                       sluice::deadline(3s));
// or: sluice::gather_with_concurrency(5, calls, sluice::return_exceptions, sluice::deadline(3s))
for (auto& r : results)
  if (r) use(*r);                 // finished in time: its value (or its own exception)
  else log(r.error());            // unfinished: sluice::timeout_error
    // clang-format on
  }());
  CHECK(used == std::vector<std::string>{"a", "c"});
  CHECK(logged == std::vector<std::string>{"timeout"});
  CHECK(loop.now() == 3s);
  CHECK(api.cancellations() == 1);
}

namespace {

struct report {
  std::string account;
};

slow_service* reports_api = nullptr;

asio::awaitable<report> fetch_report(std::string account) {
  co_await reports_api->call(account);
  co_return report{account};
}

}  // namespace

TEST_CASE("provider-limits.md: a key held waits or drops; single_flight shares one execution",
          "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  reports_api = &api;
  std::size_t seen_free = 9, seen_waiting = 9, seen_keys = 9;
  bool dropped = true;
  std::vector<std::string> got;
  auto one = [&](std::string account) -> asio::awaitable<void> {
    // clang-format off
sluice::keyed_semaphore<std::string> per_account{1};          // also {ex, n}; Hash, KeyEqual
auto permit = co_await per_account.scoped_acquire(account);   // wait: one call per account at once
if (auto p = per_account.try_acquire(account)) { /* run */ }  // drop: skip when the account is busy
std::size_t free = per_account.value(account), waiting = per_account.waiters(account), keys = per_account.keys();

sluice::single_flight<std::string, report> reports;           // dedupe: concurrent callers of a key
auto fetch = [account] { return fetch_report(account); };      // share one execution
report r = co_await reports.run(account, fetch);
    // clang-format on
    dropped = !per_account.try_acquire(account);
    seen_free = free;
    seen_waiting = waiting;
    seen_keys = keys;
    got.push_back(r.account);
  };
  loop.run(one("acme"));
  CHECK(dropped);
  CHECK(seen_free == 0);
  CHECK(seen_waiting == 0);
  CHECK(seen_keys == 1);
  CHECK(got == std::vector<std::string>{"acme"});
  CHECK(api.calls() == 1);
}

// ---- docs/operating.md --------------------------------------------------------

namespace {

struct metric_sink {
  std::map<std::string, double> values;
  void gauge(const std::string& name, double v) { values[name] = v; }
};

}  // namespace

TEST_CASE("operating.md: a limit's stats exported as gauges", "[docs]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  metric_sink metrics;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::semaphore backend{4};
    auto call = [&](std::string key) -> asio::awaitable<void> {
      auto permit = co_await backend.scoped_acquire();
      co_await api.call(key);
    };
    std::vector<asio::awaitable<void>> calls;
    for (int i = 0; i < 8; ++i) calls.push_back(call(std::to_string(i)));
    co_await sluice::gather(std::move(calls));
    // clang-format off
sluice::stats s = backend.stats();
metrics.gauge("in_use", s.in_use);          // == s.limit while s.waiting > 0: the cap sets the pace
metrics.gauge("waiting", s.waiting);
metrics.gauge("wait_p99_seconds", std::chrono::duration<double>(s.wait.p99).count());
metrics.gauge("hold_mean_seconds", std::chrono::duration<double>(s.hold.mean()).count());
    // clang-format on
    CHECK(s.acquired == 8);
    CHECK(s.limit == 4);
  }());
  CHECK(metrics.values["in_use"] == 0);
  CHECK(metrics.values["waiting"] == 0);
  CHECK(metrics.values["wait_p99_seconds"] == 1.0);  // 4 calls waited 1 s (the max: exact)
  CHECK(metrics.values["hold_mean_seconds"] == 1.0);
}
