// SPDX-License-Identifier: BSL-1.0
// Adversarial review of the wait between two waves of results in next()'s own
// frame (stream_core::next), the abort reported through the core
// (consumer_aborted_), throw_if_cancelled turned off before wait_next() and
// put back there, and the range worker loop without its pulling_ check.
// Every time is virtual and exact.
#include <sluice/filter.hpp>
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/timeout.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lifetime.hpp>
#include <support/service_calls.hpp>
#include <support/spawned.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
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
using sluice_test::lifetime_counter;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// What the tasks of one stream did.
struct board {
  std::size_t now = 0, most = 0, started = 0, finished = 0, cancelled = 0;
};

// Task i: sleeps `d` and returns i. Cancelled, it cleans up for `cleanup`
// more, deaf to cancellation, then rethrows: whoever waits for every task
// ends exactly `cleanup` after the cancellation.
asio::awaitable<int> job(board& b, int i, nanoseconds d, nanoseconds cleanup = 300ms) {
  lifetime_counter in_frame;
  ++b.started;
  b.most = std::max(b.most, ++b.now);
  std::exception_ptr e;
  try {
    co_await sluice::sleep(d);
  } catch (...) {
    e = std::current_exception();
  }
  if (e) {
    ++b.cancelled;
    co_await asio::this_coro::reset_cancellation_state(
        [](asio::cancellation_type) { return asio::cancellation_type::none; });
    co_await sluice::sleep(cleanup);
    --b.now;
    std::rethrow_exception(e);
  }
  --b.now;
  ++b.finished;
  co_return i;
}

// How an awaited call ended: "ok", "aborted" or the what() of its exception
// (sluice_test::ending_of); when; how many tasks still ran then; and the
// caller's throw_if_cancelled right after it.
struct ending {
  std::string how;
  nanoseconds at{-1};
  std::size_t running = 99;
  bool tic = false;
};

template <class A>
asio::awaitable<ending> end_of(A a, const virtual_loop& loop, const board& b) {
  ending e;
  e.how = co_await sluice_test::ending_of(std::move(a));
  e.at = loop.now();
  e.running = b.now;
  e.tic = co_await asio::this_coro::throw_if_cancelled();
  co_return e;
}

// A consumer's loop: every result into `seen`.
asio::awaitable<void> drain(sluice::stream<int>& s, std::vector<int>& seen) {
  while (auto r = co_await s.next()) seen.push_back(*r);
}

// 0 at 100 ms, the others after `rest` (task 4 starts when 0 is read).
nanoseconds first_fast(int i, nanoseconds rest = 1s) {
  return i == 0 ? nanoseconds(100ms) : rest;
}

const char* type_name(asio::cancellation_type t) {
  return t == asio::cancellation_type::terminal  ? "terminal"
         : t == asio::cancellation_type::partial ? "partial"
                                                 : "total";
}

// A range of 0..n-1 whose iterator throws "increment" when it leaves
// `throw_at` (after that element was read: it is lost with the failure).
struct throwing_ints {
  int n = 0, throw_at = -1;
  struct sentinel {};
  struct iterator {
    using value_type = int;
    using difference_type = std::ptrdiff_t;
    const throwing_ints* r = nullptr;
    int i = 0;
    int operator*() const { return i; }
    iterator& operator++() {
      if (i == r->throw_at) throw std::runtime_error("increment");
      ++i;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(sentinel) const { return i == r->n; }
  };
  iterator begin() const { return {this, 0}; }
  sentinel end() const { return {}; }
};

}  // namespace

// ---- cancellation while next() waits in its own frame -----------------------

TEST_CASE(
    "next() cancelled between two waves waits for every task, throws operation_aborted and "
    "leaves throw_if_cancelled as it was",
    "[stream]") {
  using ct = asio::cancellation_type;
  for (ct type : {ct::terminal, ct::partial, ct::total}) {
    for (bool tic : {true, false}) {
      INFO(type_name(type) << " throw_if_cancelled " << tic);
      sluice_test::tasks_on_loop t;
      board b;
      ending e;
      std::optional<std::optional<int>> later;
      auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
        co_await asio::this_coro::throw_if_cancelled(tic);
        if (type == ct::partial)
          co_await asio::this_coro::reset_cancellation_state(asio::enable_partial_cancellation());
        if (type == ct::total)
          co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
        auto s =
            sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(20), 4);
        auto first = co_await s.next();  // the start, in wait_next()
        CHECK(first == 0);
        e = co_await end_of(s.next(), t.loop, b);  // in next()'s own frame
        co_await asio::this_coro::throw_if_cancelled(false);
        later.emplace(co_await s.next());
      });
      t.loop.run_for(500ms);
      consumer.signal.emit(type);
      t.loop.run_for(10s);
      CHECK(consumer.succeeded());
      CHECK(e.how == "aborted");
      CHECK(e.at == 800ms);  // the cancellation at 500 ms + 300 ms of cleanup
      CHECK(e.running == 0);
      CHECK(e.tic == tic);
      CHECK(b.started == 5);
      CHECK(b.cancelled == 4);
      REQUIRE(later);
      CHECK_FALSE(*later);
    }
  }
}

