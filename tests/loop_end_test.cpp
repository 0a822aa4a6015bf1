// SPDX-License-Identifier: BSL-1.0
// Loops that come and go, seen from the loop-affine primitives: a waiter whose
// io_context is destroyed while it waits leaves the primitive's queue with its
// loop (its frame freed, nothing posted into the dead loop later), and what it
// waited for goes to the next live waiter or stays available. Without the
// loop_service watch of detail/waiter_list.hpp each case is a heap use after
// free under ASan (a release, put, refill or destructor completing the dead
// waiter through its destroyed io_context) or a lost permit/item/wakeup.

#include <sluice/condition.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/queue.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/token_bucket.hpp>

#include <sluice/detail/loop_service.hpp>

#include <support/asio.hpp>
#include <support/lifetime.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using sluice_test::lifetime_counter;

namespace {

// Spawns `body` on `ctx` and runs the loop until nothing is ready (the body
// is then suspended in its wait).
void start_waiting(asio::io_context& ctx, std::function<asio::awaitable<void>()> body) {
  asio::co_spawn(
      ctx,
      [body = std::move(body)]() -> asio::awaitable<void> {
        lifetime_counter in_frame;
        co_await body();
      },
      asio::detached);
  ctx.poll();
}

// Runs `ctx` until `done` or `limit` passes (a hang fails the CHECK after).
void run_until(asio::io_context& ctx, const bool& done, std::chrono::milliseconds limit = 5s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  ctx.restart();
  while (!done && std::chrono::steady_clock::now() < deadline) ctx.run_one_for(10ms);
}

}  // namespace

