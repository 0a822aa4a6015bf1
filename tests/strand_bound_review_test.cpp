// SPDX-License-Identifier: BSL-1.0
// An adversarial review of strand_bound.hpp (DESIGN.md "Limits shared by every
// session of a multi-threaded server"): loops that die while a call is on
// another loop's strand, cancellation before the call for every member,
// permits dropped on foreign threads. Counts and orders, never wall time.
#include <sluice/keyed_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/single_flight.hpp>
#include <sluice/strand_bound.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lifetime.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using sluice_test::lifetime_counter;

namespace {

using shared_sem = sluice::strand_bound<sluice::semaphore>;
using keyed_t = sluice::strand_bound<sluice::keyed_semaphore<int>>;

// Waits for a permit of `sem` in a counted frame, in one of the members' shapes.
asio::awaitable<void> wait_counted(shared_sem& sem, int kind, std::atomic<int>& resumed) {
  lifetime_counter in_frame;
  if (kind == 0) {
    co_await sem.acquire();
    sem.release();
  } else {
    auto p = co_await sem.scoped_acquire();
  }
  ++resumed;
}

asio::awaitable<void> wait_key_counted(keyed_t& keyed, std::atomic<int>& resumed) {
  lifetime_counter in_frame;
  auto p = co_await keyed.scoped_acquire(1);
  ++resumed;
}

// Runs what is ready, also after an earlier poll() ran out of work (which
// stops the context).
void drain(asio::io_context& ctx) {
  ctx.restart();
  ctx.poll();
}

}  // namespace

TEST_CASE("review: a caller's loop destroyed while its call waits on another loop's strand",
          "[strand_bound][review]") {
  // The caller's frame goes with its loop (as for to_thread and
  // shared_semaphore); the grant that comes later is posted into nothing and
  // is handed on, so no permit is lost.
  const int kind = GENERATE(0, 1);
  const int before = lifetime_counter::live();
  std::atomic<int> resumed{0};
  asio::io_context limit_ctx;
  shared_sem sem{asio::make_strand(limit_ctx), 0};
  keyed_t keyed{asio::make_strand(limit_ctx), 1};
  auto busy = keyed.underlying().try_acquire(1);  // set-up, before the loop runs
  REQUIRE(busy);
  {
    asio::io_context caller_ctx;
    asio::co_spawn(caller_ctx, wait_counted(sem, kind, resumed), asio::detached);
    asio::co_spawn(caller_ctx, wait_key_counted(keyed, resumed), asio::detached);
    caller_ctx.poll();  // the calls are posted to the limit's strand
    drain(limit_ctx);   // and wait there
    REQUIRE(sem.underlying().waiters() == 1);
    REQUIRE(keyed.underlying().waiters(1) == 1);
    CHECK(lifetime_counter::live() == before + 2);
  }
  CHECK(lifetime_counter::live() == before);
  sem.release();  // granted to a caller whose loop is gone
  busy.reset();
  drain(limit_ctx);
  CHECK(resumed.load() == 0);
  CHECK(sem.underlying().value() == 1);
  CHECK(sem.underlying().waiters() == 0);
  CHECK(keyed.underlying().keys() == 0);
}

TEST_CASE("review: a caller's loop destroyed with its grant queued there hands the grant on",
          "[strand_bound][review]") {
  // The strand posted the caller's completion, and the caller's loop is
  // destroyed before it runs it: the caller never sees its permit (nor its
  // try_acquire's true), so the dropped completion releases it.
  const int kind = GENERATE(0, 1, 2);
  const int before = lifetime_counter::live();
  std::atomic<int> resumed{0};
  bool took = false;
  asio::io_context limit_ctx;
  shared_sem sem{asio::make_strand(limit_ctx), kind == 2 ? 1 : 0};
  {
    asio::io_context caller_ctx;
    if (kind == 2) {
      asio::co_spawn(
          caller_ctx,
          [&]() -> asio::awaitable<void> {
            lifetime_counter in_frame;
            took = co_await sem.try_acquire();
            if (took) sem.release();
          },
          asio::detached);
    } else {
      asio::co_spawn(caller_ctx, wait_counted(sem, kind, resumed), asio::detached);
    }
    caller_ctx.poll();
    drain(limit_ctx);
    if (kind != 2) {
      REQUIRE(sem.underlying().waiters() == 1);
      sem.release();
      drain(limit_ctx);  // granted; the completion is queued on caller_ctx
    }
    CHECK(sem.underlying().value() == 0);
  }
  drain(limit_ctx);
  CHECK(resumed.load() == 0);
  CHECK_FALSE(took);
  CHECK(lifetime_counter::live() == before);
  CHECK(sem.underlying().value() == 1);
}

