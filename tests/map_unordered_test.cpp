// SPDX-License-Identifier: BSL-1.0
#include <sluice/map_unordered.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/recorded_input.hpp>
#include <support/service_calls.hpp>
#include <support/spawned.hpp>
#include <support/stderr_capture.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
using sluice_test::call;
using sluice_test::call_or_fail;
using sluice_test::iota_vec;
using sluice_test::recorded_input;
using sluice_test::recorded_source;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// Counts tasks in flight, as the harness does, for tasks that are plain sleeps.
struct flight {
  std::size_t now = 0, max = 0, started = 0, finished = 0, cancelled = 0;
};

// Sleeps `d` milliseconds and returns `d`.
asio::awaitable<int> nap(flight& f, int d) {
  ++f.started;
  f.max = std::max(f.max, ++f.now);
  try {
    co_await sluice::sleep(milliseconds(d));
  } catch (...) {
    --f.now;
    ++f.cancelled;
    throw;
  }
  --f.now;
  ++f.finished;
  co_return d;
}

// Sleeps `d` ms then throws a runtime_error naming `d` (d < 0: throws at |d|).
asio::awaitable<int> nap_or_fail(flight& f, int d) {
  if (d >= 0) co_return co_await nap(f, d);
  co_await nap(f, -d);
  throw std::runtime_error("task " + std::to_string(-d) + " failed");
}

// Whether awaiting `a` throws an E. (Never co_await inside a Catch2 macro:
// g++ 12 evaluates a co_await in the macro's short-circuited operand too.)
template <class E, class A>
asio::awaitable<bool> throws(A a) {
  try {
    co_await std::move(a);
  } catch (const E&) {
    co_return true;
  }
  co_return false;
}

// One result and when the consumer got it.
struct got {
  int value;
  nanoseconds at;
  bool operator==(const got&) const = default;
};

template <class Stream>
asio::awaitable<std::vector<got>> drain(virtual_loop& loop, Stream& s) {
  std::vector<got> out;
  while (auto r = co_await s.next()) out.push_back({*r, loop.now()});
  co_return out;
}

}  // namespace

// ---- 1. completion order -------------------------------------------------

TEST_CASE("results are yielded in completion order without head-of-line blocking",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto s =
        sluice::map_unordered([&](int d) { return nap(f, d); }, std::vector{100, 200, 200, 100}, 2);
    co_return co_await drain(loop, s);
  });
  CHECK(r == std::vector<got>{{100, 100ms}, {200, 200ms}, {200, 300ms}, {100, 300ms}});
  CHECK(loop.now() == 300ms);
  CHECK(f.max == 2);
}

TEST_CASE("limit 2 over .1 .2 .3 .3 .2 .1 is done at 0.6 s", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); },
                                   std::vector{100, 200, 300, 300, 200, 100}, 2);
    co_return co_await drain(loop, s);
  });
  CHECK(r ==
        std::vector<got>{
            {100, 100ms}, {200, 200ms}, {300, 400ms}, {300, 500ms}, {200, 600ms}, {100, 600ms}});
  CHECK(loop.now() == 600ms);
  CHECK(f.max == 2);
}

// ---- 2. laziness ---------------------------------------------------------

TEST_CASE("a stream starts nothing before its first next()", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({100, 100, 100});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 2);
    co_await sluice::sleep(1s);
    CHECK(in.pulled() == 0);
    CHECK(f.started == 0);
    auto first = co_await s.next();
    CHECK(first == 100);
    CHECK(loop.now() == 1100ms);
  });
}

namespace {

// 0..n-1 through an iterator with no default constructor (the cursor keeps
// it in an optional until begin() is called); counts the calls of begin().
struct no_default_ints {
  int n = 0;
  int* begun = nullptr;
  struct sentinel {};
  struct iterator {
    using value_type = int;
    using difference_type = std::ptrdiff_t;
    explicit iterator(int first) : i(first) {}
    int i;
    int operator*() const { return i; }
    iterator& operator++() {
      ++i;
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(sentinel) const { return i == 100; }
  };
  iterator begin() const {
    ++*begun;
    return iterator(100 - n);
  }
  sentinel end() const { return {}; }
};
static_assert(!std::default_initializable<no_default_ints::iterator>);

}  // namespace

TEST_CASE(
    "a range whose iterator has no default constructor is begun at the first next(), once, and "
    "read to its end",
    "[map_unordered]") {
  virtual_loop loop;
  flight f;
  int begun = 0;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, no_default_ints{3, &begun}, 2);
    co_await sluice::sleep(1s);
    CHECK(begun == 0);
    std::vector<int> got;
    while (auto r = co_await s.next()) got.push_back(*r);
    CHECK(got == std::vector<int>{97, 98, 99});
    CHECK(begun == 1);
    CHECK(loop.now() == 1000ms + 196ms);  // 97 and 98 at 0, 99 when 97 ends
  });
}

TEST_CASE(
    "the input is advanced only when a slot is free, and its end is seen after the first results",
    "[map_unordered]") {
  virtual_loop loop;
  flight f;
  std::vector<std::string> log;
  auto stamp = [&](const std::string& what) {
    log.push_back(
        what + " @" +
        std::to_string(milliseconds(std::chrono::duration_cast<milliseconds>(loop.now())).count()));
  };
  recorded_input<int> in({100, 200, 200, 100});
  in.on_pull([&](std::size_t i) { stamp("pull " + std::to_string(i)); });
  in.on_end([&] { stamp("iter end"); });
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 2);
    while (auto r = co_await s.next()) stamp("result " + std::to_string(*r));
    stamp("done");
  });
  CHECK(log == std::vector<std::string>{"pull 0 @0", "pull 1 @0", "result 100 @100", "pull 2 @100",
                                        "result 200 @200", "pull 3 @200", "result 200 @300",
                                        "result 100 @300", "iter end @300", "done @300"});
}

// ---- 3, 4. backpressure --------------------------------------------------

