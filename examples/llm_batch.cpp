// SPDX-License-Identifier: BSL-1.0
// 300 prompts against a simulated LLM endpoint. The provider publishes 60
// requests and 40,000 tokens per minute (rolling windows); it does not
// publish its concurrency: 8 requests in flight for the first 4 minutes, 4
// while it is busy elsewhere (minutes 4 to 8), then 8 again. A request over
// any of these is answered at once with 429 and a Retry-After hint. A prompt
// of n tokens takes 5 s + 10 ms per token (7 to 31 s), longer under load.
//
// Every run retries a 429 (sluice::retry: exponential backoff with full
// jitter, the provider's hint wins, 10 attempts), side by side:
//   unbounded              every prompt at once
//   semaphore{8}           the concurrency the docs suggest, no rate limits
//   acquire_all(semaphore{8}, rpm, tpm.weighted(tokens))
//                          the published quotas and the concurrency seen at first
//   hand-tuned             acquire_all(semaphore{4}, rpm, tpm.weighted(tokens)):
//                          the bound a user settles on after watching 429s
//   adaptive               acquire_all(adaptive_limit, rpm, tpm.weighted(tokens)):
//                          the limit follows the provider; outcomes fed back
//
//   llm_batch             real time, compressed (1 simulated second = 5 ms)
//   llm_batch --virtual   virtual time (exact, instantaneous)

#include <sluice/acquire_all.hpp>
#include <sluice/adaptive_limit.hpp>
#include <sluice/gather.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/retry.hpp>
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
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace testing = sluice::testing;

