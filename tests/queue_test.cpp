// SPDX-License-Identifier: BSL-1.0
// Behaviours of CPython's test_queues.py (including Python 3.13's shutdown),
// plus sluice's own guarantees (DESIGN.md, "Synchronization primitives").
#include <sluice/queue.hpp>

#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::tasks_on_loop;

namespace {

bool is_shut_down_error(const sluice_test::task& t) {
  if (!t.failed()) return false;
  try {
    t.rethrow();
  } catch (const sluice::queue_shut_down& e) {
    return e.code() == sluice::queue_errc::shut_down;
  } catch (...) {
  }
  return false;
}

}  // namespace

TEST_CASE("items come out in FIFO order", "[queue]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<int> q;
  std::vector<int> out;
  loop.run([&]() -> asio::awaitable<void> {
    for (int i : {3, 1, 2}) co_await q.put(i);
    CHECK(q.size() == 3);
    for (int i = 0; i < 3; ++i) out.push_back(co_await q.get());
  });
  CHECK(out == std::vector<int>{3, 1, 2});
  CHECK(q.empty());
}

TEST_CASE("maxsize makes put wait for room", "[queue]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<int> q{2};
  CHECK(q.maxsize() == 2);
  std::vector<std::pair<int, std::chrono::nanoseconds>> put_at;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto producer = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 4; ++i) {
        co_await q.put(i);
        put_at.emplace_back(i, loop.now());
      }
    };
    auto consumer = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 4; ++i) {
        co_await sluice::sleep(1s);
        CHECK(q.size() <= 2);
        const int v = co_await q.get();
        CHECK(v == i);
      }
    };
    co_await (producer() && consumer());
  });
  REQUIRE(put_at.size() == 4);
  CHECK(put_at[0].second == 0s);
  CHECK(put_at[1].second == 0s);
  CHECK(put_at[2].second == 1s);  // waited for the first get
  CHECK(put_at[3].second == 2s);
  CHECK(q.max_waiters() == 1);
}

TEST_CASE("try_get on an empty queue and try_put on a full queue fail without waiting", "[queue]") {
  sluice::queue<int> q{1};
  CHECK_FALSE(q.try_get().has_value());
  CHECK(q.try_put(1));
  CHECK(q.full());
  CHECK_FALSE(q.try_put(2));
  CHECK(q.size() == 1);
  CHECK(q.try_get() == std::optional<int>(1));
  CHECK(q.empty());
}

TEST_CASE("get with waiting putters takes the oldest item and lets the oldest putter in",
          "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{1};
  REQUIRE(q.try_put(1));
  auto& p2 = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(2); });
  auto& p3 = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(3); });
  h.poll();
  CHECK(q.putters() == 2);
  CHECK(q.try_get() == std::optional<int>(1));
  CHECK(q.size() == 1);  // 2 moved in at once
  CHECK(q.putters() == 1);
  h.poll();
  CHECK(p2.succeeded());
  CHECK_FALSE(p3.done);
  CHECK(q.try_get() == std::optional<int>(2));
  h.poll();
  CHECK(p3.succeeded());
  CHECK(q.try_get() == std::optional<int>(3));
}

TEST_CASE("put with waiting getters hands the item to the oldest getter", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  std::vector<int> got;
  for (int i = 0; i < 2; ++i) {
    h.spawn([&]() -> asio::awaitable<void> { got.push_back(co_await q.get()); });
  }
  h.poll();
  CHECK(q.getters() == 2);
  CHECK(q.try_put(7));
  CHECK(q.empty());  // handed over, not queued
  CHECK(q.getters() == 1);
  h.poll();
  CHECK(got == std::vector<int>{7});
  CHECK(q.try_put(8));
  h.poll();
  CHECK(got == std::vector<int>{7, 8});
}

TEST_CASE("cancelled getters are not held by the queue", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  auto& a = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  std::optional<int> got;
  h.spawn([&]() -> asio::awaitable<void> { got = co_await q.get(); });
  h.poll();
  a.cancel();
  CHECK(q.getters() == 1);
  h.poll();
  CHECK(a.cancelled());
  CHECK(q.try_put(5));
  h.poll();
  CHECK(got == std::optional<int>(5));
  CHECK(q.getters() == 0);
}

