// SPDX-License-Identifier: BSL-1.0
// Gather's children (one worker per task when unbounded, chaining through
// tasks that complete at once) and the child set's own cancellation slots:
// fail fast, caller cancellation, re-entrancy and lifetimes.
#include <sluice/detail/child_set.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lazy_tasks.hpp>
#include <support/lifetime.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
namespace latency = sluice::testing::latency;
using std::chrono::nanoseconds;

namespace {

asio::awaitable<int> immediate(int v) {
  co_return v;
}

asio::awaitable<int> after(nanoseconds d, int v) {
  co_await sluice::sleep(d);
  co_return v;
}

asio::awaitable<int> fail_after(nanoseconds d, std::string what) {
  co_await sluice::sleep(d);
  throw std::runtime_error(what);
}

asio::awaitable<int> call_returning(slow_service& svc, int v) {
  co_await svc.call();
  co_return v;
}

// An operation that waits until it is cancelled. Its cancellation handler
// counts the request at once; `inline_completion` completes the operation
// inside the emit itself (a resumption nested in the canceller), otherwise
// the completion is posted.
template <class Token>
auto async_until_cancelled(int& seen, bool inline_completion, Token&& token) {
  return asio::async_initiate<Token, void(sluice::error_code)>(
      [&seen, inline_completion](auto handler) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        auto h = std::make_shared<decltype(handler)>(std::move(handler));
        auto ex = asio::get_associated_executor(*h);
        slot.assign([&seen, inline_completion, h, ex](asio::cancellation_type) mutable {
          ++seen;
          auto mine = std::move(h);  // this handler is destroyed when the waiter resumes
          if (inline_completion) {
            (*mine)(sluice::error_code(asio::error::operation_aborted));
          } else {
            asio::post(ex, [mine] { (*mine)(sluice::error_code(asio::error::operation_aborted)); });
          }
        });
      },
      token);
}

asio::awaitable<int> until_cancelled(int& seen, bool inline_completion, int v) {
  sluice::error_code ec;
  co_await async_until_cancelled(seen, inline_completion,
                                 asio::redirect_error(asio::use_awaitable, ec));
  co_return v;
}

// A value whose move assignment throws for a negative value (its move
// constructor does not).
struct assign_throws {
  static constexpr const char* what = "cannot assign";
  int v = 0;
  assign_throws() = default;
  explicit assign_throws(int x) : v(x) {}
  assign_throws(assign_throws&&) noexcept = default;
  assign_throws& operator=(assign_throws&& o) {
    if (o.v < 0) throw std::runtime_error("cannot assign");
    v = o.v;
    return *this;
  }
};

// A value whose move constructor throws on the second move after its task
// returned it (armed by a local's destructor, after co_return stored it).
int moves_until_throw = -1;

struct move_throws {
  static constexpr const char* what = "cannot move";
  int v = 0;
  move_throws() = default;
  explicit move_throws(int x) : v(x) {}
  move_throws(move_throws&& o) : v(o.v) {
    if (v < 0 && moves_until_throw >= 0 && moves_until_throw-- == 0)
      throw std::runtime_error("cannot move");
  }
  move_throws& operator=(move_throws&&) = default;
};

// Returns T(v) after a service call.
template <class T>
asio::awaitable<T> value_after(slow_service& svc, int v) {
  struct arm {
    ~arm() { moves_until_throw = 1; }
  };
  co_await svc.call();
  arm a;
  co_return T(v);
}

}  // namespace

TEST_CASE(
    "a task's failure cancels every sibling, also after a worker ran on through immediate "
    "tasks",
    "[gather]") {
  // Children: 0 is a worker that runs tasks 0, 1 and 2; then one worker per
  // task, so child and task indices differ. Task 4 fails at 1 s: every
  // sibling must be cancelled at 1 s, child 4 (task 6) too. The others
  // swallow their cancellation, so no further failure cancels anyone again.
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  auto swallows = [&svc](int v) -> asio::awaitable<int> {
    try {
      co_await svc.call();
    } catch (const sluice::system_error&) {
    }
    co_return v;
  };
  std::string how;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> v;
    v.push_back(immediate(0));
    v.push_back(immediate(1));
    v.push_back(swallows(2));
    v.push_back(swallows(3));
    v.push_back(fail_after(1s, "task 4 failed"));
    v.push_back(swallows(5));
    v.push_back(call_returning(svc, 6));
    v.push_back(swallows(7));
    how = co_await sluice_test::ending_of(sluice::gather(std::move(v)));
  });
  CHECK(how == "task 4 failed");
  CHECK(svc.max_in_flight() == 5);
  CHECK(svc.cancellations() == 5);
  CHECK(svc.in_flight() == 0);
  CHECK(loop.now() == 1s);
}