TEST_CASE("a cancellation type the caller filters out does not stop next() between waves",
          "[stream]") {
  sluice_test::tasks_on_loop t;
  board b;
  std::optional<int> got;
  nanoseconds at{-1};
  std::size_t cancelled = 99;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(5), 4);
    co_await s.next();
    got = co_await s.next();
    at = t.loop.now();
    cancelled = b.cancelled;
    co_await s.close();
  });
  t.loop.run_for(500ms);
  consumer.signal.emit(asio::cancellation_type::partial);  // the default filter: terminal only
  t.loop.run_for(10s);
  CHECK(consumer.succeeded());
  CHECK(got == 1);
  CHECK(at == 1s);
  CHECK(cancelled == 0);
}

TEST_CASE(
    "a second next() while one waits in next()'s frame throws; the first still gets its result",
    "[stream]") {
  sluice_test::tasks_on_loop t;
  board b;
  using stream_type =
      decltype(sluice::map_unordered([&](int i) { return job(b, i, 1s); }, iota_vec(1), 1));
  std::optional<stream_type> s;
  s.emplace(sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(5), 4));
  std::optional<int> got;
  std::string second;
  nanoseconds at{-1};
  auto& reader = t.spawn([&]() -> asio::awaitable<void> {
    co_await s->next();
    got = co_await s->next();  // waits in its own frame until 1 s
    at = t.loop.now();
    co_await s->close();
  });
  t.loop.run_for(500ms);
  auto& intruder = t.spawn(
      [&]() -> asio::awaitable<void> { second = co_await sluice_test::ending_of(s->next()); });
  t.loop.run_for(10s);
  CHECK(reader.succeeded());
  CHECK(intruder.succeeded());
  CHECK(second ==
        "sluice::stream::next: another next() is still waiting; a stream has one consumer");
  CHECK(got == 1);
  CHECK(at == 1s);
}

TEST_CASE(
    "a stream whose executor type is a strand, not any_io_executor, waits between waves and is "
    "cancelled there",
    "[stream]") {
  // The stream's posts go through an executor required and preferred once,
  // at the start: here a strand of the io_context's own executor type.
  using strand_t = asio::strand<asio::io_context::executor_type>;
  asio::io_context ctx;
  strand_t strand(ctx.get_executor());
  std::size_t started = 0, ended = 0;
  std::vector<int> seen;
  std::string how;
  bool done = false;
  asio::cancellation_signal cancel;
  auto fn = [&](int i) -> asio::awaitable<int, strand_t> {
    ++started;
    auto ex = co_await asio::this_coro::executor;
    if (i == 0) {
      co_await asio::post(ex, asio::use_awaitable_t<strand_t>{});
    } else {
      asio::steady_timer timer(ex, std::chrono::hours(1));  // only a cancellation ends it
      std::exception_ptr e;
      try {
        co_await timer.async_wait(asio::use_awaitable_t<strand_t>{});
      } catch (...) {
        e = std::current_exception();
      }
      ++ended;
      if (e) std::rethrow_exception(e);
    }
    if (i == 0) ++ended;
    co_return i;
  };
  auto consumer = [&]() -> asio::awaitable<void, strand_t> {
    auto s = sluice::map_unordered(fn, iota_vec(6), 4);
    auto first = co_await s.next();
    seen.push_back(*first);
    try {
      (void)co_await s.next();  // between two waves
      how = "value";
    } catch (const sluice::system_error& e) {
      how = e.code() == asio::error::operation_aborted ? "aborted" : e.what();
    }
    co_await asio::this_coro::throw_if_cancelled(false);
    auto later = co_await s.next();
    if (later) how += " then a value";
  };
  asio::co_spawn(strand, consumer(),
                 asio::bind_cancellation_slot(cancel.slot(), [&](std::exception_ptr e) {
                   done = true;
                   if (e) how = "threw " + sluice_test::ending_of_exception(e);
                 }));
  for (int k = 0; k < 100 && seen.empty(); ++k) ctx.poll();
  REQUIRE(seen == std::vector<int>{0});
  CHECK(started == 5);  // 1..3, then 4 when 0 was read
  cancel.emit(asio::cancellation_type::terminal);
  for (int k = 0; k < 100 && !done; ++k) ctx.poll();
  CHECK(done);
  CHECK(how == "aborted");
  CHECK(ended == 5);
}