TEST_CASE("cancelled putters are not held by the queue and their item is dropped", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{1};
  REQUIRE(q.try_put(1));
  auto& a = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(2); });
  auto& b = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(3); });
  h.poll();
  a.cancel();
  CHECK(q.putters() == 1);
  h.poll();
  CHECK(a.cancelled());
  CHECK(q.try_get() == std::optional<int>(1));
  h.poll();
  CHECK(b.succeeded());
  CHECK(q.try_get() == std::optional<int>(3));
  CHECK(q.unfinished_tasks() == 2);  // items 1 and 3; 2 never went in
}

TEST_CASE("a getter woken then cancelled does not lose its item with one pending reader",
          "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  auto& reader = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.poll();
  REQUIRE(q.try_put(1));  // handed to the reader...
  REQUIRE(q.try_put(2));
  reader.cancel();  // ...which is cancelled before it runs
  h.poll();
  CHECK(reader.cancelled());
  std::optional<int> got;
  h.spawn([&]() -> asio::awaitable<void> { got = co_await q.get(); });
  h.poll();
  CHECK(got == std::optional<int>(1));  // 2 would mean 1 was dropped
  CHECK(q.try_get() == std::optional<int>(2));
}

TEST_CASE("a getter woken then cancelled does not lose its item with many pending readers",
          "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  std::optional<int> r2, r3;
  auto& r1 = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.spawn([&]() -> asio::awaitable<void> { r2 = co_await q.get(); });
  h.spawn([&]() -> asio::awaitable<void> { r3 = co_await q.get(); });
  h.poll();
  REQUIRE(q.try_put(1));
  REQUIRE(q.try_put(2));
  r1.cancel();
  h.poll();
  CHECK(r1.cancelled());
  REQUIRE(r2.has_value());
  REQUIRE(r3.has_value());
  CHECK(std::set<int>{*r2, *r3} == std::set<int>{1, 2});
  CHECK(q.empty());
}

TEST_CASE("async_get completes with the item once granted even if cancelled later", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{h.loop.get_executor()};
  asio::cancellation_signal sig;
  sluice::error_code ec = asio::error::would_block;
  int got = 0;
  q.async_get(asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code e, int v) {
    ec = e;
    got = v;
  }));
  REQUIRE(q.try_put(9));
  sig.emit(asio::cancellation_type::terminal);
  h.poll();
  CHECK_FALSE(ec);
  CHECK(got == 9);
}

TEST_CASE("a timeout around get never loses an item", "[queue]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<int> q;
  int received = 0, timeouts = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto producer = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 5; ++i) {
        co_await sluice::sleep(1s);
        co_await q.put(i);
      }
    };
    auto consumer = [&]() -> asio::awaitable<void> {
      while (received + timeouts < 8 && received < 5) {
        auto r = co_await (q.get() || sluice::sleep(1s));  // ties with the producer
        if (r.index() == 0) {
          ++received;
        } else {
          ++timeouts;
        }
      }
    };
    co_await (producer() && consumer());
  });
  CHECK(received + static_cast<int>(q.size()) == 5);
}

TEST_CASE("task_done more often than items put throws logic_error", "[queue]") {
  sluice::queue<int> q;
  CHECK_THROWS_AS(q.task_done(), std::logic_error);
  REQUIRE(q.try_put(1));
  (void)q.try_get();
  q.task_done();
  CHECK_THROWS_WITH(q.task_done(), Catch::Contains("more times than there were items"));
}

TEST_CASE("join on a queue with nothing unfinished returns at once", "[queue]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<int> q;
  loop.run(q.join());
  CHECK(loop.now() == 0s);
}

TEST_CASE("join waits until every item is marked done", "[queue]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<int> q;
  int processed = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    for (int i = 0; i < 6; ++i) co_await q.put(i);
    auto worker = [&]() -> asio::awaitable<void> {
      while (auto item = q.try_get()) {
        co_await sluice::sleep(1s);
        ++processed;
        q.task_done();
      }
    };
    auto joiner = [&]() -> asio::awaitable<void> {
      co_await q.join();
      CHECK(processed == 6);
    };
    co_await (joiner() && worker() && worker());
  });
  CHECK(loop.now() == 3s);
  CHECK(q.unfinished_tasks() == 0);
}

TEST_CASE("shutting down an empty queue fails puts and waiting and later gets", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  auto& getter = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.poll();
  q.shutdown();
  CHECK(q.is_shut_down());
  h.poll();
  CHECK(is_shut_down_error(getter));
  CHECK_THROWS_AS(q.try_put(1), sluice::queue_shut_down);
  CHECK_THROWS_AS(q.try_get(), sluice::queue_shut_down);
  auto& putter = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(1); });
  auto& late = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.poll();
  CHECK(is_shut_down_error(putter));
  CHECK(is_shut_down_error(late));
}