TEST_CASE("review: callers' loops destroyed on their threads while grants race to them",
          "[strand_bound][review]") {
  // Each round: a caller on a loop of its own (its thread) waits; the limit's
  // thread grants while the caller's thread destroys its loop, before the
  // call reached the strand, while it waits, or with the completion queued.
  // Whichever way it goes, the permit comes back and every frame is freed.
  constexpr int rounds = 150;
  const int before = lifetime_counter::live();
  std::atomic<int> resumed{0};
  asio::io_context limit_ctx;
  auto keep = asio::make_work_guard(limit_ctx);
  std::thread limit_thread([&] { limit_ctx.run(); });
  shared_sem sem{asio::make_strand(limit_ctx), 0};
  auto read = [&](auto f) {  // f(semaphore&) read on the strand, from this thread
    asio::io_context reader;
    auto r = asio::co_spawn(reader, sem.visit(f), asio::use_future);
    reader.run();
    return r.get();
  };
  int settled = 0;
  for (int i = 0; i < rounds; ++i) {
    std::thread caller([&, i] {
      asio::io_context caller_ctx;
      asio::co_spawn(caller_ctx, wait_counted(sem, i % 2, resumed), asio::detached);
      caller_ctx.poll();
      if (i % 3 != 0) caller_ctx.run_for(std::chrono::microseconds(i % 7 * 20));
    });
    if (i % 5 != 0) std::this_thread::sleep_for(std::chrono::microseconds(i % 11 * 10));
    sem.release();
    caller.join();
    // The permit is back in the pool once the hand-ons have run on the strand.
    for (int tries = 0; tries < 2000; ++tries) {
      if (read([](sluice::semaphore& s) { return s.value() == 1 && s.waiters() == 0; })) {
        ++settled;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    read([](sluice::semaphore& s) { return s.try_acquire(); });  // empty for the next round
  }
  keep.reset();
  limit_thread.join();
  CHECK(settled == rounds);
  CHECK(lifetime_counter::live() == before);
  CHECK(sem.underlying().value() == 0);
  CHECK(sem.underlying().waiters() == 0);
  UNSCOPED_INFO("rounds in which the caller resumed: " << resumed.load());
}

TEST_CASE("review: one loop destroyed while callers wait on its own strand frees everything",
          "[strand_bound][review]") {
  // The usual server: limit and callers on one io_context. The limit is
  // destroyed first (it aborts its waits), then the loop drops the posts.
  const int before = lifetime_counter::live();
  std::atomic<int> resumed{0};
  {
    asio::io_context ctx;
    shared_sem sem{asio::make_strand(ctx), 0};
    for (int kind = 0; kind < 2; ++kind)
      asio::co_spawn(asio::make_strand(ctx), wait_counted(sem, kind, resumed), asio::detached);
    ctx.poll();
    REQUIRE(sem.underlying().waiters() == 2);
    CHECK(lifetime_counter::live() == before + 2);
  }
  CHECK(lifetime_counter::live() == before);
  CHECK(resumed.load() == 0);
}

// How a call made by a coroutine whose cancellation is already requested
// ends: the co_await itself throws there, so it is caught right around it.
#define REVIEW_ENDING(how, call)                                                      \
  try {                                                                               \
    co_await (call);                                                                  \
    how.push_back("ok");                                                              \
  } catch (const sluice::system_error& e) {                                           \
    how.push_back(e.code() == asio::error::operation_aborted ? "aborted" : e.what()); \
  }

TEST_CASE("review: a caller cancelled before it called takes nothing, whatever the member",
          "[strand_bound][review]") {
  asio::io_context ctx;
  shared_sem sem{asio::make_strand(ctx), 1};
  keyed_t keyed{asio::make_strand(ctx), 1};
  sluice::strand_bound<sluice::rate_limiter> rps{asio::make_strand(ctx), 1, std::chrono::hours(1)};
  sluice::strand_bound<sluice::single_flight<int, int>> flights{asio::make_strand(ctx)};
  asio::cancellation_signal cancel;
  std::vector<std::string> how;
  int fn_calls = 0, visits = 0;
  auto fn = [&]() -> asio::awaitable<int> {
    ++fn_calls;
    co_return 1;
  };
  auto visit = [&](sluice::semaphore&) {
    ++visits;
  };
  asio::co_spawn(
      asio::make_strand(ctx),
      [&]() -> asio::awaitable<void> {
        cancel.emit(asio::cancellation_type::terminal);
        REVIEW_ENDING(how, sem.acquire());
        REVIEW_ENDING(how, sem.scoped_acquire());
        REVIEW_ENDING(how, sem.try_acquire());
        REVIEW_ENDING(how, keyed.scoped_acquire(1));
        REVIEW_ENDING(how, keyed.try_acquire(1));
        REVIEW_ENDING(how, rps.try_acquire());
        REVIEW_ENDING(how, flights.run(1, fn));
        REVIEW_ENDING(how, sem.visit(visit));
        // Boost.Asio 1.26's co_spawn awaits once more after the body: with
        // the cancellation still requested that would throw out of run().
        co_await asio::this_coro::throw_if_cancelled(false);
      },
      asio::bind_cancellation_slot(cancel.slot(), asio::detached));
  ctx.run();
  CHECK(how == std::vector<std::string>(8, "aborted"));
  CHECK(fn_calls == 0);
  CHECK(visits == 0);
  CHECK(sem.underlying().value() == 1);
  CHECK(keyed.underlying().keys() == 0);
  CHECK(rps.underlying().try_acquire());
  CHECK(flights.underlying().in_flight() == 0);
}

TEST_CASE("review: permits dropped on threads outside every loop are released on the strand",
          "[strand_bound][review]") {
  // ThreadSanitizer: the release never touches the limit off its strand.
  asio::io_context ctx;
  shared_sem sem{asio::make_strand(ctx), 3};
  keyed_t keyed{asio::make_strand(ctx), 1};
  std::vector<sluice::strand_permit<sluice::semaphore::permit>> permits;
  std::optional<sluice::strand_permit<sluice::keyed_semaphore<int>::permit>> key_permit;
  int granted_after = 0;
  asio::co_spawn(
      asio::make_strand(ctx),
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 3; ++i) permits.push_back(co_await sem.scoped_acquire());
        key_permit = co_await keyed.try_acquire(1);
      },
      asio::detached);
  ctx.run();
  ctx.restart();
  REQUIRE(permits.size() == 3);
  REQUIRE(key_permit.has_value());
  REQUIRE(*key_permit);
  auto work = asio::make_work_guard(ctx);
  std::thread loop([&] { ctx.run(); });
  {
    std::vector<std::thread> droppers;
    for (auto& p : permits) droppers.emplace_back([q = std::move(p)]() mutable { q.reset(); });
    droppers.emplace_back([q = std::move(*key_permit)]() mutable {
      auto moved = std::move(q);  // a moved-from permit releases nothing
    });
    for (auto& d : droppers) d.join();
  }
  asio::co_spawn(
      asio::make_strand(ctx),
      [&]() -> asio::awaitable<void> {
        for (int i = 0; i < 3; ++i) co_await sem.acquire();
        auto k = co_await keyed.scoped_acquire(1);
        granted_after = 4;
        for (int i = 0; i < 3; ++i) sem.release();
      },
      [&](std::exception_ptr) { work.reset(); });
  loop.join();
  CHECK(granted_after == 4);
  CHECK(sem.underlying().value() == 3);
  CHECK(keyed.underlying().keys() == 0);
}

