// SPDX-License-Identifier: BSL-1.0
// The snippets of docs/asyncio.md ("From asyncio to sluice"), one TEST_CASE
// per row of its table, each run on a virtual_loop with an assertion about its
// result. The last test case checks that every ```cpp block of the guide
// appears in this file line for line (blanks at either end of a line, and
// runs of blanks, ignored), so the guide cannot drift from code that compiles
// and runs.
#include <sluice/sluice.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
namespace failures = sluice::testing::failures;

namespace {

// The provider every snippet calls: each call takes the latency the model gives it.
asio::awaitable<std::string> fetch(slow_service& api, std::string key) {
  co_await api.call(key);
  co_return "page " + key;
}

// Three calls, made in this order, that take 3 s, 1 s and 2 s.
slow_service three_calls() {
  return slow_service({.latency = latency::sequence({3s, 1s, 2s})});
}

std::vector<std::string> strings(std::initializer_list<const char*> l) {
  return {l.begin(), l.end()};
}

}  // namespace

TEST_CASE("guide: gather returns the results in input order", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::sequence({3s, 1s, 2s})});
  auto pages = loop.run([&]() -> asio::awaitable<std::vector<std::string>> {
    std::vector<asio::awaitable<std::string>> tasks;
    for (std::string key : {"a", "b", "c"}) tasks.push_back(fetch(api, key));
    std::vector<std::string> pages = co_await sluice::gather(std::move(tasks));
    // pages == {"page a", "page b", "page c"} after 3 s (the slowest call)
    co_return pages;
  }());
  CHECK(pages == strings({"page a", "page b", "page c"}));
  CHECK(loop.now() == 3s);
}

TEST_CASE("guide: gather of a fixed list returns a tuple", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::sequence({3s, 1s, 2s})});
  auto both = loop.run([&]() -> asio::awaitable<std::tuple<std::string, std::string>> {
    auto [a, b] = co_await sluice::gather(fetch(api, "a"), fetch(api, "b"));
    co_return std::tuple{a, b};
  }());
  CHECK(both == std::tuple<std::string, std::string>{"page a", "page b"});
  CHECK(loop.now() == 3s);
}

TEST_CASE("guide: gather with return_exceptions settles every task into an outcome",
          "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s), .failure = failures::at_calls({1})});
  auto failed = loop.run([&]() -> asio::awaitable<std::vector<std::string>> {
    std::vector<asio::awaitable<std::string>> tasks;
    for (std::string key : {"a", "b", "c"}) tasks.push_back(fetch(api, key));
    std::vector<sluice::outcome<std::string>> results =
        co_await sluice::gather(std::move(tasks), sluice::return_exceptions);
    std::vector<std::string> failed;
    for (auto& r : results)
      if (auto* e = r.error_as<sluice::testing::service_error>()) failed.push_back(e->key());
    co_return failed;  // {"b"}: results[0] and results[2] hold "page a", "page c"
  }());
  CHECK(failed == strings({"b"}));
  CHECK(api.completed() == 2);
}

TEST_CASE("guide: gather_with_concurrency replaces the semaphore-wrapped gather",
          "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::sequence({3s, 1s, 2s, 1s})});
  auto pages = loop.run([&]() -> asio::awaitable<std::vector<std::string>> {
    std::vector<asio::awaitable<std::string>> tasks;
    for (std::string key : {"a", "b", "c", "d"}) tasks.push_back(fetch(api, key));
    // At most 2 calls in flight; the next starts the instant one finishes.
    auto pages = co_await sluice::gather_with_concurrency(2, std::move(tasks));
    co_return pages;
  }());
  CHECK(pages == strings({"page a", "page b", "page c", "page d"}));
  CHECK(api.max_in_flight() == 2);
  CHECK(loop.now() == 4s);  // a: 0-3 s; b: 0-1 s, c: 1-3 s; d: 3-4 s
}

TEST_CASE("guide: as_completed through for_each yields in completion order", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api = three_calls();
  std::vector<std::string> order;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<std::string>> tasks;
    for (std::string key : {"a", "b", "c"}) tasks.push_back(fetch(api, key));
    co_await sluice::for_each(sluice::as_completed(std::move(tasks), 3),
                              [&](std::string page) { order.push_back(page); });
  }());
  CHECK(order == strings({"page b", "page c", "page a"}));
  CHECK(loop.now() == 3s);
}

