// SPDX-License-Identifier: BSL-1.0
// The debug loop-affinity check (SLUICE_AFFINITY_CHECKS) of every loop-affine
// primitive: it aborts on real misuse (two threads inside a primitive at once,
// an io_context run by several threads without a strand, use from a thread
// that is not running the loop while the loop runs elsewhere), for primitives
// built with and without an executor, and stays quiet on serialized use (a
// strand over a multi-threaded io_context, reading after the loop's threads
// were joined). The thread tests also run under ThreadSanitizer (build/tsan):
// the check itself must be race-free.
#include <sluice/condition.hpp>
#include <sluice/event.hpp>
#include <sluice/lock.hpp>
#include <sluice/queue.hpp>
#include <sluice/semaphore.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/death.hpp>

#include <cstddef>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

// How a test builds its primitives: without an executor, with the strand the
// coroutines run on, or with the plain io_context executor (the strand is
// then learned from the first awaiting coroutine).
enum class built_with { nothing, strand, io_context };

using io_strand = asio::strand<asio::io_context::executor_type>;

template <class P, class... Args>
std::unique_ptr<P> make(built_with how, asio::io_context& ctx, const io_strand& strand,
                        Args... args) {
  switch (how) {
    case built_with::strand:
      return std::make_unique<P>(strand, args...);
    case built_with::io_context:
      return std::make_unique<P>(ctx.get_executor(), args...);
    default:
      return std::make_unique<P>(args...);
  }
}

// Every loop-affine primitive, shared by all the workers of a test.
struct shared_primitives {
  shared_primitives(built_with how, asio::io_context& ctx, const io_strand& strand)
      : sem(make<sluice::semaphore>(how, ctx, strand, std::size_t{2})),
        lk(make<sluice::lock>(how, ctx, strand)),
        ev(make<sluice::event>(how, ctx, strand)),
        cv(make<sluice::condition>(how, ctx, strand)),
        q(make<sluice::queue<int>>(how, ctx, strand, std::size_t{2})) {}
  std::unique_ptr<sluice::semaphore> sem;
  std::unique_ptr<sluice::lock> lk;
  std::unique_ptr<sluice::event> ev;
  std::unique_ptr<sluice::condition> cv;
  std::unique_ptr<sluice::queue<int>> q;
  // Guarded by the strand, as the primitives are.
  int holders = 0, max_holders = 0, in_lock = 0, max_in_lock = 0, finished = 0;
};

// Yields to the loop through the coroutine's executor (a strand here): the
// coroutine may resume on another of the io_context's threads.
asio::awaitable<void> hop() {
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
}

asio::awaitable<void> worker(shared_primitives& s, int i, int n) {
  {
    auto permit = co_await s.sem->scoped_acquire();
    if (++s.holders > s.max_holders) s.max_holders = s.holders;
    co_await hop();
    --s.holders;
  }
  {
    auto guard = co_await s.lk->scoped_acquire();
    if (++s.in_lock > s.max_in_lock) s.max_in_lock = s.in_lock;
    co_await hop();
    --s.in_lock;
  }
  co_await s.q->put(i);  // bounded: may wait for a getter
  (void)co_await s.q->get();
  s.q->task_done();
  {
    auto guard = co_await s.cv->scoped_acquire();
    if (++s.finished == n) s.cv->notify_all();
  }
}

asio::awaitable<void> watcher(shared_primitives& s, int n) {
  {
    auto guard = co_await s.cv->scoped_acquire();
    co_await s.cv->wait([&] { return s.finished == n; });
  }
  co_await s.q->join();
  s.ev->set();
}

}  // namespace