TEST_CASE(
    "semaphore: a waiter's loop destroyed while it waits; the permit goes to the next "
    "live waiter, then stays available",
    "[loop_end][semaphore][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::semaphore sem{1};
  REQUIRE(sem.try_acquire());
  asio::io_context live;
  bool live_granted = false;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      co_await sem.acquire();
      FAIL("the dead loop's waiter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      auto p = co_await sem.scoped_acquire();
      live_granted = true;
    });
    REQUIRE(sem.waiters() == 2);
  }  // the first waiter goes with its loop
  CHECK(sem.waiters() == 1);
  CHECK(lifetime_counter::live() == before + 1);
  sem.release();  // from no loop at all: to the live waiter, not the dead one
  run_until(live, live_granted);
  CHECK(live_granted);
  CHECK(sem.value() == 1);  // released again by the live waiter's permit
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE("semaphore: destroyed after its waiter's loop, it posts into no dead loop",
          "[loop_end][semaphore][lifetime]") {
  const int before = lifetime_counter::live();
  {
    std::optional<sluice::semaphore> sem;
    sem.emplace(0);
    {
      asio::io_context dying;
      start_waiting(dying, [&]() -> asio::awaitable<void> { co_await sem->acquire(); });
      REQUIRE(sem->waiters() == 1);
    }
    CHECK(sem->waiters() == 0);
    sem.reset();  // the destructor aborts its waiters: none of them is dead
  }
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE(
    "semaphore: waiters of a dying loop holding permits of another limit hand them to "
    "live waiters, and none to the dying",
    "[loop_end][semaphore][lifetime]") {
  // Two waiters on the dying loop: one holds b's permit while it waits for a;
  // the other waits for b. Destroying the first frame releases b: the permit
  // must go to b's live waiter or stay, never to the other dying waiter.
  const int before = lifetime_counter::live();
  sluice::semaphore a{0}, b{1};
  asio::io_context live;
  bool live_granted = false;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      auto held = co_await b.scoped_acquire();
      co_await a.acquire();
    });
    start_waiting(dying, [&]() -> asio::awaitable<void> { co_await b.acquire(); });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      auto p = co_await b.scoped_acquire();
      live_granted = true;
    });
    REQUIRE(a.waiters() == 1);
    REQUIRE(b.waiters() == 2);
  }
  CHECK(a.waiters() == 0);
  run_until(live, live_granted);
  CHECK(live_granted);
  CHECK(b.value() == 1);
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE("keyed_semaphore: a waiter's loop destroyed while it waits for its key",
          "[loop_end][keyed_semaphore][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::keyed_semaphore<std::string> per_key{1};
  asio::io_context live;
  bool live_granted = false;
  std::optional<sluice::keyed_semaphore<std::string>::permit> holder = per_key.try_acquire("k");
  REQUIRE(holder);
  REQUIRE(*holder);
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      co_await per_key.acquire("k");
      FAIL("the dead loop's waiter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      auto p = co_await per_key.scoped_acquire("k");
      live_granted = true;
    });
  }
  holder.reset();  // released outside any loop: to the live waiter
  run_until(live, live_granted);
  CHECK(live_granted);
  CHECK(per_key.try_acquire("k"));
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE(
    "queue: a getter's loop destroyed while it waits; a put goes to the next live getter, "
    "then stays in the queue",
    "[loop_end][queue][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::queue<int> q;
  asio::io_context live;
  std::optional<int> got;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      (void)co_await q.get();
      FAIL("the dead loop's getter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> { got = co_await q.get(); });
    REQUIRE(q.getters() == 2);
  }
  CHECK(q.getters() == 1);
  REQUIRE(q.try_put(1));  // outside any loop
  bool done = false;
  asio::co_spawn(
      live,
      [&]() -> asio::awaitable<void> {
        while (!got) co_await sluice::sleep(1ms);
        done = true;
      },
      asio::detached);
  run_until(live, done);
  CHECK(got == 1);
  REQUIRE(q.try_put(2));  // nobody waits now: it stays
  CHECK(q.size() == 1);
  CHECK(q.try_get() == 2);
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE(
    "queue: a putter's loop destroyed while it waits for room takes its item with it and "
    "leaves the room to the next live putter",
    "[loop_end][queue][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::queue<int> q{1};
  REQUIRE(q.try_put(1));
  asio::io_context live;
  bool put_done = false;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      co_await q.put(99);
      FAIL("the dead loop's putter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      co_await q.put(2);
      put_done = true;
    });
    REQUIRE(q.putters() == 2);
  }
  CHECK(q.putters() == 1);
  CHECK(q.try_get() == 1);  // room: for the live putter, not the dead one
  run_until(live, put_done);
  CHECK(put_done);
  CHECK(q.try_get() == 2);
  CHECK(q.empty());
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE(
    "condition: a waiter's loop destroyed while it waits; notify wakes the next live "
    "waiter",
    "[loop_end][condition][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::condition cv;
  asio::io_context live;
  bool woken = false;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      auto g = co_await cv.scoped_acquire();
      co_await cv.wait();
      FAIL("the dead loop's waiter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      auto g = co_await cv.scoped_acquire();
      co_await cv.wait();
      woken = true;
    });
    REQUIRE(cv.waiters() == 2);
  }
  CHECK(cv.waiters() == 1);
  bool notified = false;
  asio::co_spawn(
      live,
      [&]() -> asio::awaitable<void> {
        auto g = co_await cv.scoped_acquire();
        cv.notify(1);  // one notification: it must reach the live waiter
        notified = true;
      },
      asio::detached);
  run_until(live, woken);
  CHECK(notified);
  CHECK(woken);
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE(
    "rate_limiter: the head waiter's loop destroyed while it waits; the next live waiter "
    "is granted on its own loop",
    "[loop_end][rate_limiter][lifetime]") {
  // The steady timer is on the head waiter's loop: when that loop dies, the
  // timer must move to the next head's loop (or be let go), never be used on
  // the dead one.
  const int before = lifetime_counter::live();
  sluice::rate_limiter limit{1, 20ms};
  REQUIRE(limit.try_acquire());
  asio::io_context live;
  bool live_granted = false;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      co_await limit.acquire();
      FAIL("the dead loop's waiter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      co_await limit.acquire();
      live_granted = true;
    });
    REQUIRE(limit.waiters() == 2);
  }
  CHECK(limit.waiters() == 1);
  run_until(live, live_granted);
  CHECK(live_granted);  // the unit the dead waiter waited for went to the live one
  CHECK(limit.stats().acquired == 2);
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE("rate_limiter: its only waiter's loop destroyed; used afterwards on another loop",
          "[loop_end][rate_limiter][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::rate_limiter limit{1, 20ms};
  REQUIRE(limit.try_acquire());
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> { co_await limit.acquire(); });
    REQUIRE(limit.waiters() == 1);
  }
  CHECK(limit.waiters() == 0);
  asio::io_context next;
  bool granted = false;
  asio::co_spawn(
      next,
      [&]() -> asio::awaitable<void> {
        co_await limit.acquire();
        granted = true;
      },
      asio::detached);
  run_until(next, granted);
  CHECK(granted);
  CHECK(limit.stats().acquired == 2);
  CHECK(lifetime_counter::live() == before);
}