TEST_CASE("with a slow consumer, running plus unread tasks never exceed the limit",
          "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(10ms)});
  recorded_input<int> in([] {
    std::vector<int> v(20);
    for (int i = 0; i < 20; ++i) v[static_cast<std::size_t>(i)] = i;
    return v;
  }());
  std::size_t read = 0;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, in, 3);
    while (auto r = co_await s.next()) {
      ++read;
      // A result is read once next() returned it: pulled - read <= 3.
      CHECK(s.running() + s.ready() <= 3);
      CHECK(in.pulled() <= read + 3);
      co_await sluice::sleep(1s);  // a slow consumer: the freed slot was refilled, no more
      CHECK(in.pulled() == std::min<std::size_t>(20, read + 3));
      CHECK(s.running() + s.ready() <= 3);
    }
  });
  CHECK(read == 20);
  CHECK(svc.max_in_flight() == 3);
  CHECK(loop.now() == 20s + 10ms);
}

TEST_CASE("with limit 1 the next task runs while the consumer works on the previous result",
          "[map_unordered]") {
  virtual_loop loop;
  std::vector<std::string> log;
  loop.run([&]() -> asio::awaitable<void> {
    auto print = [&](int i) -> asio::awaitable<int> {
      log.push_back(std::to_string(i) + " (async)");
      co_return i;
    };
    auto s = sluice::map_unordered(print, std::vector{0, 1, 2, 3}, 1);
    while (co_await s.next()) {
      co_await sluice::sleep(100ms);
      log.push_back("got result");
    }
  });
  // Each result frees its slot when next() returns it; the next result then
  // waits unread (the slot stays taken) until the consumer asks again.
  CHECK(log == std::vector<std::string>{"0 (async)", "1 (async)", "got result", "2 (async)",
                                        "got result", "3 (async)", "got result", "got result"});
  CHECK(loop.now() == 400ms);
}

TEST_CASE("limit 1 overlaps the consumer's work with the next task: 3 x 100 ms end at 400 ms",
          "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(100ms)});
  std::vector<nanoseconds> got_at;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, std::vector{0, 1, 2}, 1);
    while (co_await s.next()) {
      got_at.push_back(loop.now());
      co_await sluice::sleep(100ms);  // the consumer's work on the result
    }
  });
  // Task 0 runs 0..100 ms; task 1 runs 100..200 ms while the consumer works on
  // result 0; task 2 runs 200..300 ms; the consumer finishes result 2 at 400 ms.
  // (A slot held until the following next() made it 600 ms.)
  CHECK(got_at == std::vector<nanoseconds>{100ms, 200ms, 300ms});
  CHECK(loop.now() == 400ms);
  CHECK(svc.max_in_flight() == 1);
  std::vector<nanoseconds> starts;
  for (const auto& c : svc.timeline()) starts.push_back(c.start);
  CHECK(starts == std::vector<nanoseconds>{0ms, 100ms, 200ms});
}

TEST_CASE("no input is pulled while limit results wait unread", "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(10ms)});
  recorded_input<int> in({0, 1, 2, 3, 4, 5});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, in, 2);
    auto first = co_await s.next();  // starts the stream; 0 and 1 started at 0 ms
    CHECK(first == 0);
    CHECK(loop.now() == 10ms);
    co_await sluice::sleep(1s);  // 1 and 2 finished, unread: the limit is reached
    CHECK(s.ready() == 2);
    CHECK(s.running() == 0);
    CHECK(in.pulled() == 3);
    CHECK(svc.calls() == 3);
    auto second = co_await s.next();  // reads 1: exactly one more input
    CHECK(second == 1);
    co_await sluice::sleep(1s);
    CHECK(s.running() + s.ready() == 2);
    CHECK(in.pulled() == 4);
    CHECK(svc.calls() == 4);
    co_await s.close();
  });
  CHECK(svc.max_in_flight() == 2);
}

TEST_CASE("tasks keep running while the consumer is busy", "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  std::vector<nanoseconds> at;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, std::vector{0, 1, 2, 3}, 4);
    bool first = true;
    while (co_await s.next()) {
      at.push_back(loop.now());
      if (std::exchange(first, false)) co_await sluice::sleep(1s);
    }
  });
  CHECK(at == std::vector<nanoseconds>{1s, 2s, 2s, 2s});
  for (const auto& c : svc.timeline()) CHECK(c.end == 1s);
  CHECK(loop.now() == 2s);
}

// ---- 5. empty input, bad limit -------------------------------------------

TEST_CASE("empty input yields nothing at once", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, std::vector<int>{}, 4);
    auto r223 = co_await s.next();
    CHECK_FALSE(r223);
    auto r224 = co_await s.next();
    CHECK_FALSE(r224);
    auto a =
        sluice::map_unordered([&](int d) { return nap(f, d); }, recorded_source<int>({}, 0ms), 4);
    auto r227 = co_await a.next();
    CHECK_FALSE(r227);
  });
  CHECK(loop.now() == 0s);
  CHECK(f.started == 0);
}

TEST_CASE("limit 0 throws invalid_argument before anything starts", "[map_unordered]") {
  flight f;
  recorded_input<int> in({1, 2});
  auto fn = [&](int d) {
    return nap(f, d);
  };
  CHECK_THROWS_AS(sluice::map_unordered(fn, in, 0), std::invalid_argument);
  CHECK_THROWS_AS(sluice::map_unordered(fn, in, 0, sluice::return_exceptions),
                  std::invalid_argument);
  CHECK_THROWS_AS(sluice::as_completed(std::vector<asio::awaitable<int>>{}, 0),
                  std::invalid_argument);
  CHECK(in.pulled() == 0);
  CHECK(f.started == 0);
}

// ---- 6. fail fast --------------------------------------------------------

TEST_CASE("a task's exception is rethrown after its running siblings were cancelled and finished",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({1000, -2000, 5000, 100, 100});
  std::vector<got> seen;
  std::optional<nanoseconds> threw_at;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap_or_fail(f, d); }, in, 3);
    try {
      while (auto r = co_await s.next()) seen.push_back({*r, loop.now()});
    } catch (const std::runtime_error& e) {
      threw_at = loop.now();
      CHECK(std::string(e.what()) == "task 2000 failed");
      CHECK(f.now == 0);  // nothing runs any more
    }
    auto r262 = co_await s.next();  // later calls yield nothing
    CHECK_FALSE(r262);
    auto r263 = co_await s.next();
    CHECK_FALSE(r263);
  });
  REQUIRE(threw_at);
  CHECK(*threw_at == 2s);
  // 1000 finished at 1 s and freed its slot for 100 (1 s .. 1.1 s), then 100.
  CHECK(seen == std::vector<got>{{1000, 1s}, {100, 1100ms}, {100, 1200ms}});
  CHECK(in.pulled() == 5);
  CHECK(f.cancelled == 1);  // 5000
}