namespace {

constexpr std::size_t prompts = 300;

enum class mode { unbounded, semaphore_only, tuned_8, hand_tuned, adaptive };

struct result {
  std::size_t calls = 0, throttles = 0, gave_up = 0, max_in_flight = 0;
  double makespan_s = 0;
};

std::size_t tokens_of(std::size_t i) {
  return 200 + static_cast<std::size_t>(sluice::detail::mix(i) % 2401);
}

template <class D>
sluice::clock::duration scaled(D d, double scale) {
  return std::chrono::duration_cast<sluice::clock::duration>(d * scale);
}

testing::slow_service::options endpoint(double scale) {
  return {.latency = testing::latency::from([](const testing::call_info& c) {
            return std::chrono::nanoseconds(5s) + std::chrono::milliseconds(10) * c.tokens;
          }),
          .quota = {.calls_per_window = 60, .window = 1min, .tokens_per_window = 40000},
          .capacity = {{0min, 8}, {4min, 4}, {8min, 8}},
          .load_latency = 0.25,
          .time_scale = scale};
}

// The endpoint and the client's limits for one run (on the heap: a coroutine
// frame holding all of it trips g++ 12's -Wmismatched-new-delete under the
// sanitizers, a false positive).
struct setup {
  setup(const asio::any_io_executor& ex, double scale)
      : llm(endpoint(scale)),
        eight(ex, 8),
        four(ex, 4),
        // A short batch: after a throttle, probe the level again after 50
        // successes (the default, 200, suits a long-running service).
        cap(ex, {.initial = 4, .min = 1, .max = 16, .algorithm = sluice::aimd{.hold = 50}}),
        rpm(ex, 60, scaled(1min, scale)),
        tpm(ex, 40000, scaled(1min, scale)) {}
  testing::slow_service llm;
  sluice::semaphore eight, four;
  sluice::adaptive_limit cap;
  sluice::rate_limiter rpm, tpm;
};

// One attempt of one prompt under the run's limits.
asio::awaitable<void> attempt(setup& s, mode m, std::size_t i) {
  const std::size_t tokens = tokens_of(i);
  const std::string key = "prompt-" + std::to_string(i);
  switch (m) {
    case mode::unbounded:
      co_await s.llm.call(key, "complete", tokens);
      break;
    case mode::semaphore_only: {
      auto permit = co_await s.eight.scoped_acquire();
      co_await s.llm.call(key, "complete", tokens);
      break;
    }
    case mode::tuned_8:
    case mode::hand_tuned: {
      auto& sem = m == mode::tuned_8 ? s.eight : s.four;
      auto held = co_await sluice::acquire_all(sem, s.rpm, s.tpm.weighted(tokens));
      co_await s.llm.call(key, "complete", tokens);
      break;
    }
    case mode::adaptive: {
      auto held = co_await sluice::acquire_all(s.cap, s.rpm, s.tpm.weighted(tokens));
      std::exception_ptr error;
      try {
        co_await s.llm.call(key, "complete", tokens);
      } catch (...) {
        error = std::current_exception();
      }
      auto& place = held.get<0>();
      if (!error) {
        place.succeeded();
      } else {
        if (sluice::retryable(error)) place.throttled();
        std::rethrow_exception(error);
      }
      break;
    }
  }
}

asio::awaitable<bool> prompt(setup& s, mode m, std::size_t i, double scale) {
  try {
    co_await sluice::retry({.first = scaled(1s, scale), .max = scaled(1min, scale), .attempts = 10},
                           [&s, m, i] { return attempt(s, m, i); });
    co_return true;
  } catch (const testing::throttled_error&) {
    co_return false;  // 10 attempts throttled: gave up
  }
}

asio::awaitable<result> batch(mode m, double scale) {
  auto ex = co_await asio::this_coro::executor;
  auto s = std::make_unique<setup>(ex, scale);
  const auto t0 = sluice::now(ex);
  std::vector<asio::awaitable<bool>> work;
  for (std::size_t i = 0; i < prompts; ++i) work.push_back(prompt(*s, m, i, scale));
  const auto done = co_await sluice::gather(std::move(work));
  result r{s->llm.calls(), s->llm.throttles(), 0, s->llm.max_in_flight(),
           std::chrono::duration<double>(sluice::now(ex) - t0).count() / scale};
  for (bool ok : done) r.gave_up += ok ? 0 : 1;
  co_return r;
}

template <class Run>
int run_all(Run run) {
  std::printf(
      "%zu prompts of 200-2,600 tokens; provider: 60 RPM, 40,000 TPM, 8 in flight (4 in minutes "
      "4-8)\n\n",
      prompts);
  std::printf("| run | calls | throttled (429) | gave up | max in flight | makespan |\n");
  std::printf("|---|---:|---:|---:|---:|---:|\n");
  const struct {
    const char* name;
    mode m;
  } runs[] = {{"unbounded (gather everything)", mode::unbounded},
              {"semaphore{8}", mode::semaphore_only},
              {"acquire_all(semaphore{8}, rpm, tpm)", mode::tuned_8},
              {"hand-tuned: acquire_all(semaphore{4}, rpm, tpm)", mode::hand_tuned},
              {"adaptive: acquire_all(adaptive_limit, rpm, tpm)", mode::adaptive}};
  int status = 0;
  for (const auto& r : runs) {
    const result x = run(r.m);
    std::printf("| %s | %zu | %zu | %zu | %zu | %.0f s |\n", r.name, x.calls, x.throttles,
                x.gave_up, x.max_in_flight, x.makespan_s);
    // The point of it: the budgets taken together are never throttled on
    // rate or tokens; only the unpublished concurrency can refuse a call.
    if (r.m == mode::hand_tuned && x.throttles != 0) status = 1;
    if (r.m == mode::adaptive && x.throttles * 20 > x.calls) status = 1;
    if (r.m >= mode::hand_tuned && x.gave_up != 0) status = 1;
  }
  std::printf(
      "\nEvery 429 is retried after the provider's Retry-After (sluice::retry). acquire_all takes\n"
      "the concurrency permit, a start in the RPM window and the prompt's tokens in the TPM\n"
      "window at one instant, so neither window records a start while the call waits.\n");
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
    std::printf("[real time, 1 simulated second = 5 ms]\n");
    return run_all([](mode m) {
      asio::io_context ctx;
      result out;
      asio::co_spawn(ctx, batch(m, 0.005), [&](std::exception_ptr e, result v) {
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