TEST_CASE(
    "token_bucket: a waiter's loop destroyed while it waits for a refill; the refill goes "
    "to the next live waiter, then stays in the bucket",
    "[loop_end][token_bucket][lifetime]") {
  const int before = lifetime_counter::live();
  sluice::token_bucket bucket{50.0, 1};  // one token per 20 ms
  REQUIRE(bucket.try_acquire());
  asio::io_context live;
  bool live_granted = false;
  {
    asio::io_context dying;
    start_waiting(dying, [&]() -> asio::awaitable<void> {
      co_await bucket.acquire();
      FAIL("the dead loop's waiter was resumed");
    });
    start_waiting(live, [&]() -> asio::awaitable<void> {
      co_await bucket.acquire();
      live_granted = true;
    });
    REQUIRE(bucket.waiters() == 2);
  }
  CHECK(bucket.waiters() == 1);
  run_until(live, live_granted);
  CHECK(live_granted);
  // Nobody waits now: the next refill stays in the bucket for anyone.
  bool later = false;
  asio::co_spawn(
      live,
      [&]() -> asio::awaitable<void> {
        co_await sluice::sleep(40ms);
        later = bucket.try_acquire();
      },
      asio::detached);
  bool* flag = &later;
  run_until(live, *flag);
  CHECK(later);
  CHECK(lifetime_counter::live() == before);
}

namespace {

// A hook that records its on_end calls in `log` under its name.
struct named_hook : sluice::detail::loop_hook {
  named_hook(std::string n, std::vector<std::string>& l) : name(std::move(n)), log(&l) {
    on_end = &record;
  }
  std::string name;
  std::vector<std::string>* log;
  std::shared_ptr<sluice::detail::loop_life> life;
  int relinks = 0;         // times to relink itself from on_end
  bool hand_back = false;  // first on_end: expect it back from another thread
  static void record(sluice::detail::loop_hook* h) noexcept {
    auto* self = static_cast<named_hook*>(h);
    self->log->push_back(self->name);
    if (self->relinks > 0) {
      --self->relinks;
      self->life->relink(*self);
    } else if (self->hand_back) {
      self->hand_back = false;
      self->life->expect_hand_back();
    }
  }
};

}  // namespace

TEST_CASE(
    "loop_life: at the context's end every attached hook ends, the first ones before the "
    "others, relinked ones again; detached ones do not; later attaches are refused",
    "[loop_end][lifetime]") {
  std::vector<std::string> log;
  named_hook w1{"watch 1", log}, w2{"watch 2", log}, h1{"hook 1", log}, h2{"hook 2", log},
      gone{"detached", log}, late{"late", log};
  std::shared_ptr<sluice::detail::loop_life> life;
  {
    asio::io_context ctx;
    life = sluice::detail::loop_service::life_of(ctx);
    for (named_hook* h : {&w1, &w2, &h1, &h2, &gone}) h->life = life;
    REQUIRE(life->attach(h1));
    REQUIRE(life->attach_first(w1));  // attached after h1, ends before it
    REQUIRE(life->attach(gone));
    REQUIRE(life->attach(h2));
    REQUIRE(life->attach_first(w2));
    w1.relinks = 1;  // a waiter list's watch: takes out, then buries in the second round
    life->detach(gone);
    CHECK_FALSE(gone.attached);
    CHECK_FALSE(life->ended());
  }  // ~io_context: shutdown ends the life
  CHECK(life->ended());
  REQUIRE(log.size() == 5);
  // Both first hooks before any other; w1 again among the others.
  const auto pos = [&](const std::string& n) {
    return std::find(log.begin(), log.end(), n) - log.begin();
  };
  CHECK(std::max(pos("watch 1"), pos("watch 2")) == 1);
  CHECK(std::count(log.begin(), log.end(), "watch 1") == 2);
  CHECK(std::count(log.begin(), log.end(), "hook 1") == 1);
  CHECK(std::count(log.begin(), log.end(), "hook 2") == 1);
  CHECK(std::count(log.begin(), log.end(), "detached") == 0);
  for (named_hook* h : {&w1, &w2, &h1, &h2}) CHECK_FALSE(h->attached);
  CHECK_FALSE(life->attach(late));
  CHECK_FALSE(life->attach_first(late));
  CHECK_FALSE(late.attached);
}

TEST_CASE("loop_life: the end waits for a hook another thread holds, and ends it when handed back",
          "[loop_end][lifetime]") {
  // shared_semaphore's orphan path: a grant caught between the core's mutex
  // and the loop's lock is handed back, and the end finishes it on its thread.
  std::vector<std::string> log;
  named_hook op{"op", log};
  std::atomic<bool> expected{false};
  std::thread other;
  std::shared_ptr<sluice::detail::loop_life> life;
  {
    asio::io_context ctx;
    life = sluice::detail::loop_service::life_of(ctx);
    op.life = life;
    op.hand_back = true;
    REQUIRE(life->attach(op));
    other = std::thread([&] {
      while (!life->ended()) std::this_thread::yield();
      std::this_thread::sleep_for(20ms);  // the end is waiting by now
      const auto lock = life->lock();
      expected = true;
      life->hand_back(op);
    });
  }  // returns only once the hook was handed back and ended again
  CHECK(expected);
  CHECK(log == std::vector<std::string>{"op", "op"});
  other.join();
}