TEST_CASE("fail fast stops pulling the input", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({-100, 1000, 1000, 1000, 1000, 1000});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap_or_fail(f, d); }, in, 2);
    const bool thrown279 = co_await throws<std::runtime_error>(s.next());
    CHECK(thrown279);
    CHECK(loop.now() == 100ms);
    auto r281 = co_await s.next();
    CHECK_FALSE(r281);
  });
  CHECK(in.pulled() == 2);
  CHECK(f.cancelled == 1);
  CHECK(f.now == 0);
}

TEST_CASE("an exception of a task cancelled after the first failure is not the one reported",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  loop.run([&]() -> asio::awaitable<void> {
    auto fn = [&](int d) -> asio::awaitable<int> {
      if (d < 0) co_return co_await nap_or_fail(f, d);
      try {
        co_await nap(f, d);
      } catch (...) {
        throw std::logic_error("cleanup failed too");
      }
      co_return d;
    };
    auto s = sluice::map_unordered(fn, std::vector{5000, -100, 5000}, 3);
    try {
      co_await s.next();
      FAIL("next() should have thrown");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "task 100 failed");
    }
    CHECK(loop.now() == 100ms);
    CHECK(f.cancelled == 2);
    auto r311 = co_await s.next();
    CHECK_FALSE(r311);
  });
}

// ---- 7. return_exceptions ------------------------------------------------

TEST_CASE("return_exceptions processes every input and yields outcomes", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  std::vector<int> values;
  std::vector<std::string> errors;
  loop.run([&]() -> asio::awaitable<void> {
    auto s =
        sluice::map_unordered([&](int d) { return nap_or_fail(f, d); },
                              std::vector{100, -200, 300, -50, 100}, 2, sluice::return_exceptions);
    static_assert(std::is_same_v<decltype(s), sluice::stream<sluice::outcome<int>>>);
    while (auto r = co_await s.next()) {
      if (*r) {
        values.push_back(r->value());
      } else {
        try {
          std::rethrow_exception(r->error());
        } catch (const std::runtime_error& e) {
          errors.emplace_back(e.what());
        }
      }
    }
  });
  CHECK(values == std::vector<int>{100, 100, 300});
  CHECK(errors == std::vector<std::string>{"task 200 failed", "task 50 failed"});
  CHECK(f.cancelled == 0);
  CHECK(f.finished == 5);
  CHECK(loop.now() == 400ms);
}

// ---- 8. the input fails --------------------------------------------------

TEST_CASE("an exception from the input range cancels the running tasks and is rethrown",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({100, 1000, 1000, 1000});
  in.throw_at(2);
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 2);
    auto r355 = co_await s.next();
    CHECK(r355 == 100);
    const bool thrown356 = co_await throws<sluice_test::input_failure>(s.next());
    CHECK(thrown356);
    CHECK(loop.now() == 100ms);  // the 1000 ms task was cancelled, not awaited
    CHECK(f.now == 0);
    auto r359 = co_await s.next();
    CHECK_FALSE(r359);
  });
  CHECK(f.cancelled == 1);
  CHECK(in.pulled() == 2);
}

TEST_CASE("with return_exceptions an input exception lets running tasks finish, then is rethrown",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({100, 1000, 1000, 1000});
  in.throw_at(2);
  std::vector<got> seen;
  loop.run([&]() -> asio::awaitable<void> {
    auto s =
        sluice::map_unordered([&](int d) { return nap(f, d); }, in, 2, sluice::return_exceptions);
    try {
      while (auto r = co_await s.next()) seen.push_back({r->value(), loop.now()});
      FAIL("next() should have thrown");
    } catch (const sluice_test::input_failure&) {
      CHECK(loop.now() == 1s);
    }
    auto r380 = co_await s.next();
    CHECK_FALSE(r380);
  });
  CHECK(seen == std::vector<got>{{100, 100ms}, {1000, 1s}});
  CHECK(f.cancelled == 0);
}

TEST_CASE("an exception from an async source's next() is rethrown after the running tasks ended",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_source<int> src({1000, 1000, 1000}, 100ms);
  src.throw_at(1);
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, src, 3);
    const bool thrown394 = co_await throws<sluice_test::input_failure>(s.next());
    CHECK(thrown394);
    CHECK(loop.now() == 200ms);
    CHECK(f.now == 0);
  });
  CHECK(f.cancelled == 1);
}

// ---- 9. early exit -------------------------------------------------------

TEST_CASE("destroying a stream after 3 of 1000 results leaves nothing running", "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::uniform(100ms, 900ms, 7)});
  std::vector<int> inputs(1000);
  for (int i = 0; i < 1000; ++i) inputs[static_cast<std::size_t>(i)] = i;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, inputs, 8);
    int n = 0;
    while (co_await s.next())
      if (++n == 3) break;
    CHECK(svc.in_flight() > 0);
  });  // the stream is destroyed here, without waiting
  loop.poll();
  CHECK(svc.in_flight() == 0);
  CHECK(svc.cancellations() > 0);
  CHECK(svc.calls() <= 3 + 8);  // at most 3 read + 8 taken
  CHECK(svc.completed() + svc.cancellations() == svc.calls());
}

TEST_CASE("close() cancels the running tasks and returns once they all finished",
          "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::sequence({1s, 2s, 2s, 2s, 2s, 2s})});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); },
                                   std::vector{0, 1, 2, 3, 4, 5}, 4);
    co_await s.next();
    CHECK(svc.in_flight() == 3);  // the freed slot is refilled once the consumer yields
    co_await s.close();
    CHECK(svc.in_flight() == 0);
    CHECK(svc.cancellations() == 3);
    CHECK(loop.now() == 1s);
    auto r433 = co_await s.next();
    CHECK_FALSE(r433);
  });
}