TEST_CASE("primitives shared on one strand by four threads of an io_context run unflagged",
          "[affinity]") {
  const built_with how = GENERATE(built_with::nothing, built_with::strand, built_with::io_context);
  constexpr int n = 64;
  asio::io_context ctx{4};
  auto strand = asio::make_strand(ctx);
  shared_primitives s(how, ctx, strand);
  bool woke = false;
  std::exception_ptr failure;
  auto record = [&](std::exception_ptr e) {
    if (e) failure = e;
  };
  asio::co_spawn(strand, watcher(s, n), record);
  asio::co_spawn(
      strand,
      [&]() -> asio::awaitable<void> {
        co_await s.ev->wait();
        woke = true;
      },
      record);
  for (int i = 0; i < n; ++i) asio::co_spawn(strand, worker(s, i, n), record);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { ctx.run(); });
  for (auto& t : threads) t.join();

  // The loop's threads are joined: the main thread may use everything now.
  if (failure) std::rethrow_exception(failure);
  CHECK(woke);
  CHECK(s.finished == n);
  CHECK(s.max_holders == 2);
  CHECK(s.max_in_lock == 1);
  CHECK(s.sem->value() == 2);
  CHECK(s.sem->try_acquire());
  s.sem->release();
  CHECK(s.lk->try_acquire());
  s.lk->release();
  CHECK(s.q->try_get() == std::nullopt);
  CHECK(s.q->try_put(7));
  CHECK(s.q->try_get() == std::optional<int>(7));
  s.q->task_done();
  CHECK(s.q->unfinished_tasks() == 0);
  CHECK(s.ev->is_set());
  s.ev->clear();
  s.ev->set();
}

TEST_CASE("the main thread may read a primitive after the loop's thread was joined", "[affinity]") {
  const built_with how = GENERATE(built_with::nothing, built_with::io_context);
  asio::io_context ctx;
  auto strand = asio::make_strand(ctx);  // unused by the coroutine: it runs on ctx
  auto q = make<sluice::queue<int>>(how, ctx, strand, std::size_t{0});
  auto sem = make<sluice::semaphore>(how, ctx, strand, std::size_t{1});
  int got = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        auto permit = co_await sem->scoped_acquire();
        co_await q->put(1);
        co_await q->put(2);
        got = co_await q->get();
      },
      asio::detached);
  std::thread loop_thread([&] { ctx.run(); });
  loop_thread.join();
  CHECK(got == 1);
  CHECK(q->try_get() == std::optional<int>(2));
  CHECK(sem->try_acquire());
  sem->release();
}

TEST_CASE("a primitive serves a loop per worker thread, one after another",
          "[affinity][lifetime]") {
  // Each thread owns a loop and destroys it; the primitive outlives them all.
  // The check must forget a dead loop (ASan: it read the dead io_context).
  sluice::semaphore sem{1};  // no executor: it is given no loop of its own
  int held = 0;
  for (int round = 0; round < 3; ++round) {
    std::thread worker([&] {
      asio::io_context ctx;
      asio::co_spawn(
          asio::make_strand(ctx),  // learned by the check, dropped with the loop
          [&]() -> asio::awaitable<void> {
            auto permit = co_await sem.scoped_acquire();
            ++held;
          },
          asio::detached);
      ctx.run();
    });
    worker.join();
  }
  CHECK(held == 3);
  CHECK(sem.try_acquire());
  sem.release();
}

#if SLUICE_AFFINITY_CHECKS
TEST_CASE("the check's rules, one by one", "[affinity]") {
  using sluice::detail::affinity;
  asio::io_context ctx;
  affinity a;
  CHECK(a.violation() == nullptr);  // no loop known: nothing is checked
  a.bind(ctx.get_executor());
  CHECK(a.violation() == nullptr);  // set-up, before the loop used it

  // Rule 3: from a thread that does not run the loop while it runs elsewhere.
  {
    auto guard = asio::make_work_guard(ctx);
    std::promise<void> recorded;
    asio::post(ctx, [&] {
      CHECK(a.violation() == nullptr);  // the loop's thread
      recorded.set_value();
    });
    std::thread loop_thread([&] { ctx.run(); });
    recorded.get_future().wait();
    CHECK(a.violation() == affinity::elsewhere_message);
    guard.reset();
    loop_thread.join();
  }
  CHECK(ctx.stopped());
  CHECK(a.violation() == nullptr);  // the loop is stopped: its thread was joined

  // Rule 2: two threads that run the loop, outside a strand. (Here they run
  // it one after the other, which cannot be told from at once.)
  ctx.restart();
  asio::post(ctx, [&] { CHECK(a.violation() == affinity::switch_message); });
  std::thread second([&] { ctx.run(); });
  second.join();

  // Inside a known strand, any thread is fine.
  affinity b;
  auto strand = asio::make_strand(ctx);
  b.bind(strand);
  ctx.restart();
  for (int i = 0; i < 2; ++i) {
    asio::post(strand, [&] { CHECK(b.violation() == nullptr); });
    std::thread t([&] { ctx.run(); });
    t.join();
    ctx.restart();
  }
}