TEST_CASE("a result and a cancellation at the same instant while next() waits between waves",
          "[stream]") {
  // Tasks 1..3 end at 1 s; the canceller's timer fires at 1 s too, armed
  // before them (it fires first) or after them (it fires after they ended).
  for (bool cancel_first : {true, false}) {
    for (bool tic : {true, false}) {
      INFO("cancel first " << cancel_first << " throw_if_cancelled " << tic);
      sluice_test::tasks_on_loop t;
      board b;
      std::vector<int> seen;
      ending e;
      sluice_test::task* consumer = nullptr;
      auto cancel_at_1s = [&]() -> asio::awaitable<void> {
        co_await sluice::sleep_until(sluice::clock::time_point(1s));
        consumer->cancel();
      };
      if (cancel_first) t.spawn(cancel_at_1s);
      consumer = &t.spawn([&]() -> asio::awaitable<void> {
        co_await asio::this_coro::throw_if_cancelled(tic);
        auto s =
            sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(20), 4);
        seen.push_back(*co_await s.next());
        if (!cancel_first) t.spawn(cancel_at_1s);  // armed at 100 ms, after tasks 1..3
        e = co_await end_of(drain(s, seen), t.loop, b);
        co_await asio::this_coro::throw_if_cancelled(false);
        co_await s.close();
      });
      t.loop.run_for(10s);
      CHECK(consumer->succeeded());
      CHECK(e.how == "aborted");
      CHECK(e.tic == tic);
      if (cancel_first) {
        // Nothing was handed out after the cancellation; task 4 (1.1 s) was
        // cancelled at 1 s and cleaned up until 1.3 s.
        CHECK(seen == std::vector<int>{0});
        CHECK(e.at == 1300ms);
        CHECK(e.running == 0);
        CHECK(b.started == 5);
      } else {
        // The wait had completed with 1..3 before the cancellation: 1 is
        // handed out. With throw_if_cancelled on, Asio throws at the next
        // co_await; with it off, the results waiting are handed out, then
        // the cancelled caller's next() stops the stream (before the slots
        // freed by the reads are served) and waits for task 4.
        if (tic) {
          CHECK(seen == std::vector<int>{0, 1});
          CHECK(e.at == 1s);  // Asio's throw: the stream still runs 4
          CHECK(e.running == 1);
        } else {
          CHECK(seen == std::vector<int>{0, 1, 2, 3});
          CHECK(e.at == 1300ms);
          CHECK(e.running == 0);
          CHECK(b.cancelled == 1);
        }
        CHECK(b.started == 5);
      }
    }
  }
}

TEST_CASE(
    "a caller cancelled before it calls a later next() gets the results waiting, then an abort "
    "after every task ended",
    "[stream]") {
  // throw_if_cancelled off (with it on, Asio throws at the co_await itself).
  for (bool results_waiting : {false, true}) {
    INFO("results waiting " << results_waiting);
    sluice_test::tasks_on_loop t;
    board b;
    std::vector<int> seen;
    ending e;
    auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
      co_await asio::this_coro::throw_if_cancelled(false);
      auto s =
          sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(20), 4);
      seen.push_back(*co_await s.next());
      try {
        co_await sluice::sleep(10s);  // cancelled at 500 ms or 1.5 s
      } catch (const sluice::system_error&) {
      }
      e = co_await end_of(drain(s, seen), t.loop, b);
      auto later = co_await s.next();
      CHECK_FALSE(later);
    });
    t.loop.run_for(results_waiting ? 1500ms : 500ms);
    consumer.cancel();
    t.loop.run_for(10s);
    CHECK(consumer.succeeded());
    CHECK(e.how == "aborted");
    CHECK_FALSE(e.tic);
    CHECK(e.running == 0);
    if (results_waiting) {
      // 1..4 waited (the stream full): handed out; the call that found
      // nothing stopped the stream before the freed slots were served.
      CHECK(seen == std::vector<int>{0, 1, 2, 3, 4});
      CHECK(e.at == 1500ms);
      CHECK(b.started == 5);
      CHECK(b.cancelled == 0);
    } else {
      CHECK(seen == std::vector<int>{0});
      CHECK(e.at == 800ms);
      CHECK(b.started == 5);
      CHECK(b.cancelled == 4);
    }
  }
}