TEST_CASE("guide: the first completed result, the others cancelled and awaited",
          "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api = three_calls();
  std::string first;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<std::string>> tasks;
    for (std::string key : {"a", "b", "c"}) tasks.push_back(fetch(api, key));
    co_await sluice::for_each(sluice::as_completed(std::move(tasks), 3), [&](std::string page) {
      first = page;
      return false;  // stop: the running tasks are cancelled and waited for
    });
  }());
  CHECK(first == "page b");
  CHECK(api.cancellations() == 2);
  CHECK(api.in_flight() == 0);
  CHECK(loop.now() == 1s);
}

TEST_CASE("guide: map_unordered maps a function over inputs, for_each consumes",
          "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api = three_calls();
  std::vector<std::string> keys{"a", "b", "c"};
  std::size_t total = 0;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](std::string key) { return fetch(api, key); }, keys, 2),
        [&](std::string page) { total += page.size(); });
    // Here every task has finished, however for_each was left.
  }());
  CHECK(total == 18);
  CHECK(api.max_in_flight() == 2);
  CHECK(loop.now() == 3s);
}

TEST_CASE("guide: map_unordered with return_exceptions yields outcomes", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s), .failure = failures::for_keys({"b"})});
  std::vector<std::string> keys{"a", "b", "c"};
  std::size_t ok = 0, failed = 0;
  loop.run([&]() -> asio::awaitable<void> {
    co_await sluice::for_each(
        sluice::map_unordered([&](std::string key) { return fetch(api, key); }, keys, 2,
                              sluice::return_exceptions),
        [&](sluice::outcome<std::string> r) { (r ? ok : failed) += 1; });
  }());
  CHECK(ok == 2);
  CHECK(failed == 1);
}

TEST_CASE("guide: a semaphore caps the calls in flight", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    sluice::semaphore sem{2};
    auto limited = [&](std::string key) -> asio::awaitable<std::string> {
      auto permit = co_await sem.scoped_acquire();  // released at scope exit
      co_return co_await fetch(api, key);
    };
    co_await sluice::gather(limited("a"), limited("b"), limited("c"));
  }());
  CHECK(api.max_in_flight() == 2);
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: bounded_semaphore refuses a release above its initial value", "[asyncio_guide]") {
  virtual_loop loop;
  bool refused = false;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::bounded_semaphore sem{1};
    co_await sem.acquire();
    sem.release();
    try {
      sem.release();  // released more often than acquired
    } catch (const std::logic_error&) {
      refused = true;
    }
  }());
  CHECK(refused);
}

TEST_CASE("guide: a lock serializes a critical section", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    sluice::lock token_refresh;
    auto refresh = [&]() -> asio::awaitable<void> {
      auto guard = co_await token_refresh.scoped_acquire();  // async with lock:
      co_await api.call("token");
    };
    co_await sluice::gather(refresh(), refresh());
  }());
  CHECK(api.max_in_flight() == 1);
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: an event wakes every waiter", "[asyncio_guide]") {
  virtual_loop loop;
  int woken = 0;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::event ready;
    auto waiter = [&]() -> asio::awaitable<void> {
      co_await ready.wait();
      ++woken;
    };
    auto setter = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(1s);
      ready.set();
    };
    co_await sluice::gather(waiter(), waiter(), setter());
  }());
  CHECK(woken == 2);
  CHECK(loop.now() == 1s);
}

TEST_CASE("guide: a condition waits for a predicate under its lock", "[asyncio_guide]") {
  virtual_loop loop;
  int seen = 0;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::condition cv;
    int stock = 0;
    auto consumer = [&]() -> asio::awaitable<void> {
      auto guard = co_await cv.scoped_acquire();
      co_await cv.wait([&] { return stock > 0; });  // re-acquires the lock before it returns
      seen = stock--;
    };
    auto producer = [&]() -> asio::awaitable<void> {
      co_await sluice::sleep(1s);
      auto guard = co_await cv.scoped_acquire();
      ++stock;
      cv.notify();
    };
    co_await sluice::gather(consumer(), producer());
  }());
  CHECK(seen == 1);
  CHECK(loop.now() == 1s);
}