TEST_CASE("review: a strand_bound destroyed before its io_context while grants are pending",
          "[strand_bound][review]") {
  // The usual member order (the io_context first, then the limit) destroys
  // the limit first. Two grants are queued on the callers' loop when it goes;
  // handing them on must not reach the destroyed strand_bound (ASan).
  const int before = lifetime_counter::live();
  std::atomic<int> resumed{0};
  {
    asio::io_context limit_ctx;
    std::optional<asio::io_context> callers(std::in_place);
    auto sem = std::make_unique<shared_sem>(asio::make_strand(limit_ctx), 0);
    for (int kind = 0; kind < 2; ++kind)
      asio::co_spawn(callers->get_executor(), wait_counted(*sem, kind, resumed), asio::detached);
    callers->poll();
    limit_ctx.poll();
    REQUIRE(sem->underlying().waiters() == 2);
    sem->release();
    sem->release();
    drain(limit_ctx);  // both granted; the completions are queued on `callers`
    REQUIRE(sem->underlying().waiters() == 0);
    sem.reset();      // the limit goes first
    callers.reset();  // drops the completions: the grants are handed on
    drain(limit_ctx);
  }
  CHECK(lifetime_counter::live() == before);
  CHECK(resumed.load() == 0);
}

TEST_CASE("review: the limit's loop destroyed first: a caller on another loop gets aborted",
          "[strand_bound][review]") {
  // The limit lives on a loop of its own (the executor of an io_context that
  // one thread runs), destroyed while a caller on another, live loop waits on
  // it, or before the call even reached it. The caller resumes on its own
  // loop with operation_aborted; before, it was never resumed (its frame was
  // unwound unfinished: whoever awaited it waited for ever).
  const bool reached = GENERATE(true, false);
  std::optional<shared_sem> sem;
  asio::io_context callers;
  std::vector<std::string> how;
  {
    asio::io_context limit_ctx;
    sem.emplace(limit_ctx.get_executor(), 0);
    for (int kind = 0; kind < 2; ++kind)
      asio::co_spawn(
          callers,
          [&, kind]() -> asio::awaitable<void> {
            try {
              if (kind == 0) {
                co_await sem->acquire();
              } else {
                auto p = co_await sem->scoped_acquire();
              }
              how.push_back("granted");
            } catch (const sluice::system_error& e) {
              how.push_back(e.code() == asio::error::operation_aborted ? "aborted" : e.what());
            }
          },
          asio::detached);
    callers.poll();
    if (reached) {
      limit_ctx.poll();
      REQUIRE(sem->underlying().waiters() == 2);
    }
  }
  drain(callers);
  CHECK(how == std::vector<std::string>{"aborted", "aborted"});
  CHECK(sem->underlying().waiters() == 0);
}