TEST_CASE(
    "a task that throws while next() waits between waves is reported once, after its siblings "
    "ended",
    "[stream]") {
  for (bool tic : {true, false}) {
    INFO("throw_if_cancelled " << tic);
    virtual_loop loop;
    board b;
    ending e;
    std::vector<std::string> later;
    auto fn = [&](int i) -> asio::awaitable<int> {
      if (i == 1) {
        co_await sluice::sleep(500ms);
        throw std::runtime_error("task 1");
      }
      co_return co_await job(b, i, first_fast(i));
    };
    loop.run([&]() -> asio::awaitable<void> {
      co_await asio::this_coro::throw_if_cancelled(tic);
      auto s = sluice::map_unordered(fn, iota_vec(20), 4);
      auto first = co_await s.next();
      CHECK(first == 0);
      e = co_await end_of(s.next(), loop, b);
      for (int k = 0; k < 2; ++k) {
        auto r = co_await s.next();
        later.push_back(r ? "value" : "end");
      }
    });
    CHECK(e.how == "task 1");
    CHECK(e.at == 800ms);  // 2, 3, 4 cancelled at 500 ms, cleaned up for 300 ms
    CHECK(e.running == 0);
    CHECK(e.tic == tic);
    CHECK(b.cancelled == 3);
    CHECK(b.started == 4);  // 0, 2, 3, 4 (1 is not a job)
    CHECK(later == std::vector<std::string>{"end", "end"});
  }
}

TEST_CASE("throw_if_cancelled is unchanged after next() on every path", "[stream]") {
  // The start (wait_next), a result waiting (no wait), a wait in next()'s
  // frame that brings a result, one that brings the end (a filter drops the
  // last item: the wait_next() reached from next()'s frame), and the end.
  for (bool tic : {true, false}) {
    INFO("throw_if_cancelled " << tic);
    virtual_loop loop;
    std::vector<std::optional<int>> got;
    std::vector<bool> tics;
    std::vector<nanoseconds> at;
    auto fn = [](int i) -> asio::awaitable<std::optional<int>> {
      co_await sluice::sleep(i == 2 ? 300ms : i == 3 ? 500ms : 100ms);
      if (i == 3) co_return std::nullopt;
      co_return i;
    };
    loop.run([&]() -> asio::awaitable<void> {
      co_await asio::this_coro::throw_if_cancelled(tic);
      auto s = sluice::filter(fn, iota_vec(4), 2);
      for (int k = 0; k < 5; ++k) {
        got.push_back(co_await s.next());
        tics.push_back(co_await asio::this_coro::throw_if_cancelled());
        at.push_back(loop.now());
        if (k == 0) co_await sluice::sleep(50ms);  // 1 ends meanwhile: it waits
      }
    });
    CHECK(got == std::vector<std::optional<int>>{0, 1, 2, std::nullopt, std::nullopt});
    CHECK(at == std::vector<nanoseconds>{100ms, 150ms, 400ms, 650ms, 650ms});
    CHECK(tics == std::vector<bool>(5, tic));
  }
}

TEST_CASE("with_timeout expiring at the instant next() got its wave keeps the result", "[stream]") {
  // The deadline (armed at 100 ms, after tasks 1..3) falls at 1 s, when 1..3
  // end: the wait in next()'s frame has completed before the timer cancels
  // it, so the value is returned, not a timeout, and nothing is lost.
  virtual_loop loop;
  board b;
  std::vector<int> seen;
  std::string how;
  nanoseconds at{-1};
  loop.run([&]() -> asio::awaitable<void> {
    auto s =
        sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(20), 4);
    auto first = co_await s.next();
    seen.push_back(*first);
    try {
      auto r = co_await sluice::with_timeout(900ms, s.next());
      seen.push_back(*r);
      how = "value";
    } catch (const sluice::timeout_error&) {
      how = "timeout";
    }
    at = loop.now();
    co_await drain(s, seen);
  });
  CHECK(how == "value");
  CHECK(at == 1s);
  std::sort(seen.begin(), seen.end());
  CHECK(seen == iota_vec(20));
  CHECK(b.cancelled == 0);
}

