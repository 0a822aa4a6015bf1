// SPDX-License-Identifier: BSL-1.0
// An adversarial review of retry.hpp, adaptive_limit.hpp and acquire_all.hpp
// (DESIGN.md "Providers that push back", "Bad input"): each case probes an
// edge the headers' own tests did not pin. Every timing is exact, in virtual
// time.
#include <sluice/acquire_all.hpp>
#include <sluice/adaptive_limit.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/retry.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/token_bucket.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>
#include <support/lifetime.hpp>
#include <support/spawned.hpp>

#include <chrono>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::virtual_loop;
using sluice_test::lifetime_counter;
using sluice_test::tasks_on_loop;
using ns = std::chrono::nanoseconds;

namespace {

// A provider error carrying a Retry-After hint.
struct hinted : std::runtime_error, sluice::retry_after {
  explicit hinted(sluice::clock::duration d) : std::runtime_error("hinted"), sluice::retry_after{d} {}
};

// Waits in acquire_all on `sem` with a counted frame.
asio::awaitable<void> wait_all_counted(sluice::semaphore& sem) {
  lifetime_counter in_frame;
  auto held = co_await sluice::acquire_all(sem);
}

}  // namespace

// ---- acquire_all ----------------------------------------------------------

TEST_CASE("review: a rate limiter named twice in acquire_all is refused, not over-admitted",
          "[acquire_all][review]") {
  // Both were peeked free, then both taken: two starts in a window of one.
  sluice::rate_limiter rpm{1, 1min};
  sluice::rate_limiter tpm{100, 1min};
  virtual_loop loop;
  std::string twice, weighted_twice;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      auto held = co_await sluice::acquire_all(rpm, rpm);
      twice = "granted";
    } catch (const std::invalid_argument& e) {
      twice = e.what();
    }
    try {
      auto held = co_await sluice::acquire_all(tpm.weighted(60), tpm.weighted(60));
      weighted_twice = "granted";
    } catch (const std::invalid_argument& e) {
      weighted_twice = e.what();
    }
  });
  CHECK(twice.find("acquire_all") != std::string::npos);
  CHECK(weighted_twice.find("acquire_all") != std::string::npos);
  CHECK(rpm.stats().acquired == 0);  // nothing was recorded
  CHECK(tpm.stats().acquired == 0);  // nor taken
}

TEST_CASE("review: a semaphore or key named twice in acquire_all throws, it does not spin",
          "[acquire_all][review]") {
  // sem{1} named twice could never be granted: it busy-looped without
  // suspending (each budget's wait is granted at once, the other refused).
  sluice::semaphore sem{1};
  sluice::keyed_semaphore<int> per_key{1};
  virtual_loop loop;
  bool threw_sem = false, threw_key = false;
  std::string distinct_keys;
  loop.run([&]() -> asio::awaitable<void> {
    try {
      auto held = co_await sluice::acquire_all(sem, sem);
    } catch (const std::invalid_argument&) {
      threw_sem = true;
    }
    try {
      auto held = co_await sluice::acquire_all(sluice::for_key(per_key, 7),
                                               sluice::for_key(per_key, 7));
    } catch (const std::invalid_argument&) {
      threw_key = true;
    }
    // Two keys of one keyed_semaphore are two budgets.
    distinct_keys = co_await sluice_test::ending_of(
        sluice::acquire_all(sluice::for_key(per_key, 7), sluice::for_key(per_key, 8)));
  });
  CHECK(threw_sem);
  CHECK(threw_key);
  CHECK(distinct_keys == "ok");
  CHECK(sem.value() == 1);
  CHECK(per_key.keys() == 0);
}