#if SLUICE_TEST_CAN_FORK
namespace {

// Runs `use` (returns an awaitable) on a thread that runs `ctx`, then calls
// `misuse` from this thread while that thread still runs the loop.
template <class Use, class Misuse>
void misuse_while_the_loop_runs(asio::io_context& ctx, Use use, Misuse misuse) {
  auto guard = asio::make_work_guard(ctx);
  std::promise<void> used;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        co_await use();
        used.set_value();
      },
      asio::detached);
  std::thread loop_thread([&] { ctx.run(); });
  used.get_future().wait();
  misuse();
  guard.reset();
  loop_thread.join();
}

bool names(const sluice_test::death_result& r, const std::string& what) {
  return r.stderr_text.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("four threads running one io_context without a strand abort on a shared semaphore",
          "[affinity]") {
  const built_with how = GENERATE(built_with::nothing, built_with::io_context);
  auto r = sluice_test::run_in_child([how] {
    asio::io_context ctx{4};
    auto strand = asio::make_strand(ctx);  // not used by the coroutines
    auto sem = make<sluice::semaphore>(how, ctx, strand, std::size_t{2});
    for (int i = 0; i < 16; ++i) {
      asio::co_spawn(
          ctx,
          [&]() -> asio::awaitable<void> {
            for (;;) {
              auto permit = co_await sem->scoped_acquire();
              co_await hop();
            }
          },
          asio::detached);
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) threads.emplace_back([&] { ctx.run(); });
    for (auto& t : threads) t.join();
  });
  CHECK(r.aborted);
  CHECK(names(r, "sluice::semaphore"));
  CHECK(names(r, "outside a strand"));
}

TEST_CASE("a primitive used from another thread while its loop runs aborts naming it",
          "[affinity]") {
  const built_with how = GENERATE(built_with::nothing, built_with::io_context);
  const std::string what = GENERATE(as<std::string>{}, "sluice::semaphore", "sluice::lock",
                                    "sluice::event", "sluice::condition", "sluice::queue");
  auto r = sluice_test::run_in_child([how, what] {
    asio::io_context ctx;
    auto strand = asio::make_strand(ctx);
    shared_primitives s(how, ctx, strand);
    auto use = [&]() -> asio::awaitable<void> {
      if (what == "sluice::semaphore") {
        co_await s.sem->acquire();
        s.sem->release();
      } else if (what == "sluice::lock") {
        co_await s.lk->acquire();
        s.lk->release();
      } else if (what == "sluice::event") {
        s.ev->set();
        co_await s.ev->wait();
      } else if (what == "sluice::condition") {
        auto guard = co_await s.cv->scoped_acquire();
        s.cv->notify();
      } else {
        co_await s.q->put(1);
        (void)co_await s.q->get();
      }
    };
    auto misuse = [&] {
      if (what == "sluice::semaphore") s.sem->release();
      if (what == "sluice::lock") (void)s.lk->try_acquire();
      if (what == "sluice::event") s.ev->clear();
      if (what == "sluice::condition") s.cv->notify();  // checked before "lock not held"
      if (what == "sluice::queue") (void)s.q->try_put(2);
    };
    misuse_while_the_loop_runs(ctx, use, misuse);
  });
  CHECK(r.aborted);
  CHECK(names(r, what));
  CHECK(names(r, "not running its loop"));
}

TEST_CASE("two threads inside one primitive at once abort naming it", "[affinity]") {
  auto r = sluice_test::run_in_child([] {
    sluice::detail::affinity a;  // no loop: only the overlap rule applies
    std::promise<void> entered;
    std::promise<void> never;
    std::thread holder([&] {
      const auto in = a.enter("sluice::semaphore");
      entered.set_value();
      never.get_future().wait();  // stays inside until the process dies
    });
    entered.get_future().wait();
    const auto in = a.enter("sluice::semaphore");
    holder.detach();
  });
  CHECK(r.aborted);
  CHECK(names(r, "sluice::semaphore entered by two threads at once"));
}
#endif  // SLUICE_TEST_CAN_FORK
#endif  // SLUICE_AFFINITY_CHECKS