TEST_CASE("next() cancelled between waves on another strand than the stream's", "[stream]") {
  // The stream starts on one strand; a coroutine on another reads on: its
  // wait completes by a post of its own (the abort too).
  sluice_test::tasks_on_loop t;
  auto first_strand = asio::make_strand(t.loop.get_executor());
  auto second_strand = asio::make_strand(t.loop.get_executor());
  board b;
  using stream_type =
      decltype(sluice::map_unordered([&](int i) { return job(b, i, 1s); }, iota_vec(1), 1));
  std::optional<stream_type> s;
  std::vector<int> seen;
  ending e;
  std::size_t on_second = 0;
  bool started = false, done = false;
  asio::cancellation_signal cancel;
  asio::co_spawn(
      first_strand,
      [&]() -> asio::awaitable<void> {
        s.emplace(sluice::map_unordered([&](int i) { return job(b, i, first_fast(i, 200ms)); },
                                        iota_vec(20), 4));
        auto r = co_await s->next();
        seen.push_back(*r);
        started = true;
      },
      asio::detached);
  t.loop.run_for(150ms);
  REQUIRE(started);
  asio::co_spawn(
      second_strand,
      [&]() -> asio::awaitable<void> {
        e = co_await end_of(
            [&]() -> asio::awaitable<void> {
              for (;;) {
                auto r = co_await s->next();
                if (!r) break;
                on_second += second_strand.running_in_this_thread() ? 1 : 0;
                seen.push_back(*r);
              }
            }(),
            t.loop, b);
        co_await asio::this_coro::throw_if_cancelled(false);
        co_await s->close();
        done = true;
      },
      asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr) {}));
  // 1..3 at 200 ms, 4 at 300 ms, 5..7 at 400 ms (the reads start them at
  // once), 8 at 500 ms; cancelled at 550 ms, between two waves.
  t.loop.run_for(400ms);
  cancel.emit(asio::cancellation_type::terminal);
  t.loop.run_for(10s);
  CHECK(done);
  CHECK(e.how == "aborted");
  CHECK(e.at == 850ms);
  CHECK(e.running == 0);
  CHECK(seen == iota_vec(9));
  CHECK(on_second == 8);
  CHECK(b.cancelled == 4);
}

// ---- a stream dropped while a wave is pending --------------------------------

TEST_CASE("a stream dropped while another coroutine's next() waits between waves ends that call",
          "[stream]") {
  // Dropped at 500 ms (nothing buffered), or at 1 s right after 1..3 ended
  // (their wake of the reader is on its way; the drop discards them).
  for (bool with_results : {false, true}) {
    INFO("with results " << with_results);
    sluice_test::tasks_on_loop t;
    board b;
    using stream_type =
        decltype(sluice::map_unordered([&](int i) { return job(b, i, 1s); }, iota_vec(1), 1));
    std::optional<stream_type> s;
    s.emplace(
        sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); }, iota_vec(20), 4));
    std::optional<std::optional<int>> got;
    nanoseconds at{-1};
    std::size_t now_at_end = 99;
    auto& reader = t.spawn([&]() -> asio::awaitable<void> {
      auto first = co_await s->next();
      CHECK(first == 0);
      // Armed at 100 ms, after tasks 1..3: at 1 s it runs after they ended.
      t.spawn([&]() -> asio::awaitable<void> {
        co_await sluice::sleep(with_results ? 900ms : 400ms);
        s.reset();
      });
      got.emplace(co_await s->next());
      at = t.loop.now();
      now_at_end = b.now;
    });
    t.loop.run_for(10s);
    CHECK(reader.succeeded());
    REQUIRE(got);
    CHECK_FALSE(*got);
    CHECK(now_at_end == 0);
    CHECK(b.now == 0);
    if (with_results) {
      CHECK(b.finished == 4);   // 0..3
      CHECK(b.cancelled == 1);  // 4, until 1.3 s
      CHECK(at == 1300ms);
    } else {
      CHECK(b.cancelled == 4);
      CHECK(at == 800ms);
    }
  }
}

// ---- pipelines cancelled at a later next() -----------------------------------