TEST_CASE("review: an io_context destroyed while acquire_all callers wait frees their frames",
          "[acquire_all][review]") {
  // The second caller waits for the first to leave (FIFO among acquire_all
  // callers); its frame owned the first caller's entry, whose event owned
  // its frame: a cycle the loop's end has to break.
  const int before = lifetime_counter::live();
  {
    asio::io_context ctx;
    sluice::semaphore sem{0};  // destroyed first: its waiter's abort is posted, then dropped
    asio::co_spawn(ctx, wait_all_counted(sem), asio::detached);
    asio::co_spawn(ctx, wait_all_counted(sem), asio::detached);
    asio::co_spawn(ctx, wait_all_counted(sem), asio::detached);
    ctx.poll();
    REQUIRE(sem.waiters() == 1);
    CHECK(lifetime_counter::live() == before + 3);
  }
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE("review: acquire_all cancelled while it waits behind an older caller holds nothing",
          "[acquire_all][review]") {
  sluice::semaphore sem{1};
  sluice::rate_limiter rpm{2, 1min};
  tasks_on_loop t;
  auto& holder = t.spawn([&]() -> asio::awaitable<void> {
    auto p = co_await sem.scoped_acquire();
    co_await sluice::sleep(1h);
  });
  auto& older = t.spawn([&]() -> asio::awaitable<void> {
    auto held = co_await sluice::acquire_all(sem, rpm);  // waits in sem's FIFO
  });
  auto& younger = t.spawn([&]() -> asio::awaitable<void> {
    auto held = co_await sluice::acquire_all(rpm);  // shares rpm: waits for `older` to leave
  });
  t.loop.run_for(1s);
  REQUIRE(sem.waiters() == 1);
  REQUIRE_FALSE(younger.done);
  younger.cancel();
  t.poll();
  CHECK(younger.cancelled());
  CHECK(rpm.waiters() == 0);
  holder.cancel();  // older is granted both at 1 s
  t.loop.run_for(1s);
  CHECK(older.succeeded());
  CHECK(rpm.stats().acquired == 1);
  CHECK(rpm.try_acquire());  // one start left in the window: the cancelled call took none
  CHECK_FALSE(rpm.try_acquire());
  CHECK(sem.value() == 1);
}

// ---- retry ----------------------------------------------------------------

TEST_CASE("review: a retry_after hint past the clock's range waits until cancelled",
          "[retry][review]") {
  // t + hint overflowed (undefined; in practice a deadline in the past and an
  // immediate retry). sleep() saturates such a deadline; so must retry.
  std::size_t attempts = 0;
  tasks_on_loop t;
  auto& task = t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::sleep(1s);  // so that now() + the hint leaves the clock's range
    co_await sluice::retry({.attempts = 3}, [&]() -> asio::awaitable<void> {
      ++attempts;
      throw hinted(sluice::clock::duration::max());
      co_return;
    });
  });
  t.loop.run_for(1h);
  CHECK(attempts == 1);
  CHECK_FALSE(task.done);
  task.cancel();
  t.poll();
  CHECK(task.cancelled());
  CHECK(attempts == 1);
}

TEST_CASE("review: a backoff whose max is the clock's range waits until cancelled",
          "[retry][review]") {
  std::size_t attempts = 0;
  tasks_on_loop t;
  auto& task = t.spawn([&]() -> asio::awaitable<void> {
    co_await sluice::sleep(1s);
    co_await sluice::retry({.first = sluice::clock::duration::max(),
                            .max = sluice::clock::duration::max(),
                            .attempts = 3,
                            .jitter = sluice::no_jitter},
                           [&]() -> asio::awaitable<void> {
                             ++attempts;
                             throw sluice::throttled_error("no");
                             co_return;
                           });
  });
  t.loop.run_for(1h);
  CHECK(attempts == 1);
  task.cancel();
  t.poll();
  CHECK(task.cancelled());
}

TEST_CASE("review: retry rethrows the very object when the budget refuses and at max_elapsed",
          "[retry][review]") {
  sluice::retry_budget budget{{.ratio = 0.0, .per = 10s}};
  virtual_loop loop;
  const void* thrown = nullptr;
  const void* caught_budget = nullptr;
  const void* caught_elapsed = nullptr;
  auto fail = [&]() -> asio::awaitable<void> {
    try {
      throw sluice::throttled_error("refused");
    } catch (const sluice::throttled_error& e) {
      thrown = &e;
      throw;
    }
    co_return;
  };
  loop.run([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::retry({.attempts = 5, .budget = &budget}, fail);
    } catch (const sluice::throttled_error& e) {
      caught_budget = &e;
    }
    CHECK(caught_budget == thrown);
    try {
      co_await sluice::retry(
          {.first = 2s, .attempts = 5, .max_elapsed = 1s, .jitter = sluice::no_jitter}, fail);
    } catch (const sluice::throttled_error& e) {
      caught_elapsed = &e;
    }
    CHECK(caught_elapsed == thrown);
  });
  CHECK(budget.refused() == 1);
  CHECK(loop.now() == 0s);
}