TEST_CASE("a stream destroyed before its first next() never starts", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({1, 2, 3});
  loop.run([&]() -> asio::awaitable<void> {
    {
      auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 2);
    }
    co_await sluice::sleep(1s);
  });
  CHECK(in.pulled() == 0);
  CHECK(f.started == 0);
}

// ---- 10. an async source is pulled one next() at a time -------------------

TEST_CASE("an async source is never asked for next() concurrently", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  recorded_source<int> src({300, 300, 300, 300, 300, 300, 300, 300}, 10ms);
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, src, 4);
    co_return co_await drain(loop, s);
  });
  CHECK(src.max_active() == 1);
  CHECK(src.calls() == 9);
  CHECK(f.max == 4);
  // Pulls end at 10, 20, 30, 40 ms; the 5th waits for a slot (310 ms) and
  // ends at 320 ms, ..., the 8th ends at 350 ms and its task at 650 ms.
  CHECK(r.front() == got{300, 310ms});
  CHECK(r.back() == got{300, 650ms});
  CHECK(loop.now() == 650ms);
}

// ---- 11. cancelling the consumer -----------------------------------------

TEST_CASE(
    "cancelling the consumer waiting in next() cancels the tasks and throws operation_aborted",
    "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  asio::cancellation_signal cancel;
  std::optional<sluice::error_code> ec;
  std::optional<nanoseconds> ended_at;
  std::size_t in_flight_at_end = 99;
  auto consumer = [&]() -> asio::awaitable<void> {
    auto s =
        sluice::map_unordered([&](int i) { return call(svc, i); }, std::vector{0, 1, 2, 3, 4}, 3);
    try {
      while (co_await s.next()) {
      }
    } catch (const sluice::system_error& e) {
      ec = e.code();
      ended_at = loop.now();
      in_flight_at_end = svc.in_flight();
    }
  };
  asio::co_spawn(loop.get_executor(), consumer(),
                 asio::bind_cancellation_slot(cancel.slot(), [](std::exception_ptr) {}));
  loop.run_for(1500ms);
  CHECK(svc.in_flight() == 2);  // 0..2 ran 0..1 s; 3 and 4 run since 1 s
  cancel.emit(asio::cancellation_type::terminal);
  loop.poll();
  REQUIRE(ec);
  CHECK(*ec == asio::error::operation_aborted);
  CHECK(*ended_at == 1500ms);
  CHECK(in_flight_at_end == 0);
  CHECK(svc.cancellations() == 2);
}

TEST_CASE("a task that cancels its consumer as the stream starts it stops the stream at once",
          "[map_unordered]") {
  // The stream's first task starts while the first next() waits: the request
  // reaches that wait (tasks never start inline inside next()).
  for (bool throwing : {true, false}) {
    virtual_loop loop;
    slow_service svc({.latency = latency::fixed(1h)});
    asio::cancellation_signal cancel;
    std::string how;
    nanoseconds returned_at{-1};
    std::size_t in_flight_at_return = 99;
    auto fn = [&](int i) -> asio::awaitable<int> {
      if (i == 1) cancel.emit(asio::cancellation_type::terminal);
      co_return co_await call(svc, i);
    };
    asio::co_spawn(
        loop.get_executor(),
        [&]() -> asio::awaitable<std::string> {
          co_await asio::this_coro::throw_if_cancelled(throwing);
          auto s = sluice::map_unordered(fn, std::vector{0, 1, 2, 3}, 2);
          auto drain = [&]() -> asio::awaitable<void> {
            while (co_await s.next()) {
            }
          };
          std::string r = co_await sluice_test::ending_of(drain());
          co_await asio::this_coro::throw_if_cancelled(false);
          co_await s.close();
          co_return r;
        },
        sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr e, std::string r) {
          how = e ? sluice_test::ending_of_exception(e) : r;
          returned_at = loop.now();
          in_flight_at_return = svc.in_flight();
        }));
    loop.run_for(2h);
    CHECK(how == "aborted");
    CHECK(returned_at == 0s);
    CHECK(in_flight_at_return == 0);
    CHECK(svc.calls() == 1);  // task 1 was cancelled before its call; 2 and 3 never started
  }
}

// ---- 12. pipelines -------------------------------------------------------

TEST_CASE("two chained stages each respect their own limit and finish at the ideal time",
          "[map_unordered]") {
  virtual_loop loop;
  slow_service fetch({.latency = latency::fixed(1s)});
  slow_service store({.latency = latency::fixed(1s)});
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto pipeline =
        sluice::map_unordered([&](int i) { return call(store, i); },
                              sluice::map_unordered([&](int i) { return call(fetch, i); },
                                                    std::vector{0, 1, 2, 3, 4, 5, 6, 7}, 4),
                              2);
    co_return co_await drain(loop, pipeline);
  });
  CHECK(r.size() == 8);
  CHECK(fetch.max_in_flight() == 4);
  CHECK(store.max_in_flight() == 2);
  // store is the bottleneck: 8 items, 2 at a time, 1 s each, from 1 s on.
  CHECK(loop.now() == 5s);
  CHECK(r.front().at == 2s);
}

TEST_CASE("an lvalue stream can feed another stage", "[map_unordered]") {
  virtual_loop loop;
  flight f1, f2;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto first =
        sluice::map_unordered([&](int d) { return nap(f1, d); }, std::vector{100, 100, 100}, 3);
    auto second = sluice::map_unordered([&](int d) { return nap(f2, d); }, first, 1);
    co_return co_await drain(loop, second);
  });
  CHECK(r == std::vector<got>{{100, 200ms}, {100, 300ms}, {100, 400ms}});
}

// ---- as_completed and the rest -------------------------------------------

TEST_CASE("as_completed runs a range of tasks with a bound and yields in completion order",
          "[map_unordered]") {
  virtual_loop loop;
  flight f;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    std::vector<asio::awaitable<int>> tasks;
    for (int d : {300, 100, 200, 100}) tasks.push_back(nap(f, d));
    auto s = sluice::as_completed(std::move(tasks), 2);
    co_return co_await drain(loop, s);
  });
  // 300 and 200 both end at 300 ms; 300's timer was set first.
  CHECK(r == std::vector<got>{{100, 100ms}, {300, 300ms}, {200, 300ms}, {100, 400ms}});
  CHECK(f.max == 2);
}