TEMPLATE_TEST_CASE("a result that throws when it is moved or assigned fails the gather fast",
                   "[gather]", assign_throws, move_throws) {
  // Task 1's value throws on its way into the result: that is task 1's
  // failure, rethrown after the siblings were cancelled; nothing escapes the
  // loop.
  slow_service svc({.latency = latency::sequence({10s, 1s, 10s, 10s, 10s})});
  virtual_loop loop;
  std::string how;
  std::string escaped = "nothing";
  try {
    loop.run([&]() -> asio::awaitable<void> {
      std::vector<asio::awaitable<TestType>> v;
      v.push_back(value_after<TestType>(svc, 0));
      v.push_back(value_after<TestType>(svc, -1));
      for (int i = 2; i < 5; ++i) v.push_back(value_after<TestType>(svc, i));
      how = co_await sluice_test::ending_of(sluice::gather(std::move(v)));
    });
  } catch (const std::exception& e) {
    escaped = e.what();
  }
  moves_until_throw = -1;
  CHECK(escaped == "nothing");
  CHECK(how == TestType::what);
  CHECK(svc.cancellations() == 4);
  CHECK(loop.now() == 1s);
}

TEST_CASE(
    "a caller cancelled by one of its own tasks while gather starts them still waits for every "
    "task",
    "[gather]") {
  // Task 2 cancels the caller while gather is still starting tasks (inline):
  // gather must cancel the tasks it started and wait for them, not return
  // with them running (they refer to the call's state), nor start more.
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  asio::cancellation_signal cancel;
  std::string how;
  std::size_t in_flight_at_return = 99;
  auto cancels_its_caller = [&]() -> asio::awaitable<int> {
    cancel.emit(asio::cancellation_type::terminal);
    co_await svc.call();
    co_return 2;
  };
  std::vector<asio::awaitable<int>> v;
  v.push_back(after(10ms, 0));  // the worker: ends first and lets go of the state
  v.push_back(call_returning(svc, 1));
  v.push_back(cancels_its_caller());
  v.push_back(call_returning(svc, 3));
  asio::co_spawn(loop.get_executor(), sluice_test::ending_of(sluice::gather(std::move(v))),
                 sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr, std::string s) {
                   how = s;
                   in_flight_at_return = svc.in_flight();
                 }));
  loop.run_for(10s);
  CHECK(how == "aborted");
  CHECK(in_flight_at_return == 0);
  CHECK(svc.in_flight() == 0);
  CHECK(svc.calls() == 2);  // tasks 1 and 2; task 3 was never started
}

TEST_CASE("a caller cancelled from outside the loop reaches every running task at once",
          "[gather]") {
  // On the loop's executor and on a strand:
  // the emit takes effect synchronously on both Asio versions (co_spawn's
  // cancellation handler for a child must not dispatch to an executor).
  for (bool on_strand : {false, true}) {
    virtual_loop loop;
    asio::cancellation_signal cancel;
    int seen = 0;
    std::string how;
    std::vector<asio::awaitable<int>> v;
    for (int i = 0; i < 50; ++i) v.push_back(until_cancelled(seen, false, i));
    auto done =
        sluice_test::bind_slot(cancel.slot(), [&](std::exception_ptr, std::string s) { how = s; });
    auto call = sluice_test::ending_of(sluice::gather(std::move(v)));
    if (on_strand) {
      asio::co_spawn(asio::make_strand(loop.get_executor()), std::move(call), std::move(done));
    } else {
      asio::co_spawn(loop.get_executor(), std::move(call), std::move(done));
    }
    loop.poll();
    REQUIRE(seen == 0);
    cancel.emit(asio::cancellation_type::terminal);
    CHECK(seen == 50);
    loop.poll();
    CHECK(how == "aborted");
  }
}