TEST_CASE("a pipeline cancelled at a later next() closes its upstream before it throws",
          "[stream]") {
  // by: 0 a cancellation signal, 1 with_timeout around next(); the stage read
  // is a map_unordered or a filter over an upstream map_unordered.
  for (int by = 0; by < 2; ++by) {
    for (bool use_filter : {false, true}) {
      INFO("by " << by << " filter " << use_filter);
      sluice_test::tasks_on_loop t;
      slow_service up({.latency = latency::from(
                           [](const auto& c) -> nanoseconds { return c.index < 3 ? 100ms : 5s; })});
      // Downstream: 0 ends at 1.1 s, 1 at 2.1 s, 2 (started at 1.1 s) at 3.1 s.
      board down;
      std::string how;
      nanoseconds ended_at{-1};
      std::size_t up_at_end = 99, down_at_end = 99, up_calls = 0;
      bool later_empty = false;
      auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
        auto upstream = sluice::map_unordered([&](int i) { return call(up, i); }, iota_vec(50), 8);
        auto body = [&](auto s) -> asio::awaitable<void> {
          auto first = co_await s.next();  // at 1.1 s: 1 and 2 run downstream
          CHECK(first == 0);
          if (by == 0) {
            how = co_await sluice_test::ending_of(s.next());
          } else {
            try {
              co_await sluice::with_timeout(400ms, s.next());
              how = "value";
            } catch (const sluice::timeout_error&) {
              how = "timeout";
            }
          }
          ended_at = t.loop.now();
          up_at_end = up.in_flight();
          down_at_end = down.now;
          up_calls = up.calls();
          co_await asio::this_coro::throw_if_cancelled(false);
          co_await asio::this_coro::reset_cancellation_state();
          co_await sluice::sleep(10s);
          auto later = co_await s.next();
          later_empty = !later;
        };
        auto d = [&](int i) {
          return job(down, i, i == 0 ? 1s : 2s);
        };
        if (use_filter) {
          co_await body(sluice::filter(
              [&](int i) -> asio::awaitable<std::optional<int>> { co_return co_await d(i); },
              std::move(upstream), 2));
        } else {
          co_await body(sluice::map_unordered(d, std::move(upstream), 2));
        }
      });
      if (by == 0) {
        t.loop.run_for(1500ms);
        consumer.cancel();
      }
      t.loop.run_for(30s);
      CHECK(consumer.done);
      CHECK(how == (by == 0 ? "aborted" : "timeout"));
      CHECK(ended_at == 1800ms);  // cancelled at 1.5 s; the downstream's cleanup
      CHECK(up_at_end == 0);
      CHECK(down_at_end == 0);
      CHECK(up.calls() == up_calls);
      CHECK(later_empty);
    }
  }
}

// ---- the loop goes while next() waits in its own frame -------------------------

TEST_CASE("an io_context destroyed while next() waits between waves frees everything (ASan)",
          "[stream]") {
  // 0 a stream in the consumer's frame; 1 a pipeline; 2 for_each with a body
  // the workers run (its sink installed); 3 the consumer cancelled, waiting
  // for the tasks' cleanup; 4 a pipeline's consumer cancelled, waiting for
  // the upstream's cleanup; 5 a stream that outlives its loop, destroyed
  // after it.
  for (int variant = 0; variant < 6; ++variant) {
    INFO("variant " << variant);
    const int before = lifetime_counter::live();
    board b, up;
    using stream_type =
        decltype(sluice::map_unordered([&](int i) { return job(b, i, 1s); }, iota_vec(1), 1));
    std::optional<stream_type> outside;
    {
      auto l = std::make_unique<virtual_loop>();
      asio::cancellation_signal cancel;
      auto d = [&](int i) {
        return job(b, i, first_fast(i));
      };
      auto body = [&]() -> asio::awaitable<void> {
        lifetime_counter in_frame;
        if (variant == 0 || variant == 3) {
          auto s = sluice::map_unordered(d, iota_vec(50), 4);
          while (auto r = co_await s.next()) {
          }
        } else if (variant == 1 || variant == 4) {
          auto s = sluice::map_unordered(
              d,
              sluice::map_unordered([&](int i) { return job(up, i, i < 2 ? 50ms : 1s); },
                                    iota_vec(50), 8),
              2);
          while (auto r = co_await s.next()) {
          }
        } else if (variant == 2) {
          co_await sluice::for_each(sluice::map_unordered(d, iota_vec(50), 4), [](int) {});
        } else {
          while (auto r = co_await outside->next()) {
          }
        }
      };
      if (variant == 5)
        outside.emplace(sluice::map_unordered([&](int i) { return job(b, i, first_fast(i)); },
                                              iota_vec(50), 4));
      asio::co_spawn(l->get_executor(), body(),
                     asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr) {}));
      l->run_for(500ms);
      CHECK(b.now > 0);
      if (variant == 3 || variant == 4) {
        cancel.emit(asio::cancellation_type::terminal);
        l->run_for(100ms);  // cleaning up until 800 ms
        CHECK(b.now + up.now > 0);
      }
      l.reset();  // the loop goes with everything pending
    }
    outside.reset();
    CHECK(lifetime_counter::live() == before);
  }
}