TEST_CASE("as_completed with return_exceptions yields every outcome", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  std::size_t ok = 0, failed = 0;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> tasks;
    for (int d : {100, -100, 100}) tasks.push_back(nap_or_fail(f, d));
    auto s = sluice::as_completed(std::move(tasks), 3, sluice::return_exceptions);
    while (auto r = co_await s.next()) ++(*r ? ok : failed);
  });
  CHECK(ok == 2);
  CHECK(failed == 1);
}

TEST_CASE("void tasks yield std::monostate", "[map_unordered]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  std::size_t n = 0;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int) { return svc.call(); }, std::vector{1, 2, 3}, 3);
    static_assert(std::is_same_v<decltype(s), sluice::stream<std::monostate>>);
    while (co_await s.next()) ++n;
  });
  CHECK(n == 3);
  CHECK(loop.now() == 1s);
}

TEST_CASE("a moved-from stream yields nothing and a second waiting next() is refused", "[stream]") {
  virtual_loop loop;
  flight f;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, std::vector{100}, 1);
    auto t = std::move(s);
    auto r586 = co_await s.next();
    CHECK_FALSE(r586);
    auto r587 = co_await t.next();
    CHECK(r587 == 100);
    sluice::stream<int> empty;
    auto r589 = co_await empty.next();
    CHECK_FALSE(r589);
    co_await empty.close();
  });
  bool refused = false;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, std::vector{100}, 1);
    auto ex = co_await asio::this_coro::executor;
    asio::co_spawn(
        ex, [&]() -> asio::awaitable<void> { co_await s.next(); }, [](std::exception_ptr) {});
    co_await sluice::sleep(10ms);
    try {
      co_await s.next();
    } catch (const std::logic_error&) {
      refused = true;
    }
    co_await s.close();
  });
  CHECK(refused);
}

TEST_CASE("a long lazy input runs with a fixed number of workers", "[map_unordered]") {
  virtual_loop loop;
  flight f;
  std::size_t n = 0;
  recorded_input<int> in(std::vector<int>(5000, 1));
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 16);
    while (co_await s.next()) ++n;
  });
  CHECK(n == 5000);
  CHECK(f.max == 16);
  CHECK(loop.now() == milliseconds(5000 / 16 + 1));
}

namespace {
struct not_a_source {};
}  // namespace

TEST_CASE("misuse is rejected by the concepts", "[map_unordered]") {
  auto fn = [](int) -> asio::awaitable<int> {
    co_return 1;
  };
  STATIC_REQUIRE(sluice::fan_out_function<decltype(fn), std::vector<int>&>);
  STATIC_REQUIRE(sluice::fan_out_function<decltype(fn), recorded_source<int>>);
  STATIC_REQUIRE_FALSE(sluice::fan_out_function<decltype(fn), not_a_source>);
  STATIC_REQUIRE_FALSE(sluice::fan_out_function<int, std::vector<int>>);
  STATIC_REQUIRE_FALSE(sluice::fan_out_function<decltype(fn), std::vector<std::string>>);
  STATIC_REQUIRE(sluice::fan_out_input<sluice::stream<int>>);
}

TEST_CASE("map_unordered runs its tasks on a strand when the consumer runs on one",
          "[map_unordered]") {
  virtual_loop loop;
  auto strand = asio::make_strand(loop.get_executor());
  std::size_t on_strand = 0;
  int sum = 0;
  auto task = [&](int i) -> asio::awaitable<int> {
    co_await sluice::sleep(std::chrono::milliseconds(10 * (i % 3 + 1)));
    on_strand += strand.running_in_this_thread() ? 1 : 0;
    co_return i;
  };
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        std::vector<int> in{1, 2, 3, 4, 5, 6, 7, 8};
        auto s = sluice::map_unordered(task, in, 3);
        while (auto r = co_await s.next()) sum += *r;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  loop.run_for(1s);
  CHECK(sum == 36);
  CHECK(on_strand == 8);
}

TEST_CASE("a stream read on another strand than the one that started it resumes its reader there",
          "[stream]") {
  virtual_loop loop;
  auto first = asio::make_strand(loop.get_executor());
  auto second = asio::make_strand(loop.get_executor());
  auto task = [&](int i) -> asio::awaitable<int> {
    co_await sluice::sleep(std::chrono::milliseconds(10 * (i % 3 + 1)));
    co_return i;
  };
  using stream_type = decltype(sluice::map_unordered(task, std::vector<int>{}, 3));
  std::optional<stream_type> s;
  int sum = 0;
  std::size_t read_on_second = 0, reads = 0;
  auto rethrow = [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  };
  asio::co_spawn(
      first,
      [&]() -> asio::awaitable<void> {
        s.emplace(sluice::map_unordered(task, std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}, 3));
        auto r = co_await s->next();  // started here: the tasks run on `first`
        sum += *r;
      },
      rethrow);
  loop.run_for(15ms);
  asio::co_spawn(
      second,
      [&]() -> asio::awaitable<void> {
        while (auto r = co_await s->next()) {
          sum += *r;
          ++reads;
          read_on_second += second.running_in_this_thread() ? 1 : 0;
        }
        co_await s->close();
      },
      rethrow);
  loop.run_for(1s);
  CHECK(sum == 36);
  CHECK(reads == 7);
  CHECK(read_on_second == 7);
}

// ---- adversarial review: lifetimes, pipelines, cancellation ----------------

TEST_CASE("a stream destroyed mid-flight inside a coroutine winds down cleanly", "[stream]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::from(
                        [](const auto& c) -> nanoseconds { return c.index == 0 ? 1s : 2s; })});
  loop.run([&]() -> asio::awaitable<void> {
    {
      auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 4);
      auto r = co_await s.next();
      CHECK(r == 0);
      CHECK(svc.in_flight() == 3);
    }
    co_await sluice::sleep(10s);
  });
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 4);
  CHECK(svc.cancellations() == 3);
}