TEST_CASE("shutting down a non-empty queue lets gets drain it first", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{2};
  REQUIRE(q.try_put(1));
  REQUIRE(q.try_put(2));
  auto& blocked_put = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(3); });
  h.poll();
  q.shutdown();
  h.poll();
  CHECK(is_shut_down_error(blocked_put));
  std::vector<int> got;
  auto& drainer = h.spawn([&]() -> asio::awaitable<void> {
    for (;;) got.push_back(co_await q.get());
  });
  h.poll();
  CHECK(got == std::vector<int>{1, 2});
  CHECK(is_shut_down_error(drainer));
  CHECK(q.unfinished_tasks() == 2);
}

TEST_CASE("an immediate shutdown drops the items and releases join", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  REQUIRE(q.try_put(1));
  REQUIRE(q.try_put(2));
  auto& joiner = h.spawn([&]() -> asio::awaitable<void> { co_await q.join(); });
  h.poll();
  CHECK_FALSE(joiner.done);
  q.shutdown(true);
  CHECK(q.empty());
  h.poll();
  CHECK(joiner.succeeded());
  CHECK_THROWS_AS(q.try_get(), sluice::queue_shut_down);
  CHECK(q.unfinished_tasks() == 0);
}

TEST_CASE("an immediate shutdown with unfinished tasks still waits for their task_done",
          "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  REQUIRE(q.try_put(1));
  REQUIRE(q.try_put(2));
  REQUIRE(q.try_get() == std::optional<int>(1));  // taken, not yet done
  auto& joiner = h.spawn([&]() -> asio::awaitable<void> { co_await q.join(); });
  h.poll();
  q.shutdown(true);  // drops 2
  h.poll();
  CHECK(q.unfinished_tasks() == 1);
  CHECK_FALSE(joiner.done);
  q.task_done();
  h.poll();
  CHECK(joiner.succeeded());
  CHECK_THROWS_AS(q.task_done(), std::logic_error);
}

TEST_CASE("async_put and async_get work with use_awaitable, a plain callback and use_future",
          "[queue]") {
  tasks_on_loop h;
  sluice::queue<std::string> q{h.loop.get_executor(), 1};
  std::string by_awaitable;
  h.spawn(
      [&]() -> asio::awaitable<void> { by_awaitable = co_await q.async_get(asio::use_awaitable); });
  h.poll();
  sluice::error_code put_ec = asio::error::would_block;
  q.async_put("a", [&](sluice::error_code ec) { put_ec = ec; });
  CHECK(put_ec == asio::error::would_block);  // completes through a post
  h.poll();
  CHECK_FALSE(put_ec);
  CHECK(by_awaitable == "a");
  std::future<void> put_fut = q.async_put("b", asio::use_future);
  std::future<void> blocked_put_fut = q.async_put("c", asio::use_future);
  CHECK(q.putters() == 1);
  std::future<std::string> get_fut = q.async_get(asio::use_future);
  REQUIRE(get_fut.wait_for(5s) == std::future_status::ready);
  CHECK(get_fut.get() == "b");
  REQUIRE(put_fut.wait_for(5s) == std::future_status::ready);
  REQUIRE(blocked_put_fut.wait_for(5s) == std::future_status::ready);
  put_fut.get();
  blocked_put_fut.get();
  std::string cb_item;
  q.async_get([&](sluice::error_code, std::string s) { cb_item = std::move(s); });
  h.poll();
  CHECK(cb_item == "c");
}

TEST_CASE("queue async operations report shut_down as an error code", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{h.loop.get_executor()};
  q.shutdown();
  sluice::error_code put_ec, get_ec;
  q.async_put(1, [&](sluice::error_code ec) { put_ec = ec; });
  q.async_get([&](sluice::error_code ec, int) { get_ec = ec; });
  h.poll();
  CHECK(put_ec == sluice::queue_errc::shut_down);
  CHECK(get_ec == sluice::queue_errc::shut_down);
  CHECK(put_ec.message() == "the queue was shut down");
}

TEST_CASE("a queue holds move-only items", "[queue]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<std::unique_ptr<int>> q{1};
  loop.run([&]() -> asio::awaitable<void> {
    co_await q.put(std::make_unique<int>(4));
    auto p = co_await q.get();
    CHECK(*p == 4);
  });
}

