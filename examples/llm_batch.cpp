// SPDX-License-Identifier: BSL-1.0
// 40 document assessments against a simulated LLM endpoint whose provider
// allows 60 requests per minute (rolling window) and 4 in flight; a request
// over either limit is answered at once with 429 (throttled), and the client
// retries it after 10 s. Each assessment is two calls: a short "classify"
// (0.5-1.5 s) and the long "assess" (2-8 s), latencies seeded.
//
// Three runs, side by side:
//   unbounded                    every assessment at once: 429s on in-flight and on rate
//   semaphore{4}                 never more than 4 in flight, but the short calls make
//                                more than 60 starts a minute: still throttled
//   semaphore{4} + rate_limiter  and at most 60 starts in any minute: zero throttles
//
//   llm_batch             real time, compressed (1 simulated second = 10 ms)
//   llm_batch --virtual   virtual time (exact, instantaneous)

#include <sluice/gather.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <sluice/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace testing = sluice::testing;

namespace {

constexpr int documents = 40;

struct result {
  std::size_t calls = 0, throttles = 0, max_in_flight = 0;
  double makespan_s = 0;
};

enum class mode { unbounded, semaphore_only, semaphore_and_rate };

testing::slow_service::options endpoint(double scale) {
  auto classify = testing::latency::uniform(500ms, 1500ms, 11);
  auto assess = testing::latency::uniform(2s, 8s, 42);
  return {.latency = testing::latency::from([=](const testing::call_info& c) {
            return c.op == "classify" ? classify(c) : assess(c);
          }),
          .quota = {.max_in_flight = 4, .calls_per_window = 60, .window = 1min},
          .time_scale = scale};
}

// One call, retried after a (scaled) 10 s back-off while the provider says 429.
// The optional limits are taken per attempt, around the call only.
asio::awaitable<void> call(testing::slow_service& llm, std::string doc, std::string op,
                           sluice::semaphore* in_flight, sluice::rate_limiter* rpm, double scale) {
  const auto backoff = std::chrono::duration_cast<sluice::clock::duration>(10s * scale);
  for (;;) {
    std::optional<sluice::semaphore::permit> permit;
    if (in_flight) permit = co_await in_flight->scoped_acquire();
    if (rpm) co_await rpm->acquire();
    bool throttled = false;
    try {
      co_await llm.call(doc, op);
    } catch (const testing::throttled_error&) {
      throttled = true;
    }
    if (!throttled) co_return;
    permit.reset();
    co_await sluice::sleep(backoff);
  }
}

asio::awaitable<void> assess_document(testing::slow_service& llm, int i, sluice::semaphore* sem,
                                      sluice::rate_limiter* rpm, double scale) {
  const std::string doc = "doc-" + std::to_string(i);
  for (std::string op : {"classify", "assess"}) {
    // Named: g++ 12 may destroy a co_await operand's temporaries twice.
    auto one = call(llm, doc, std::move(op), sem, rpm, scale);
    co_await std::move(one);
  }
}

// The endpoint and the client's limits for one run.
struct setup {
  setup(const asio::any_io_executor& ex, double scale)
      : llm(endpoint(scale)),
        sem(ex, 4),
        // In real time the client's clock and the provider's see a request a
        // few microseconds apart; a 1% margin on the window absorbs that.
        // Virtual time is exact: no margin.
        rpm(ex, 60,
            std::chrono::duration_cast<sluice::clock::duration>(1min * scale *
                                                                (scale == 1.0 ? 1.0 : 1.01))) {}
  testing::slow_service llm;
  sluice::semaphore sem;
  sluice::rate_limiter rpm;
};

asio::awaitable<result> batch(mode m, double scale) {
  auto ex = co_await asio::this_coro::executor;
  // On the heap: a coroutine frame holding all of it trips g++ 12's
  // -Wmismatched-new-delete under the sanitizers (a false positive).
  auto run = std::make_unique<setup>(ex, scale);
  sluice::semaphore* s = m == mode::unbounded ? nullptr : &run->sem;
  sluice::rate_limiter* r = m == mode::semaphore_and_rate ? &run->rpm : nullptr;

  const auto t0 = sluice::now(ex);
  std::vector<asio::awaitable<void>> work;
  for (int i = 0; i < documents; ++i) work.push_back(assess_document(run->llm, i, s, r, scale));
  co_await sluice::gather(std::move(work));
  const double elapsed = std::chrono::duration<double>(sluice::now(ex) - t0).count() / scale;
  co_return result{run->llm.calls(), run->llm.throttles(), run->llm.max_in_flight(), elapsed};
}

template <class Run>
int run_all(Run run) {
  std::printf(
      "%d documents x (classify 0.5-1.5 s + assess 2-8 s); provider: 60 RPM, 4 in flight\n\n",
      documents);
  std::printf("%-30s %8s %10s %14s %10s\n", "run", "calls", "throttles", "max in flight",
              "makespan");
  const struct {
    const char* name;
    mode m;
  } runs[] = {{"unbounded (gather everything)", mode::unbounded},
              {"semaphore{4}", mode::semaphore_only},
              {"semaphore{4} + rate_limiter", mode::semaphore_and_rate}};
  int status = 0;
  for (const auto& r : runs) {
    const result x = run(r.m);
    std::printf("%-30s %8zu %10zu %14zu %9.1fs\n", r.name, x.calls, x.throttles, x.max_in_flight,
                x.makespan_s);
    if (r.m == mode::semaphore_and_rate && x.throttles != 0) status = 1;  // the point of it
  }
  std::printf(
      "\nEvery 429 is a retry after 10 s. rate_limiter{60, 1min} keeps every 60-second window\n"
      "(however aligned) at 60 starts or fewer, the rule the provider enforces.\n");
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const bool virtual_time = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  try {
    if (virtual_time) {
      std::printf("[virtual time]\n");
      return run_all([](mode m) {
        testing::virtual_loop loop;
        return loop.run(batch(m, 1.0));
      });
    }
    std::printf("[real time, 1 simulated second = 10 ms]\n");
    return run_all([](mode m) {
      asio::io_context ctx;
      result out;
      asio::co_spawn(ctx, batch(m, 0.01), [&](std::exception_ptr e, result v) {
        if (e) std::rethrow_exception(e);
        out = v;
      });
      ctx.run();
      return out;
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llm_batch: %s\n", e.what());
    return 1;
  }
}