TEST_CASE("guide: a queue shut down lets the consumer drain, then stops it", "[asyncio_guide]") {
  virtual_loop loop;
  std::vector<int> got;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::queue<int> q{2};  // maxsize 2: put() waits while full
    auto producer = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 5; ++i) co_await q.put(i);
      q.shutdown();  // q.shutdown(true) would drop what is left
    };
    auto consumer = [&]() -> asio::awaitable<void> {
      try {
        for (;;) got.push_back(co_await q.get());
      } catch (const sluice::queue_shut_down&) {
        // drained and shut down: asyncio's QueueShutDown
      }
    };
    co_await sluice::gather(producer(), consumer());
  }());
  CHECK(got == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("guide: a task_group owns the tasks spawned while it runs", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  std::vector<std::string> pages;
  loop.run([&]() -> asio::awaitable<void> {
    auto crawl = [&](std::string key) -> asio::awaitable<void> {
      pages.push_back(co_await fetch(api, key));
    };
    co_await sluice::task_group::run(2, [&](sluice::task_group& g) -> asio::awaitable<void> {
      for (std::string key : {"a", "b", "c"}) g.spawn(crawl(key));
      co_return;
    });  // every child has finished here (the first failure cancels the rest)
  }());
  CHECK(pages.size() == 3);
  CHECK(api.max_in_flight() == 2);
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: with_timeout cancels the call and throws timeout_error", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(5s)});
  bool timed_out = false;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      std::string page = co_await sluice::with_timeout(2s, fetch(api, "slow"));
    } catch (const sluice::timeout_error&) {
      timed_out = true;  // the call was cancelled and has finished
    }
  }());
  CHECK(timed_out);
  CHECK(api.cancellations() == 1);
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: a deadline keeps what finished and times out the rest", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api = three_calls();
  auto results = loop.run([&]() -> asio::awaitable<std::vector<sluice::outcome<std::string>>> {
    std::vector<asio::awaitable<std::string>> tasks;
    for (std::string key : {"a", "b", "c"}) tasks.push_back(fetch(api, key));
    auto results =
        co_await sluice::gather(std::move(tasks), sluice::return_exceptions, sluice::deadline(2s));
    // results[0] holds a timeout_error (3 s); results[1], results[2]: "page b", "page c"
    co_return results;
  }());
  REQUIRE(results.size() == 3);
  CHECK(results[0].error_as<sluice::timeout_error>() != nullptr);
  CHECK(*results[1] == "page b");
  CHECK(*results[2] == "page c");
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: a rate_limiter keeps the calls inside the provider's quota", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api(
      {.latency = latency::fixed(100ms), .quota = {.calls_per_window = 2, .window = 1s}});
  loop.run([&]() -> asio::awaitable<void> {
    sluice::rate_limiter quota{2, 1s};  // at most 2 starts in any 1 s window
    auto limited = [&](std::string key) -> asio::awaitable<std::string> {
      co_await quota.acquire();  // a start inside the quota
      co_return co_await fetch(api, key);
    };
    co_await sluice::gather(limited("a"), limited("b"), limited("c"), limited("d"), limited("e"));
  }());
  CHECK(api.throttles() == 0);  // starts at 0 s, 0 s, 1 s, 1 s, 2 s
  CHECK(loop.now() == 2100ms);
}

TEST_CASE("guide: a token_bucket spreads acquisitions at its rate", "[asyncio_guide]") {
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::token_bucket bucket{2.0, 1};                    // 2 tokens per second, bursts of 1
    for (int i = 0; i < 3; ++i) co_await bucket.acquire();  // at 0 s, 0.5 s, 1 s
  }());
  CHECK(loop.now() == 1s);
}

TEST_CASE("guide: a keyed_rate_limiter limits each key on its own", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(100ms)});
  loop.run([&]() -> asio::awaitable<void> {
    sluice::keyed_rate_limiter<std::string> per_customer{1, 1s};  // 1 start per second per key
    auto limited = [&](std::string customer) -> asio::awaitable<std::string> {
      co_await per_customer.acquire(customer);
      co_return co_await fetch(api, customer);
    };
    co_await sluice::gather(limited("alice"), limited("alice"), limited("bob"));
  }());
  CHECK(api.max_in_flight() == 2);  // alice and bob at 0 s; alice again at 1 s
  CHECK(loop.now() == 1100ms);
}