TEST_CASE("a bare callback on a queue without an executor is rejected", "[queue]") {
  sluice::queue<int> q;
  CHECK_THROWS_AS(q.async_put(1, [](sluice::error_code) {}), std::invalid_argument);
  CHECK(q.empty());
  CHECK_THROWS_AS(q.async_get([](sluice::error_code, int) {}), std::invalid_argument);
}

TEST_CASE("destroying a queue with waiters completes them with operation_aborted", "[queue]") {
  tasks_on_loop h;
  auto q = std::make_unique<sluice::queue<int>>(1);
  REQUIRE(q->try_put(1));
  auto& putter = h.spawn([&]() -> asio::awaitable<void> { co_await q->put(2); });
  auto& joiner = h.spawn([&]() -> asio::awaitable<void> { co_await q->join(); });
  auto empty = std::make_unique<sluice::queue<int>>();
  auto& getter = h.spawn([&]() -> asio::awaitable<void> { (void)co_await empty->get(); });
  h.poll();
  q.reset();
  empty.reset();
  h.poll();
  CHECK(putter.cancelled());
  CHECK(joiner.cancelled());
  CHECK(getter.cancelled());
}

// ---------------------------------------------------------------------------
// Adversarial review: cancellation, shutdown and task accounting.

TEST_CASE("a put cancelled on a full queue drops its item and lets the next putter in",
          "[queue][cancel]") {
  tasks_on_loop h;
  sluice::queue<int> q{1};
  REQUIRE(q.try_put(1));
  auto& p2 = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(2); });
  auto& p3 = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(3); });
  h.poll();
  CHECK(q.putters() == 2);
  p2.cancel();
  p2.cancel();
  CHECK(q.putters() == 1);
  h.poll();
  CHECK(p2.cancelled());
  CHECK(q.size() == 1);
  CHECK(q.unfinished_tasks() == 1);
  CHECK(q.try_get() == std::optional<int>(1));
  CHECK(q.size() == 1);  // 3 moved in
  h.poll();
  CHECK(p3.succeeded());
  CHECK(q.try_get() == std::optional<int>(3));
  CHECK(q.unfinished_tasks() == 2);
  CHECK(q.waiters() == 0);
}

TEST_CASE("a get cancelled after its item was handed over keeps the item first in line",
          "[queue][cancel]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  auto& r1 = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.poll();
  REQUIRE(q.try_put(1));  // handed to r1
  REQUIRE(q.try_put(2));
  REQUIRE(q.try_put(3));
  r1.cancel();
  r1.cancel();
  h.poll();
  CHECK(r1.cancelled());
  CHECK(q.size() == 3);
  CHECK(q.unfinished_tasks() == 3);
  CHECK(q.try_get() == std::optional<int>(1));
  CHECK(q.try_get() == std::optional<int>(2));
  CHECK(q.try_get() == std::optional<int>(3));
}

TEST_CASE("a get raced with a timeout on a bounded queue loses no item", "[queue][cancel]") {
  sluice::testing::virtual_loop loop;
  sluice::queue<int> q{2};
  std::vector<int> got;
  int timeouts = 0;
  loop.run([&]() -> asio::awaitable<void> {
    using namespace asio::experimental::awaitable_operators;
    auto producer = [&]() -> asio::awaitable<void> {
      for (int i = 0; i < 20; ++i) {
        co_await sluice::sleep(std::chrono::milliseconds(7 * (i % 3)));
        co_await q.put(i);
      }
    };
    auto consumer = [&]() -> asio::awaitable<void> {
      while (got.size() < 20) {
        auto r = co_await (q.get() || sluice::sleep(5ms));
        if (r.index() == 0) {
          got.push_back(std::get<0>(r));
        } else {
          ++timeouts;
        }
      }
    };
    co_await (producer() && consumer() && consumer());
  });
  std::vector<int> expected;
  for (int i = 0; i < 20; ++i) expected.push_back(i);
  CHECK(got == expected);
  CHECK(timeouts > 0);
  CHECK(q.empty());
  CHECK(q.waiters() == 0);
}