TEST_CASE("a moved stream keeps yielding every result from where it was", "[stream]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  auto r = loop.run([&]() -> asio::awaitable<std::vector<int>> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(6), 2);
    std::vector<int> out;
    auto first = co_await s.next();
    out.push_back(*first);
    sluice::stream<int> t(std::move(s));
    auto gone = co_await s.next();
    CHECK_FALSE(gone);
    sluice::stream<int> u;
    u = std::move(t);
    while (auto x = co_await u.next()) out.push_back(*x);
    std::sort(out.begin(), out.end());
    co_return out;
  });
  CHECK(r == iota_vec(6));
  CHECK(loop.now() == 3s);
  CHECK(svc.cancellations() == 0);
}

TEST_CASE("next() after the end keeps returning nothing", "[stream]") {
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    flight f;
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, std::vector{10, 20}, 2);
    int n = 0;
    while (co_await s.next()) ++n;
    CHECK(n == 2);
    for (int i = 0; i < 3; ++i) {
      auto r = co_await s.next();
      CHECK_FALSE(r);
    }
    co_await s.close();
    auto r = co_await s.next();
    CHECK_FALSE(r);
  });
}

TEST_CASE("a next() made before its stream is destroyed yields nothing when awaited after",
          "[stream]") {
  // next() holds the stream's state by a count, not a shared_ptr copy: the
  // state must outlive the stream for a call made and not yet awaited.
  virtual_loop loop;
  slow_service svc({.latency = latency::from(
                        [](const auto& c) -> nanoseconds { return c.index == 0 ? 1s : 2s; })});
  loop.run([&]() -> asio::awaitable<void> {
    std::optional<asio::awaitable<std::optional<int>>> started_call, fresh_call, never_awaited;
    {
      auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3);
      auto first = co_await s.next();  // at 1 s; 1 and 2 still run
      CHECK(first == 0);
      started_call.emplace(s.next());
      never_awaited.emplace(s.next());
    }  // destroyed: the tasks are cancelled, unread results dropped
    {
      auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3);
      fresh_call.emplace(s.next());
    }  // never started
    auto late = co_await std::move(*started_call);
    auto never_started = co_await std::move(*fresh_call);
    CHECK_FALSE(late);
    CHECK_FALSE(never_started);
    never_awaited.reset();  // the last call of the first stream: its state goes
    co_await sluice::sleep(5s);
  });
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 3);
  CHECK(svc.cancellations() == 2);
}

TEST_CASE("next() after a rethrown failure returns nothing and nothing runs any more", "[stream]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call_or_fail(svc, i, 1); }, iota_vec(10), 3);
    std::string how;
    std::vector<int> got_before;
    try {
      while (auto r = co_await s.next()) got_before.push_back(*r);
      how = "ok";
    } catch (const std::runtime_error& e) {
      how = e.what();
    }
    CHECK(how == "task 1 failed");
    CHECK(svc.in_flight() == 0);
    auto again = co_await s.next();
    CHECK_FALSE(again);
    const auto calls = svc.calls();
    co_await sluice::sleep(10s);
    CHECK(svc.calls() == calls);
  });
}

TEST_CASE("two task failures at the same instant: the first is rethrown once", "[stream]") {
  virtual_loop loop;
  loop.run([&]() -> asio::awaitable<void> {
    flight f;
    auto s = sluice::map_unordered([&](int d) { return nap_or_fail(f, d); },
                                   std::vector{-100, -100, 500}, 3);
    auto how = co_await sluice_test::ending_of(s.next());
    CHECK(how == "task 100 failed");
    CHECK(loop.now() == 100ms);
    CHECK(f.now == 0);
    auto again = co_await s.next();
    CHECK_FALSE(again);
  });
}

TEST_CASE("an input whose first element throws starts nothing and next() rethrows", "[stream]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({10, 20, 30});
  in.throw_at(0);
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 2);
    auto how = co_await sluice_test::ending_of(s.next());
    CHECK(how == "the input failed");
    auto again = co_await s.next();
    CHECK_FALSE(again);
  });
  CHECK(f.started == 0);
  CHECK(loop.now() == 0ms);
}

TEST_CASE("a limit larger than the input pulls each element once", "[stream]") {
  virtual_loop loop;
  flight f;
  recorded_input<int> in({30, 10, 20});
  std::vector<std::size_t> pulls;
  in.on_pull([&](std::size_t i) { pulls.push_back(i); });
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, in, 50);
    co_return co_await drain(loop, s);
  });
  CHECK(pulls == std::vector<std::size_t>{0, 1, 2});
  CHECK(r == std::vector<got>{{10, 10ms}, {20, 20ms}, {30, 30ms}});
}

TEST_CASE("limit 1 runs one by one with exactly sequential timing", "[stream]") {
  virtual_loop loop;
  flight f;
  auto r = loop.run([&]() -> asio::awaitable<std::vector<got>> {
    auto s = sluice::map_unordered([&](int d) { return nap(f, d); }, std::vector{30, 10, 20}, 1);
    co_return co_await drain(loop, s);
  });
  CHECK(r == std::vector<got>{{30, 30ms}, {10, 40ms}, {20, 60ms}});
  CHECK(f.max == 1);
}

TEST_CASE("a consumer cancelled by a timeout at the instant a task completes leaves nothing",
          "[stream]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  recorded_input<int> in(iota_vec(20));
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, in, 1);
    auto first = co_await s.next();
    CHECK(first == 0);
    // The next results arrive at 1 s, exactly when the timeout fires.
    auto x = co_await (sluice_test::ending_of(s.next()) || sluice::sleep(1s));
    (void)x;
    CHECK(svc.in_flight() == 0);
    const auto pulled = in.pulled();
    const auto calls = svc.calls();
    co_await sluice::sleep(10s);
    CHECK(in.pulled() == pulled);
    CHECK(svc.calls() == calls);
    auto after = co_await s.next();
    (void)after;
    CHECK(svc.in_flight() == 0);
  });
}