TEST_CASE("guide: a keyed_semaphore allows one call per key at a time", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    sluice::keyed_semaphore<std::string> per_account{1};  // one call per account at once
    auto job = [&](std::string account) -> asio::awaitable<std::string> {
      auto permit = co_await per_account.scoped_acquire(account);  // waits for this account only
      co_return co_await fetch(api, account);
    };
    co_await sluice::gather(job("alice"), job("alice"), job("bob"));
  }());
  CHECK(api.max_in_flight("alice") == 1);
  CHECK(api.collisions() == 0);
  CHECK(loop.now() == 2s);  // alice twice in a row; bob beside the first
}

TEST_CASE("guide: single_flight makes concurrent callers of one key share one call",
          "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  std::vector<std::string> pages;
  loop.run([&]() -> asio::awaitable<void> {
    sluice::single_flight<std::string, std::string> flights;
    auto get = [&](std::string key) -> asio::awaitable<std::string> {
      // Named, not a temporary inside co_await (a g++ 12 bug, see single_flight.hpp).
      auto call = [&api, key] {
        return fetch(api, key);
      };
      co_return co_await flights.run(key, call);
    };
    auto [x, y, z] = co_await sluice::gather(get("a"), get("a"), get("a"));
    pages = {x, y, z};
  }());
  CHECK(pages == strings({"page a", "page a", "page a"}));
  CHECK(api.calls() == 1);
}

// The one row on a plain io_context: virtual_loop cannot wait for work on
// another thread (with no timer pending it reports deadlock_error at once).
TEST_CASE("guide: to_thread runs blocking work on a pool", "[asyncio_guide]") {
  asio::io_context ctx;
  asio::thread_pool pool{1};
  int answer = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        int n = co_await sluice::to_thread(pool.get_executor(), [] { return 6 * 7; });
        answer = n;  // resumed on the loop's thread
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  ctx.run();  // the pending call counts as work: run() returns after it
  CHECK(answer == 42);
}

TEST_CASE("guide: cancellation arrives as operation_aborted at the awaited operation",
          "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(5s)});
  bool aborted = false;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto call = [&]() -> asio::awaitable<void> {
      try {
        co_await api.call("slow");
      } catch (const sluice::system_error& e) {
        aborted = e.code() == asio::error::operation_aborted;  // asyncio's CancelledError
        throw;                                                 // let it propagate
      }
    };
    co_await (call() || sluice::sleep(1s));
  }());
  CHECK(aborted);
}

TEST_CASE("guide: throw_if_cancelled off lets a cancelled coroutine clean up", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(5s)});
  bool cleaned_up = false;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto call = [&]() -> asio::awaitable<void> {
      co_await asio::this_coro::throw_if_cancelled(false);
      std::exception_ptr failure;
      try {
        co_await api.call("slow");
      } catch (const sluice::system_error&) {
        failure = std::current_exception();  // no co_await inside a catch block
      }
      if (failure) {
        // Every sluice wait refuses a caller whose cancellation was requested:
        // a cleanup that waits starts from a fresh cancellation state.
        co_await asio::this_coro::reset_cancellation_state();
        co_await sluice::sleep(1s);  // cleanup can still wait
        cleaned_up = true;
        std::rethrow_exception(failure);
      }
    };
    co_await (call() || sluice::sleep(1s));
  }());
  CHECK(cleaned_up);
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: shared_semaphore caps calls across threads and loops", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  sluice::shared_semaphore process_cap{2};  // one for the whole process
  loop.run([&]() -> asio::awaitable<void> {
    auto limited = [&](std::string key) -> asio::awaitable<std::string> {
      auto permit = co_await process_cap.scoped_acquire();
      co_return co_await fetch(api, key);
    };
    co_await sluice::gather(limited("a"), limited("b"), limited("c"));
  }());
  CHECK(api.max_in_flight() == 2);
  CHECK(process_cap.value() == 2);
}

TEST_CASE("guide: an awaitable does nothing until it is awaited", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api({.latency = latency::fixed(1s)});
  std::size_t calls_before = 99;
  loop.run([&]() -> asio::awaitable<void> {
    auto task = fetch(api, "a");  // not asyncio.create_task: nothing runs yet
    co_await sluice::sleep(1s);
    calls_before = api.calls();  // 0
    co_await std::move(task);    // the call starts here
  }());
  CHECK(calls_before == 0);
  CHECK(api.calls() == 1);
  CHECK(loop.now() == 2s);
}