TEST_CASE("an immediate shutdown fails waiting getters and putters and drops the items",
          "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{1};
  auto& g1 = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.poll();
  REQUIRE(q.try_put(1));  // handed to g1
  h.poll();
  CHECK(g1.succeeded());
  REQUIRE(q.try_put(2));
  auto& p = h.spawn([&]() -> asio::awaitable<void> { co_await q.put(3); });
  sluice::error_code put_ec, get_ec;
  q.async_put(
      4, asio::bind_executor(h.loop.get_executor(), [&](sluice::error_code ec) { put_ec = ec; }));
  h.poll();
  CHECK(q.putters() == 2);
  CHECK(q.unfinished_tasks() == 2);
  q.shutdown(true);
  CHECK(q.size() == 0);
  CHECK(q.putters() == 0);
  CHECK(q.unfinished_tasks() == 1);  // 1 was taken and not marked done
  h.poll();
  CHECK(is_shut_down_error(p));
  CHECK(put_ec == sluice::queue_errc::shut_down);
  auto& g2 = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  q.async_get(
      asio::bind_executor(h.loop.get_executor(), [&](sluice::error_code ec, int) { get_ec = ec; }));
  h.poll();
  CHECK(is_shut_down_error(g2));
  CHECK(get_ec == sluice::queue_errc::shut_down);
  bool joined = false;
  h.spawn([&]() -> asio::awaitable<void> {
    co_await q.join();
    joined = true;
  });
  h.poll();
  CHECK_FALSE(joined);
  q.task_done();
  h.poll();
  CHECK(joined);
  CHECK_THROWS_AS(q.task_done(), std::logic_error);
}

TEST_CASE("a cancelled join leaves the other joiners and the count alone", "[queue][cancel]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  REQUIRE(q.try_put(1));
  auto& j1 = h.spawn([&]() -> asio::awaitable<void> { co_await q.join(); });
  auto& j2 = h.spawn([&]() -> asio::awaitable<void> { co_await q.join(); });
  h.poll();
  j1.cancel();
  h.poll();
  CHECK(j1.cancelled());
  CHECK_FALSE(j2.done);
  CHECK(q.unfinished_tasks() == 1);
  CHECK(q.try_get() == std::optional<int>(1));
  q.task_done();
  h.poll();
  CHECK(j2.succeeded());
}

TEST_CASE("a get cancelled after its item was handed over during a plain shutdown still drains",
          "[queue][cancel]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  auto& r = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  h.poll();
  REQUIRE(q.try_put(1));  // handed over
  q.shutdown();
  r.cancel();
  h.poll();
  CHECK(r.cancelled());
  CHECK(q.try_get() == std::optional<int>(1));  // given back, then drained
  CHECK_THROWS_AS(q.try_get(), sluice::queue_shut_down);
  CHECK(q.unfinished_tasks() == 1);
}

TEST_CASE("an immediate shutdown drops an item handed to a getter that has not resumed",
          "[queue]") {
  // Python 3.13: the item is still in the queue when shutdown(immediate=True)
  // runs; it is dropped, unfinished_tasks falls to 0, and the woken getter
  // finds the queue shut down and empty and raises QueueShutDown.
  tasks_on_loop h;
  sluice::queue<int> q;
  bool got = false;
  auto& getter = h.spawn([&]() -> asio::awaitable<void> {
    (void)co_await q.get();
    got = true;
  });
  h.poll();
  REQUIRE(q.try_put(1));  // handed to the waiting getter
  CHECK(q.unfinished_tasks() == 1);
  bool joined = false;
  h.spawn([&]() -> asio::awaitable<void> {
    co_await q.join();
    joined = true;
  });
  q.shutdown(true);
  CHECK(q.unfinished_tasks() == 0);  // at once, as Python's
  h.poll();
  CHECK_FALSE(got);
  CHECK(is_shut_down_error(getter));
  CHECK(joined);
  CHECK(q.unfinished_tasks() == 0);
  CHECK_THROWS_AS(q.task_done(), std::logic_error);
}

TEST_CASE("an immediate shutdown drops items handed to async_get callbacks too", "[queue]") {
  tasks_on_loop h;
  sluice::queue<std::string> q{h.loop.get_executor()};
  sluice::error_code waited_ec = asio::error::would_block, ready_ec = waited_ec;
  std::string waited_item = "untouched", ready_item = "untouched";
  q.async_get([&](sluice::error_code ec, std::string v) {
    waited_ec = ec;
    waited_item = std::move(v);
  });
  REQUIRE(q.try_put("a"));                                 // handed to the waiting callback
  REQUIRE(q.try_put("b"));                                 // queued
  q.async_get([&](sluice::error_code ec, std::string v) {  // takes "b", completion posted
    ready_ec = ec;
    ready_item = std::move(v);
  });
  CHECK(q.empty());
  CHECK(q.unfinished_tasks() == 2);
  q.shutdown(true);
  CHECK(q.unfinished_tasks() == 0);
  h.poll();
  CHECK(waited_ec == sluice::queue_errc::shut_down);
  CHECK(waited_item.empty());
  CHECK(ready_ec == sluice::queue_errc::shut_down);
  CHECK(ready_item.empty());
}

