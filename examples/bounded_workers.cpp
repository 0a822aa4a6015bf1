// SPDX-License-Identifier: BSL-1.0
// Bounded workers: a semaphore caps how many of six workers call a slow
// backend at once, the workers drain a queue of jobs, an event stops them
// cooperatively, and a probe prints the semaphore's value (free permits) and
// waiters once per second. Run with a cap of 2 and of 6: a sustained value of 0
// with waiters > 0 is the signature of a cap that is too tight.
//
//   bounded_workers             real time, compressed (1 "second" = 50 ms)
//   bounded_workers --virtual   virtual time (exact, instantaneous)

#include <sluice/event.hpp>
#include <sluice/queue.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <sluice/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

using namespace std::chrono_literals;
using namespace asio::experimental::awaitable_operators;

namespace {

struct job {
  int id = 0;
  int cost = 1;  // in seconds of backend latency
};

struct report {
  double makespan_s = 0;
  std::size_t max_waiters = 0;
};

// One run: `workers` workers, at most `cap` of them in the backend at once.
// `second` is how long one (simulated) second lasts.
asio::awaitable<report> scenario(std::size_t cap, int workers, std::chrono::nanoseconds second) {
  auto ex = co_await asio::this_coro::executor;
  const auto start = sluice::now(ex);
  auto elapsed = [&] {
    return std::chrono::duration<double>(sluice::now(ex) - start).count();
  };
  const double unit = std::chrono::duration<double>(second).count();

  sluice::semaphore backend{cap};
  sluice::queue<job> jobs;
  sluice::event stop;

  for (int i = 0; i < 18; ++i) (void)jobs.try_put(job{i, 1 + i % 3});

  auto worker = [&]() -> asio::awaitable<void> {
    while (!stop.is_set()) {
      // Bounded wait on the queue, so the stop flag is seen within 0.2 s.
      auto next = co_await (jobs.get() || sluice::sleep(second / 5));
      if (next.index() == 1) continue;
      const job j = std::get<0>(next);
      {
        auto permit = co_await backend.scoped_acquire();
        co_await sluice::sleep(second * j.cost);  // the slow call
      }
      jobs.task_done();
    }
  };

  auto probe = [&]() -> asio::awaitable<void> {
    while (!stop.is_set()) {
      std::printf("  t=%4.1fs  sem value=%zu  waiters=%zu  queued=%zu\n", elapsed() / unit,
                  backend.value(), backend.waiters(), jobs.size());
      co_await (stop.wait() || sluice::sleep(second));
    }
  };

  double done_at = 0;
  auto producer = [&]() -> asio::awaitable<void> {
    co_await jobs.join();  // every job done
    done_at = elapsed();
    stop.set();  // one call stops every worker and the probe
  };

  auto everyone = producer() && probe();
  for (int w = 0; w < workers; ++w) {
    everyone = std::move(everyone) && worker();
  }
  co_await std::move(everyone);
  co_return report{done_at / unit, backend.max_waiters()};
}

template <class Run>
int run_both(Run run) {
  const int workers = 6;
  for (std::size_t cap : {std::size_t{2}, std::size_t{6}}) {
    std::printf("cap=%zu, %d workers, 18 jobs of 1-3 s (36 s of work):\n", cap, workers);
    const report r = run(cap, workers);
    std::printf(
        "  => all jobs done at %.1f s (work / cap = %.1f s); up to %zu workers waited for a "
        "permit\n\n",
        r.makespan_s, 36.0 / static_cast<double>(cap), r.max_waiters);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const bool virtual_time = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  try {
    if (virtual_time) {
      std::printf("[virtual time]\n");
      return run_both([](std::size_t cap, int workers) {
        sluice::testing::virtual_loop loop;
        return loop.run(scenario(cap, workers, 1s));
      });
    }
    std::printf("[real time, 1 s simulated = 50 ms]\n");
    return run_both([](std::size_t cap, int workers) {
      asio::io_context ctx;
      report r;
      asio::co_spawn(ctx, scenario(cap, workers, 50ms), [&](std::exception_ptr e, report v) {
        if (e) std::rethrow_exception(e);
        r = v;
      });
      ctx.run();
      return r;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bounded_workers: %s\n", e.what());
    return 1;
  }
}
