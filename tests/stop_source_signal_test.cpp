// SPDX-License-Identifier: BSL-1.0
// The job runner of stop_source_test, in real time, stopped the way a service
// is: SIGINT sent to this process (kill on our own pid), received through an
// asio::signal_set, which requests the stop with a grace. Counts only; the one
// duration bound is there so that a hang fails instead of blocking the suite.
#include <sluice/gather.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/queue.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio/signal_set.hpp>
#else
#include <asio/signal_set.hpp>
#endif

#include <catch2/catch.hpp>
#include <support/job_runner.hpp>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <string>

#include <signal.h>
#include <unistd.h>

using namespace std::chrono_literals;
using sluice_test::job_state;

TEST_CASE("SIGINT stops the job runner: nothing left running, every job accounted for",
          "[stop_source]") {
  // 200 jobs of 20 ms over 4 tenants (one call per tenant at a time), at most
  // 4 jobs in the group. Job 0 would take a minute: the grace must end it.
  constexpr std::size_t jobs = 200;
  sluice_test::job_runner r(
      jobs, 4,
      {.latency = sluice::testing::latency::from(
           [](const sluice::testing::call_info& c) -> std::chrono::nanoseconds {
             return c.index == 0 ? std::chrono::nanoseconds(60s) : std::chrono::nanoseconds(20ms);
           })});
  asio::io_context ctx;
  sluice::stop_source stop;
  int signal_seen = 0;
  asio::signal_set signals(ctx, SIGINT);  // installed now: the kill below cannot end the process
  signals.async_wait([&](const sluice::error_code& ec, int sig) {
    if (ec) return;
    signal_seen = sig;
    stop.request(200ms);
  });
  bool finished = false;
  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        sluice::queue<std::size_t> q;
        for (std::size_t i = 0; i < jobs; ++i) REQUIRE(q.try_put(i));
        sluice::keyed_semaphore<std::string> per_tenant{1};
        auto interrupt = []() -> asio::awaitable<void> {
          co_await sluice::sleep(100ms);
          ::kill(::getpid(), SIGINT);
        };
        co_await sluice::gather(
            sluice::task_group::run(
                4, [&](sluice::task_group& g) { return r.produce(g, q, per_tenant); }, stop),
            interrupt());
        signals.cancel();
        // Nothing of the group runs any more: the service sees no call in
        // flight, and every job is done, cancelled, or was never started.
        CHECK(r.service.in_flight() == 0);
        CHECK(q.size() + r.refused == r.count(job_state::queued));
        finished = true;
      },
      [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  ctx.run();
  const auto took = std::chrono::steady_clock::now() - t0;

  REQUIRE(finished);
  CHECK(signal_seen == SIGINT);
  CHECK(stop.stop_requested());
  CHECK(r.count(job_state::running) == 0);
  CHECK(r.count(job_state::taken) == 0);
  const std::size_t done = r.count(job_state::done);
  const std::size_t cancelled = r.count(job_state::cancelled);
  const std::size_t never = r.count(job_state::queued);
  CHECK(done + cancelled + never == jobs);
  CHECK(done >= 3);                            // jobs 1-3 end at 20 ms, long before the signal
  CHECK(r.states[0] == job_state::cancelled);  // the minute-long job, ended by the grace
  CHECK(never > 0);
  CHECK(r.service.cancellations() >= 1);
  CHECK(r.service.completed() == done);
  // A hang bound, not a timing assertion: the minute-long job must not be waited for.
  CHECK(took < 30s);
}