TEST_CASE("a use_future getter receives its item at the hand-off, off the loop", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q{h.loop.get_executor()};
  std::future<int> fut = q.async_get(asio::use_future);
  REQUIRE(q.try_put(5));  // handed over and completed at once: nothing to take back
  q.shutdown(true);
  CHECK(q.unfinished_tasks() == 1);
  REQUIRE(fut.wait_for(5s) == std::future_status::ready);
  CHECK(fut.get() == 5);
  q.task_done();
  CHECK(q.unfinished_tasks() == 0);
}

TEST_CASE("a plain shutdown lets a getter that was handed an item have it", "[queue]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  int got = 0;
  auto& getter = h.spawn([&]() -> asio::awaitable<void> { got = co_await q.get(); });
  h.poll();
  REQUIRE(q.try_put(7));
  q.shutdown();
  h.poll();
  CHECK(getter.succeeded());
  CHECK(got == 7);
  CHECK(q.unfinished_tasks() == 1);  // taken, not yet marked done
  q.task_done();
  CHECK(q.unfinished_tasks() == 0);
}

TEST_CASE("a queue destroyed after handing over an item leaves the getter its item", "[queue]") {
  tasks_on_loop h;
  auto q = std::make_unique<sluice::queue<std::string>>();
  std::string got;
  auto& getter = h.spawn([&]() -> asio::awaitable<void> { got = co_await q->get(); });
  h.poll();
  REQUIRE(q->try_put(std::string(100, 'x')));
  q.reset();  // the hand-off no longer refers to the queue (ASan: no use after free)
  h.poll();
  CHECK(getter.succeeded());
  CHECK(got == std::string(100, 'x'));
}

TEST_CASE("a get cancelled after its item was handed over during an immediate shutdown is done",
          "[queue][cancel]") {
  tasks_on_loop h;
  sluice::queue<int> q;
  auto& r = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q.get(); });
  bool joined = false;
  h.poll();
  REQUIRE(q.try_put(1));  // handed over
  h.spawn([&]() -> asio::awaitable<void> {
    co_await q.join();
    joined = true;
  });
  q.shutdown(true);
  r.cancel();
  h.poll();
  CHECK(r.cancelled());
  CHECK(q.unfinished_tasks() == 0);  // the dropped item counts as done
  CHECK(joined);
}

TEST_CASE("destroying a queue with waiters of every token kind aborts each of them", "[queue]") {
  tasks_on_loop h;
  auto q = std::make_unique<sluice::queue<std::string>>(h.loop.get_executor(), 1);
  auto& getter = h.spawn([&]() -> asio::awaitable<void> { (void)co_await q->get(); });
  h.poll();
  sluice::error_code cb_get = asio::error::would_block;
  q->async_get([&](sluice::error_code ec, std::string) { cb_get = ec; });
  std::future<std::string> fut_get = q->async_get(asio::use_future);
  h.poll();
  CHECK(q->getters() == 3);
  q.reset();
  h.poll();
  CHECK(getter.cancelled());
  CHECK(cb_get == asio::error::operation_aborted);
  REQUIRE(fut_get.wait_for(5s) == std::future_status::ready);
  CHECK_THROWS_AS(fut_get.get(), sluice::system_error);

  auto q2 = std::make_unique<sluice::queue<std::string>>(h.loop.get_executor(), 1);
  REQUIRE(q2->try_put(std::string(100, 'x')));
  auto& putter =
      h.spawn([&]() -> asio::awaitable<void> { co_await q2->put(std::string(100, 'y')); });
  sluice::error_code cb_put = asio::error::would_block;
  h.poll();
  q2->async_put(std::string(100, 'z'), [&](sluice::error_code ec) { cb_put = ec; });
  std::future<void> fut_put = q2->async_put(std::string(100, 'w'), asio::use_future);
  CHECK(q2->putters() == 3);
  q2.reset();
  h.poll();
  CHECK(putter.cancelled());
  CHECK(cb_put == asio::error::operation_aborted);
  REQUIRE(fut_put.wait_for(5s) == std::future_status::ready);
  CHECK_THROWS_AS(fut_put.get(), sluice::system_error);
}