// ---- range inputs that throw mid-range ----------------------------------------

TEST_CASE("a range whose iterator throws mid-range: results before it, then the failure once",
          "[stream]") {
  // Every task takes 100 ms (cleanup 50 ms); the iterator throws when it
  // leaves element 4 (limit 3: when 1 is read at 100 ms, with 3 running), or
  // element 1 (limit 1), or element 2 (limit 20: at once, 0..2 running).
  struct shape {
    std::size_t limit;
    int throw_at;
    bool settle;
    std::vector<int> seen;
    nanoseconds failed_at;
    std::size_t started;
  };
  for (const shape& c : {
           shape{1, 1, false, {0}, 100ms, 1},
           shape{3, 4, false, {0, 1, 2}, 150ms, 4},
           shape{20, 2, false, {}, 50ms, 2},
           shape{3, 4, true, {0, 1, 2, 3}, 200ms, 4},
           shape{20, 2, true, {0, 1}, 100ms, 2},
       }) {
    INFO("limit " << c.limit << " throw at " << c.throw_at << " settle " << c.settle);
    virtual_loop loop;
    board b;
    throwing_ints in{.n = 10, .throw_at = c.throw_at};
    std::vector<int> seen;
    std::string how;
    nanoseconds failed_at{-1};
    std::size_t running_after = 99;
    auto fn = [&](int i) {
      return job(b, i, 100ms, 50ms);
    };
    loop.run([&]() -> asio::awaitable<void> {
      if (c.settle) {
        auto s = sluice::map_unordered(fn, in, c.limit, sluice::return_exceptions);
        how = co_await sluice_test::ending_of([&]() -> asio::awaitable<void> {
          while (auto r = co_await s.next()) seen.push_back(r->value());
        }());
        failed_at = loop.now();
        running_after = s.running();
        CHECK_FALSE(co_await s.next());
      } else {
        auto s = sluice::map_unordered(fn, in, c.limit);
        how = co_await sluice_test::ending_of([&]() -> asio::awaitable<void> {
          while (auto r = co_await s.next()) seen.push_back(*r);
        }());
        failed_at = loop.now();
        running_after = s.running();
        CHECK_FALSE(co_await s.next());
      }
    });
    std::sort(seen.begin(), seen.end());
    CHECK(how == "increment");
    CHECK(seen == c.seen);
    CHECK(failed_at == c.failed_at);
    CHECK(b.started == c.started);
    CHECK(b.now == 0);
    CHECK(running_after == 0);
  }
}

TEST_CASE("a task factory that throws mid-range fails like a task, counted as ended", "[stream]") {
  // fn throws for input 4 instead of returning its task (limit 3: when 1 is
  // read at 100 ms, with 3 running since 100 ms).
  for (bool settle : {false, true}) {
    INFO("settle " << settle);
    virtual_loop loop;
    board b;
    std::vector<int> seen;
    std::vector<std::string> errors;
    std::string how;
    nanoseconds ended_at{-1};
    std::size_t running_after = 99;
    auto fn = [&](int i) {
      if (i == 4) throw std::runtime_error("factory");
      return job(b, i, 100ms, 50ms);
    };
    loop.run([&]() -> asio::awaitable<void> {
      if (settle) {
        auto s = sluice::map_unordered(fn, iota_vec(8), 3, sluice::return_exceptions);
        how = co_await sluice_test::ending_of([&]() -> asio::awaitable<void> {
          while (auto r = co_await s.next()) {
            if (*r) {
              seen.push_back(r->value());
            } else {
              errors.push_back(sluice_test::ending_of_exception(r->error()));
            }
          }
        }());
        running_after = s.running();
      } else {
        auto s = sluice::map_unordered(fn, iota_vec(8), 3);
        how = co_await sluice_test::ending_of([&]() -> asio::awaitable<void> {
          while (auto r = co_await s.next()) seen.push_back(*r);
        }());
        running_after = s.running();
      }
      ended_at = loop.now();
    });
    std::sort(seen.begin(), seen.end());
    CHECK(running_after == 0);
    CHECK(b.now == 0);
    if (settle) {
      CHECK(how == "ok");
      CHECK(seen == std::vector<int>{0, 1, 2, 3, 5, 6, 7});
      CHECK(errors == std::vector<std::string>{"factory"});
      CHECK(b.started == 7);
    } else {
      CHECK(how == "factory");
      CHECK(seen == std::vector<int>{0, 1, 2});
      CHECK(ended_at == 150ms);  // 3 cancelled at 100 ms, cleaned up for 50 ms
      CHECK(b.started == 4);
      CHECK(b.cancelled == 1);
    }
  }
}