TEST_CASE("review: a retry whose caller was cancelled before it called makes no attempt",
          "[retry][review]") {
  std::size_t attempts = 0;
  tasks_on_loop t;
  auto& task = t.spawn([&]() -> asio::awaitable<void> {
    try {
      co_await sluice::sleep(1h);
    } catch (const sluice::system_error&) {
    }
    co_await sluice::retry({.first = 1s, .attempts = 5}, [&]() -> asio::awaitable<void> {
      ++attempts;
      co_return;
    });
  });
  t.poll();
  task.cancel();
  t.loop.run_for(1min);
  CHECK(task.cancelled());
  CHECK(attempts == 0);
}

// ---- adaptive_limit -------------------------------------------------------

namespace {

sluice::adaptive_limit::options fixed(std::size_t initial, std::size_t max = 64) {
  return {.initial = initial,
          .min = 1,
          .max = max,
          .algorithm = sluice::aimd{.increase = 0, .backoff = 1.0}};
}

}  // namespace

TEST_CASE("review: lowering an adaptive limit grants nothing, so stats count no grant",
          "[adaptive_limit][review]") {
  virtual_loop loop;
  sluice::adaptive_limit cap{fixed(8)};
  cap.set_limit(2);  // six free places leave the pool: nobody was granted anything
  CHECK(cap.stats().acquired == 0);
  CHECK(cap.in_flight() == 0);
  auto p = cap.try_acquire(loop.get_executor());
  CHECK(cap.stats().acquired == 1);
  cap.set_limit(8);
  cap.set_limit(1);  // absorbs the 1 free place; the rest is debt
  CHECK(cap.stats().acquired == 1);
  CHECK(cap.stats().in_use == 1);
}

TEST_CASE("review: an adaptive limit with a vast max moves in one step, not one per place",
          "[adaptive_limit][review]") {
  // apply() granted or absorbed the places one at a time: set_limit(max) with
  // max = 2^62 never returned.
  constexpr std::size_t huge = std::size_t{1} << 62;
  virtual_loop loop;
  sluice::adaptive_limit cap{fixed(1, huge)};
  cap.set_limit(huge);
  CHECK(cap.limit() == huge);
  CHECK(cap.in_flight() == 0);
  auto p = cap.try_acquire(loop.get_executor());
  CHECK(cap.in_flight() == 1);
  cap.set_limit(1);
  CHECK(cap.limit() == 1);
  CHECK(cap.in_flight() == 1);
  p.reset();
  CHECK(cap.in_flight() == 0);
  sluice::adaptive_limit widest{fixed(1, std::numeric_limits<std::size_t>::max())};
  widest.set_limit(std::numeric_limits<std::size_t>::max());
  CHECK(widest.limit() == std::numeric_limits<std::size_t>::max());
}

TEST_CASE("review: FIFO holds while the limit moves and queued waiters are cancelled",
          "[adaptive_limit][review]") {
  tasks_on_loop t;
  sluice::adaptive_limit cap{fixed(1)};
  std::vector<int> order;
  std::vector<sluice::adaptive_limit::permit> held;
  auto first = cap.try_acquire(t.loop.get_executor());
  std::vector<sluice_test::task*> w;
  for (int i = 0; i < 6; ++i) {
    w.push_back(&t.spawn([&, i]() -> asio::awaitable<void> {
      auto p = co_await cap.scoped_acquire();
      order.push_back(i);
      held.push_back(std::move(p));
    }));
  }
  t.poll();
  REQUIRE(cap.waiters() == 6);
  w[1]->cancel();
  cap.set_limit(3);  // two new places: to 0 and 2 (1 left the queue)
  w[2]->cancel();    // granted, not yet resumed: its place goes on to 3
  t.poll();
  CHECK(order == std::vector<int>{0, 3});
  CHECK(w[1]->cancelled());
  CHECK(w[2]->cancelled());
  CHECK(cap.in_flight() == 3);
  cap.set_limit(1);  // in flight 3 > 1: two releases are absorbed
  first.reset();
  held[0].reset();
  t.poll();
  CHECK(order == std::vector<int>{0, 3});
  CHECK(cap.in_flight() == 1);
  held[1].reset();  // now below the limit: the oldest waiter, 4
  t.poll();
  CHECK(order == std::vector<int>{0, 3, 4});
  CHECK(cap.in_flight() == 1);
  CHECK(cap.limit() == 1);
  CHECK(cap.waiters() == 1);
  cap.set_limit(0);  // clamped to min: nothing moves
  CHECK(cap.limit() == 1);
  held.clear();
  t.poll();
  CHECK(order == std::vector<int>{0, 3, 4, 5});
  held.clear();
  CHECK(cap.in_flight() == 0);
  CHECK(cap.waiters() == 0);
}