TEST_CASE("guide: a stream read by hand is closed before it goes out of scope", "[asyncio_guide]") {
  virtual_loop loop;
  slow_service api = three_calls();
  std::optional<std::string> first;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<std::string> keys{"a", "b", "c"};
    auto pages = sluice::map_unordered([&](std::string key) { return fetch(api, key); }, keys, 3);
    first = co_await pages.next();  // "page b"
    co_await pages.close();         // cancels the other two and waits for them
  }());
  CHECK(first == "page b");
  CHECK(api.cancellations() == 2);
  CHECK(api.in_flight() == 0);
}

namespace {
struct job {
  std::string name;
  std::chrono::nanoseconds t;
};
}  // namespace

TEST_CASE("guide: g++ 12's safe spelling names a value before the co_await that takes it",
          "[asyncio_guide]") {
  // The unsafe spelling, co_await jobs.put(job{...}), double-frees the
  // temporary's string on g++ 12 (clang is fine): this is the regression
  // test of the spelling the guide and the README recommend.
  virtual_loop loop;
  sluice::queue<job> jobs{4};
  std::vector<std::string> got;
  loop.run([&]() -> asio::awaitable<void> {
    auto producer = [&]() -> asio::awaitable<void> {
      for (int id = 0; id < 100; ++id) {
        job j{"job-" + std::to_string(id) + "-with-a-name-longer-than-sso", 2s};
        co_await jobs.put(std::move(j));  // not: co_await jobs.put(job{...});
      }
    };
    auto consumer = [&]() -> asio::awaitable<void> {
      for (int id = 0; id < 100; ++id) {
        job j = co_await jobs.get();
        got.push_back(std::move(j.name));
      }
    };
    auto p = producer();
    auto c = consumer();
    co_await sluice::gather(std::move(p), std::move(c));
  }());
  REQUIRE(got.size() == 100);
  for (int id = 0; id < 100; ++id)
    CHECK(got[static_cast<std::size_t>(id)] ==
          "job-" + std::to_string(id) + "-with-a-name-longer-than-sso");
}

// ---- the guide cannot rot ------------------------------------------------

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A line without leading/trailing blanks, inner runs of blanks made one
// space: the guide may indent a snippet differently, and clang-format may
// align its comments differently, without the check failing.
std::string normalize(const std::string& line) {
  std::string out;
  bool blank = false;
  for (char c : line) {
    if (c == ' ' || c == '\t' || c == '\r') {
      blank = !out.empty();
      continue;
    }
    if (blank) out += ' ';
    blank = false;
    out += c;
  }
  return out;
}

std::vector<std::string> trimmed_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(normalize(line));
  return out;
}

bool contains_block(const std::vector<std::string>& hay, const std::vector<std::string>& block) {
  if (block.empty() || block.size() > hay.size()) return block.empty();
  for (std::size_t i = 0; i + block.size() <= hay.size(); ++i) {
    std::size_t j = 0;
    while (j < block.size() && hay[i + j] == block[j]) ++j;
    if (j == block.size()) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("guide: every cpp block of docs/asyncio.md appears in a guide test file",
          "[asyncio_guide]") {
  // The source directory comes from CMake: __FILE__ may be relative (ccache's
  // CCACHE_BASEDIR rewrites it), and ctest runs from the build tree.
  const std::string tests_dir = SLUICE_TESTS_SOURCE_DIR;
  const std::string self = tests_dir + "/asyncio_guide_test.cpp";
  const auto guide = trimmed_lines(read_file(tests_dir + "/../docs/asyncio.md"));
  const auto source = trimmed_lines(read_file(self));
  // The Redis row lives in its own test (it needs a redis-server): a block may
  // come from there too. A block never spans the two files.
  const auto redis = trimmed_lines(read_file(tests_dir + "/redis_asyncio_guide_test.cpp"));
  std::size_t blocks = 0;
  for (std::size_t i = 0; i < guide.size(); ++i) {
    if (guide[i] != "```cpp") continue;
    std::vector<std::string> block;
    std::size_t j = i + 1;
    for (; j < guide.size() && guide[j] != "```"; ++j) block.push_back(guide[j]);
    REQUIRE(j < guide.size());  // every block is closed
    ++blocks;
    INFO("docs/asyncio.md line " << i + 1
                                 << ": this block is in neither tests/asyncio_guide_test.cpp nor "
                                    "tests/redis_asyncio_guide_test.cpp");
    CHECK((contains_block(source, block) || contains_block(redis, block)));
    i = j;
  }
  CHECK(blocks >= 20);
}