// ---- limits -------------------------------------------------------------------

TEST_CASE("limit 1 and a limit above the input: every wave at its exact time", "[stream]") {
  // Latencies 300, 100, 200, 50 ms; the consumer works 150 ms on each result.
  const std::vector<nanoseconds> d{300ms, 100ms, 200ms, 50ms};
  for (std::size_t limit : {std::size_t{1}, std::size_t{10}}) {
    INFO("limit " << limit);
    virtual_loop loop;
    board b;
    std::vector<int> seen;
    std::vector<nanoseconds> at;
    loop.run([&]() -> asio::awaitable<void> {
      auto s = sluice::map_unordered(
          [&](int i) { return job(b, i, d[static_cast<std::size_t>(i)]); }, iota_vec(4), limit);
      while (auto r = co_await s.next()) {
        seen.push_back(*r);
        at.push_back(loop.now());
        co_await sluice::sleep(150ms);
      }
      at.push_back(loop.now());
    });
    CHECK(b.most == std::min<std::size_t>(limit, 4));
    if (limit == 1) {
      // Each input starts when the previous result is read.
      CHECK(seen == std::vector<int>{0, 1, 2, 3});
      CHECK(at == std::vector<nanoseconds>{300ms, 450ms, 650ms, 800ms, 950ms});
    } else {
      CHECK(seen == std::vector<int>{3, 1, 2, 0});
      CHECK(at == std::vector<nanoseconds>{50ms, 200ms, 350ms, 500ms, 650ms});
    }
  }
}

// ---- for_each stopped by its body during a wave ---------------------------------

TEST_CASE("for_each whose body throws or returns false mid-burst waits for every task",
          "[for_each]") {
  // 0..2 end at 1 s (a burst), 3.. take 2 s; the body stops on 1. kind: 0 a
  // body the workers run that throws, 1 the same returning false, 2 an
  // awaitable body (10 ms each) returning false.
  for (int kind = 0; kind < 3; ++kind) {
    INFO("kind " << kind);
    virtual_loop loop;
    board b;
    std::vector<int> seen;
    std::string how;
    nanoseconds ended_at{-1};
    auto fn = [&](int i) {
      return job(b, i, i < 3 ? 1s : 2s);
    };
    loop.run([&]() -> asio::awaitable<void> {
      auto s = sluice::map_unordered(fn, iota_vec(20), 4);
      if (kind == 0) {
        how = co_await sluice_test::ending_of(sluice::for_each(std::move(s), [&](int r) {
          seen.push_back(r);
          if (r == 1) throw std::logic_error("body");
        }));
      } else if (kind == 1) {
        how = co_await sluice_test::ending_of(sluice::for_each(std::move(s), [&](int r) {
          seen.push_back(r);
          return r != 1;
        }));
      } else {
        how = co_await sluice_test::ending_of(
            sluice::for_each(std::move(s), [&](int r) -> asio::awaitable<bool> {
              seen.push_back(r);
              co_await sluice::sleep(10ms);
              co_return r != 1;
            }));
      }
      ended_at = loop.now();
    });
    CHECK(how == (kind == 0 ? "body" : "ok"));
    CHECK(seen == std::vector<int>{0, 1});
    CHECK(b.now == 0);
    if (kind < 2) {
      // The burst's slots go back after it (one post): nothing new started.
      CHECK(b.started == 4);
      CHECK(b.cancelled == 1);  // 3
      CHECK(ended_at == 1300ms);
    } else {
      // 4 started when 0 was read (1 s), 5 when 1 was (1.01 s); 3, 4, 5 are
      // cancelled when the body returns false at 1.02 s.
      CHECK(b.started == 6);
      CHECK(b.cancelled == 3);
      CHECK(ended_at == 1320ms);
    }
  }
}