TEST_CASE("a child set's cancel() reaches a running child at once, from outside the loop",
          "[gather]") {
  virtual_loop loop;
  auto set = std::make_shared<sluice::detail::child_set>();
  int seen = 0;
  int value = 0;
  auto child = [&]() -> asio::awaitable<void> {
    value = co_await until_cancelled(seen, false, 7);
  };
  set->spawn(asio::any_io_executor(loop.get_executor()), child());
  loop.poll();
  REQUIRE(set->running(0));
  set->cancel(0);
  CHECK(seen == 1);
  loop.poll();
  CHECK_FALSE(set->running(0));
  CHECK(set->running() == 0);
  CHECK(value == 7);
  set->cancel(0);  // a finished child: nothing happens
  CHECK(seen == 1);
}

TEST_CASE("tasks that complete inside the cancellation of a failure are all counted and stored",
          "[gather]") {
  // Each sibling's operation completes inside the emit (nested resumption):
  // the child finishes and its slot is cleared while its handler runs.
  for (bool settle : {false, true}) {
    virtual_loop loop;
    int seen = 0;
    std::string how;
    std::vector<asio::awaitable<int>> v;
    v.push_back(after(1s, 0));  // the worker
    for (int i = 1; i < 20; ++i) v.push_back(until_cancelled(seen, true, i));
    v.push_back(fail_after(2s, "failed"));
    for (int i = 21; i < 40; ++i) v.push_back(until_cancelled(seen, true, i));
    if (settle) {
      // Settling cancels nothing on failure: the caller's cancellation does.
      asio::cancellation_signal cancel;
      asio::co_spawn(
          loop.get_executor(),
          sluice_test::ending_of(sluice::gather(std::move(v), sluice::return_exceptions)),
          sluice_test::bind_slot(cancel.slot(),
                                 [&](std::exception_ptr, std::string s) { how = s; }));
      loop.run_for(3s);
      REQUIRE(how.empty());
      asio::co_spawn(
          loop.get_executor(),
          [&]() -> asio::awaitable<void> {
            cancel.emit(asio::cancellation_type::terminal);
            co_return;
          },
          asio::detached);
      loop.run_for(1s);
      CHECK(how == "aborted");
    } else {
      how = loop.run(sluice_test::ending_of(sluice::gather(std::move(v))));
      CHECK(how == "failed");
      CHECK(loop.now() == 2s);
    }
    CHECK(seen == 38);
  }
}

TEST_CASE("thousands of tasks are all cancelled by one failure", "[gather]") {
  slow_service svc({.latency = latency::fixed(10s)});
  virtual_loop loop;
  std::string how;
  loop.run([&]() -> asio::awaitable<void> {
    std::vector<asio::awaitable<int>> v;
    for (int i = 0; i < 3000; ++i) v.push_back(i % 5 == 0 ? immediate(i) : call_returning(svc, i));
    v.push_back(fail_after(1s, "failed"));
    for (int i = 0; i < 3000; ++i) v.push_back(i % 5 == 0 ? immediate(i) : call_returning(svc, i));
    how = co_await sluice_test::ending_of(sluice::gather(std::move(v)));
  });
  CHECK(how == "failed");
  CHECK(svc.cancellations() == 4800);
  CHECK(svc.in_flight() == 0);
  CHECK(loop.now() == 1s);
}

TEST_CASE("a lazy input that throws midway through a mix of tasks cancels them and rethrows",
          "[gather]") {
  // Settling lets the running tasks finish instead, then rethrows.
  for (bool settle : {false, true}) {
    slow_service svc({.latency = latency::fixed(10s)});
    virtual_loop loop;
    sluice_test::lazy_tasks<asio::awaitable<int>> input(100, [&](std::size_t i) {
      return i % 3 == 0 ? immediate(static_cast<int>(i)) : call_returning(svc, static_cast<int>(i));
    });
    input.throw_at(40);
    std::string how;
    loop.run([&]() -> asio::awaitable<void> {
      if (settle) {
        how = co_await sluice_test::ending_of(sluice::gather(input, sluice::return_exceptions));
      } else {
        how = co_await sluice_test::ending_of(sluice::gather(input));
      }
    });
    CHECK(how == sluice_test::input_broken().what());
    CHECK(svc.calls() == 26);  // i < 40 with i % 3 != 0
    CHECK(svc.cancellations() == (settle ? 0 : 26));
    CHECK(loop.now() == (settle ? 10s : 0s));
  }
}