TEST_CASE("close() cancelled while tasks ignore cancellation still waits, then aborts",
          "[stream]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  int finished = 0;
  auto stubborn = [&](int d) -> asio::awaitable<int> {
    co_await asio::this_coro::reset_cancellation_state(
        [](asio::cancellation_type) { return asio::cancellation_type::none; });
    co_await sluice::sleep(milliseconds(d));
    ++finished;
    co_return d;
  };
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(stubborn, std::vector{1000, 3000, 3000}, 3);
    auto first = co_await s.next();
    CHECK(first == 1000);
    // The timeout wins; || then waits for the cancelled close() to finish.
    auto how = co_await (sluice_test::ending_of(s.close()) || sluice::sleep(500ms));
    CHECK(how.index() == 1);
    CHECK(loop.now() == 3s);
    CHECK(finished == 3);
  });
}

TEST_CASE("when the downstream stage fails the upstream stage is cancelled before next() throws",
          "[stream]") {
  virtual_loop loop;
  slow_service up({.latency = latency::from(
                       [](const auto& c) -> nanoseconds { return c.index == 0 ? 100ms : 5s; })});
  slow_service down({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(
        [&](int i) { return call_or_fail(down, i, 0); },
        sluice::map_unordered([&](int i) { return call(up, i); }, iota_vec(100), 8), 1);
    // Downstream: one at a time (limit 1): it is busy with item 0 from 100 ms
    // to 1.1 s, while the upstream runs items 1..8 (5 s each) ahead.
    auto how = co_await sluice_test::ending_of(s.next());
    CHECK(how == "task 0 failed");
    CHECK(loop.now() == 1100ms);
    CHECK(down.in_flight() == 0);
    CHECK(up.in_flight() == 0);
    const auto calls = up.calls();
    co_await sluice::sleep(10s);
    CHECK(up.calls() == calls);
    CHECK(up.in_flight() == 0);
  });
}

TEST_CASE("when the upstream stage fails the downstream rethrows it with nothing running",
          "[stream]") {
  virtual_loop loop;
  slow_service up({.latency = latency::fixed(100ms)});
  slow_service down({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(
        [&](int i) { return call(down, i); },
        sluice::map_unordered([&](int i) { return call_or_fail(up, i, 5); }, iota_vec(100), 2), 4);
    std::string how;
    try {
      while (co_await s.next()) {
      }
      how = "ok";
    } catch (const std::exception& e) {
      how = e.what();
    }
    CHECK(how == "task 5 failed");
    CHECK(down.in_flight() == 0);
    CHECK(up.in_flight() == 0);
    const auto calls = up.calls() + down.calls();
    co_await sluice::sleep(10s);
    CHECK(up.calls() + down.calls() == calls);
  });
}

TEST_CASE("a consumer of a pipeline cancelled in next() stops both stages before it throws",
          "[stream]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  slow_service up({.latency = latency::from(
                       [](const auto& c) -> nanoseconds { return c.index == 0 ? 100ms : 5s; })});
  slow_service down({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(
        [&](int i) { return call(down, i); },
        sluice::map_unordered([&](int i) { return call(up, i); }, iota_vec(100), 8), 1);
    auto x = co_await (sluice_test::ending_of(s.next()) || sluice::sleep(500ms));
    CHECK(x.index() == 1);
    CHECK(loop.now() == 500ms);
    CHECK(down.in_flight() == 0);
    CHECK(up.in_flight() == 0);
    const auto calls = up.calls();
    co_await sluice::sleep(10s);
    CHECK(up.calls() == calls);
  });
}

TEST_CASE("a pipeline consumer cancelled in a later next() stops both stages before it throws",
          "[stream]") {
  // The second next() waits in next()'s own frame (a started stream), not in
  // the one that starts the stream. When it is cancelled, the downstream is
  // busy with item 1 (not pulling) while the upstream runs items 2.. ahead:
  // only closing the upstream stops them.
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  slow_service up({.latency = latency::from(
                       [](const auto& c) -> nanoseconds { return c.index < 2 ? 100ms : 5s; })});
  slow_service down({.latency = latency::fixed(1s)});
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(
        [&](int i) { return call(down, i); },
        sluice::map_unordered([&](int i) { return call(up, i); }, iota_vec(100), 8), 1);
    auto first = co_await s.next();
    CHECK(first == 0);
    CHECK(loop.now() == 1100ms);
    CHECK(up.in_flight() > 0);
    auto x = co_await (sluice_test::ending_of(s.next()) || sluice::sleep(500ms));
    CHECK(x.index() == 1);
    CHECK(loop.now() == 1600ms);
    CHECK(down.in_flight() == 0);
    CHECK(up.in_flight() == 0);
    const auto calls = up.calls();
    co_await sluice::sleep(10s);
    CHECK(up.calls() == calls);
    auto after = co_await s.next();
    CHECK(!after);
  });
}

TEST_CASE("map_unordered on a strand survives failure, cancellation and destruction", "[stream]") {
  using namespace asio::experimental::awaitable_operators;
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string failed, cancelled;
  asio::co_spawn(
      asio::make_strand(loop.get_executor()),
      [&]() -> asio::awaitable<void> {
        {
          auto s =
              sluice::map_unordered([&](int i) { return call_or_fail(svc, i, 2); }, iota_vec(8), 3);
          std::string how;
          try {
            while (co_await s.next()) {
            }
          } catch (const std::exception& e) {
            how = e.what();
          }
          failed = how;
        }
        auto t = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(8), 3);
        auto x = co_await (sluice_test::ending_of(t.next()) || sluice::sleep(500ms));
        cancelled = x.index() == 0 ? std::get<0>(x) : std::string("timeout");
        auto u = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(8), 3);
        co_await u.next();
      },
      asio::detached);
  loop.run_for(10s);
  CHECK(failed == "task 2 failed");
  CHECK(cancelled == "timeout");
  CHECK(svc.in_flight() == 0);
}

// ---- issue 7: a caller cancelled before it calls next() / close() ----------

TEST_CASE("next() from a caller cancelled before the call with no result ready closes and waits",
          "[stream]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::from(
                        [](const auto& c) -> nanoseconds { return c.index == 0 ? 1s : 5s; })});
  std::string how;
  std::size_t in_flight_at_end = 99;
  std::optional<nanoseconds> ended_at;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3);
    auto first = co_await s.next();  // 0 at 1 s; 1, 2 and 3 run until 5 s and 6 s
    CHECK(first == 0);
    try {
      co_await sluice::sleep(10s);  // cancelled at 1.5 s
    } catch (...) {
    }
    how = co_await sluice_test::ending_of(s.next());
    ended_at = t.loop.now();
    in_flight_at_end = svc.in_flight();
  });
  t.loop.run_for(1500ms);
  CHECK(svc.in_flight() == 3);
  consumer.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(ended_at == 1500ms);
  CHECK(in_flight_at_end == 0);
  CHECK(svc.cancellations() == 3);
}