TEST_CASE("a task that fails at once stops unbounded gather from starting any later task",
          "[gather]") {
  // Fail fast: the first exception stops the pulling. Task 2 throws before
  // it suspends, while gather is still starting tasks: tasks 3.. must not
  // be pulled or started (a child's completion is posted: the failure must
  // be seen by the worker that runs it, at once).
  slow_service svc({.latency = latency::fixed(1s)});
  virtual_loop loop;
  auto throws_at_once = []() -> asio::awaitable<int> {
    throw std::runtime_error("failed at once");
    co_return 0;
  };
  sluice_test::lazy_tasks<asio::awaitable<int>> input(100, [&](std::size_t i) {
    return i == 2 ? throws_at_once() : call_returning(svc, static_cast<int>(i));
  });
  std::string how;
  loop.run([&]() -> asio::awaitable<void> {
    how = co_await sluice_test::ending_of(sluice::gather(input));
  });
  CHECK(how == "failed at once");
  CHECK(input.pulled() == 3);
  CHECK(svc.calls() == 2);
  CHECK(loop.now() == 0s);
}

TEST_CASE("an io_context destroyed while gather waits on its tasks frees everything", "[gather]") {
  // ASan: nothing used after free; LSan: nothing leaked. The parent's frame
  // and its child set own each other until the join completes: the loop's
  // shutdown (detail::loop_service) breaks that cycle.
  for (int kind = 0; kind < 3; ++kind) {
    asio::io_context ctx;
    auto timer_task = [](int v) -> asio::awaitable<int> {
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::hours(1));
      co_await t.async_wait(asio::use_awaitable);
      co_return v;
    };
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          std::vector<asio::awaitable<int>> v;
          v.push_back(immediate(0));
          for (int i = 1; i < 10; ++i) v.push_back(timer_task(i));
          v.push_back(immediate(10));
          v.push_back(timer_task(11));
          if (kind == 0) co_await sluice::gather(std::move(v));
          if (kind == 1) co_await sluice::gather(std::move(v), sluice::return_exceptions);
          if (kind == 2) co_await sluice::gather(timer_task(1), immediate(2), timer_task(3));
        },
        asio::detached);
    ctx.poll();
    CHECK_FALSE(ctx.stopped());
  }
}

TEST_CASE("an io_context destroyed while gather or a stream waits frees the waiting frames",
          "[gather][lifetime]") {
  // Counted, not only seen by LeakSanitizer: before the loop_service, the
  // parent's frame (and the child set or stream state it owns) outlived the
  // loop in a cycle.
  using sluice_test::lifetime_counter;
  const int before = lifetime_counter::live();
  for (int kind = 0; kind < 2; ++kind) {
    {
      sluice::testing::virtual_loop loop;
      asio::co_spawn(
          loop.get_executor(),
          [kind]() -> asio::awaitable<void> {
            lifetime_counter in_parent;
            auto child = []() -> asio::awaitable<int> {
              co_await sluice::sleep(std::chrono::hours(1));
              co_return 1;
            };
            if (kind == 0) {
              co_await sluice::gather(child(), child());
            } else {
              auto s =
                  sluice::map_unordered([&](int) { return child(); }, std::vector<int>{1, 2, 3}, 2);
              while (auto r = co_await s.next()) {
              }
            }
          },
          asio::detached);
      loop.run_for(std::chrono::seconds(1));
      CHECK(lifetime_counter::live() == before + 1);
    }
    CHECK(lifetime_counter::live() == before);
  }
}

TEST_CASE("a child slot keeps a big handler on the heap and replaces it cleanly", "[gather]") {
  struct big {
    std::shared_ptr<int> calls;
    char pad[64] = {};
    void operator()(asio::cancellation_type) { ++*calls; }
  };
  auto calls = std::make_shared<int>(0);
  {
    sluice::detail::child_slot_storage storage;
    sluice::detail::child_slot slot(&storage);
    CHECK_FALSE(slot.has_handler());
    slot.emplace<big>(big{calls});
    CHECK(slot.has_handler());
    storage.emit(asio::cancellation_type::terminal);
    CHECK(*calls == 1);
    slot.assign([calls](asio::cancellation_type) { *calls += 10; });
    storage.emit(asio::cancellation_type::terminal);
    CHECK(*calls == 11);
    slot.emplace<big>(big{calls});
    CHECK(calls.use_count() == 2);
  }
  CHECK(calls.use_count() == 1);
}