TEST_CASE("next() from a caller cancelled before the first call starts nothing", "[stream]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::fixed(1s)});
  std::string how;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3);
    try {
      co_await sluice::sleep(10s);
    } catch (...) {
    }
    how = co_await sluice_test::ending_of(s.next());
  });
  t.poll();
  consumer.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(how == "aborted");
  CHECK(svc.calls() == 0);
}

TEST_CASE("close() from a caller cancelled before the call joins and closes the upstream",
          "[stream]") {
  sluice_test::tasks_on_loop t;
  slow_service up({.latency = latency::from(
                       [](const auto& c) -> nanoseconds { return c.index == 0 ? 100ms : 5s; })});
  slow_service down({.latency = latency::fixed(1s)});
  std::string how;
  std::size_t up_at_end = 99, down_at_end = 99;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    co_await asio::this_coro::throw_if_cancelled(false);
    auto s = sluice::map_unordered(
        [&](int i) { return call(down, i); },
        sluice::map_unordered([&](int i) { return call(up, i); }, iota_vec(100), 8), 2);
    auto first = co_await s.next();  // at 1.1 s
    CHECK(first == 0);
    try {
      co_await sluice::sleep(10s);  // a timeout fires while the consumer works: 1.5 s
    } catch (...) {
    }
    how = co_await sluice_test::ending_of(s.close());
    up_at_end = up.in_flight();
    down_at_end = down.in_flight();
  });
  t.loop.run_for(1500ms);
  CHECK(up.in_flight() > 0);
  consumer.cancel();
  t.poll();
  CHECK(consumer.done);
  CHECK(how == "ok");  // the cancellation came before: the close itself is complete
  CHECK(up_at_end == 0);
  CHECK(down_at_end == 0);
  CHECK(t.loop.now() == 1500ms);
}

TEST_CASE("close() refused by Asio for a cancelled caller still stops the tasks at once",
          "[stream]") {
  sluice_test::tasks_on_loop t;
  slow_service svc({.latency = latency::from(
                        [](const auto& c) -> nanoseconds { return c.index == 0 ? 1s : 5s; })});
  std::optional<sluice::stream<int>> s;
  bool refused = false;
  auto& consumer = t.spawn([&]() -> asio::awaitable<void> {
    s.emplace(sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(20), 3));
    co_await s->next();
    try {
      co_await sluice::sleep(10s);  // cancelled at 1.5 s
    } catch (...) {
    }
    try {
      co_await s->close();  // throw_if_cancelled is on: Asio throws before close() can wait
    } catch (const sluice::system_error&) {
      refused = true;
    }
  });
  t.loop.run_for(1500ms);
  CHECK(svc.in_flight() == 3);
  consumer.cancel();
  t.poll();
  CHECK(refused);
  CHECK(svc.in_flight() == 0);  // cancelled when close() was called, though not awaited
  CHECK(svc.cancellations() == 3);
  t.loop.run([&]() -> asio::awaitable<void> { co_await s->close(); });
}

TEST_CASE("a stream destroyed with tasks running says so on stderr, once", "[stream]") {
  virtual_loop loop;
  slow_service svc({.latency = latency::fixed(1s)});
  slow_service slow({.latency = latency::from(
                         [](const auto& c) -> nanoseconds { return c.index == 0 ? 1s : 5s; })});
  std::string running, drained, closed;
  loop.run([&]() -> asio::awaitable<void> {
    {
      auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(3), 2);
      while (co_await s.next()) {
      }
      sluice_test::stderr_capture cap;
      { auto gone = std::move(s); }
      drained = cap.text();
    }
    {
      auto s = sluice::map_unordered([&](int i) { return call(svc, i); }, iota_vec(9), 3);
      co_await s.next();
      co_await s.close();
      sluice_test::stderr_capture cap;
      { auto gone = std::move(s); }
      closed = cap.text();
    }
    auto s = sluice::map_unordered([&](int i) { return call(slow, i); }, iota_vec(9), 3);
    co_await s.next();  // 1 and 2 still run
    sluice_test::stderr_capture cap;
    { auto gone = std::move(s); }
    running = cap.text();
  });
  CHECK(drained.empty());
  CHECK(closed.empty());
#if SLUICE_STREAM_CHECKS
  CHECK(std::count(running.begin(), running.end(), '\n') == 1);
  CHECK(running.find("sluice::for_each") != std::string::npos);
  CHECK(running.find("co_await s.close()") != std::string::npos);
#else
  CHECK(running.empty());
#endif
}

TEST_CASE("an lvalue input range is copied from, never emptied", "[map_unordered]") {
  virtual_loop loop;
  std::vector<std::string> keys{"alpha", "beta", "gamma"};
  std::vector<std::string> seen;
  loop.run([&]() -> asio::awaitable<void> {
    auto s = sluice::map_unordered(
        [](std::string k) -> asio::awaitable<std::string> { co_return k + "!"; }, keys, 2);
    while (auto r = co_await s.next()) seen.push_back(*r);
  }());
  std::sort(seen.begin(), seen.end());
  CHECK(seen == std::vector<std::string>{"alpha!", "beta!", "gamma!"});
  CHECK(keys == std::vector<std::string>{"alpha", "beta", "gamma"});
}

TEST_CASE("an rvalue input range is moved from (its elements are the stream's)",
          "[map_unordered]") {
  virtual_loop loop;
  std::vector<std::string> seen;
  loop.run([&]() -> asio::awaitable<void> {
    auto s =
        sluice::map_unordered([](std::string k) -> asio::awaitable<std::string> { co_return k; },
                              std::vector<std::string>{"a", "b"}, 1);
    while (auto r = co_await s.next()) seen.push_back(*r);
  }());
  CHECK(seen == std::vector<std::string>{"a", "b"});
}
