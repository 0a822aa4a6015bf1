// SPDX-License-Identifier: BSL-1.0
// Soak: 10 million operations through each of gather_with_concurrency,
// map_unordered, semaphore and queue, while a thread samples the resident set
// (/proc/self/statm) every second. A leak per operation, however small, shows
// as a rising series; sluice's should be flat. A benchmark, not a test: it
// prints the samples and the growth from the first sample to the last.
//
//   soak_bench [--ops 10000000]     (other arguments, e.g. make bench's
//                                    --benchmark_min_time, are ignored)

#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/queue.hpp>
#include <sluice/semaphore.hpp>

#include <support/asio.hpp>
#include <support/lazy_tasks.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;

namespace {

double rss_mb() {
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return static_cast<double>(pages_resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) /
         (1024.0 * 1024.0);
}

// One task: suspends once (a post), as an I/O-bound task does.
asio::awaitable<void> hop(std::atomic<std::size_t>& done) {
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  done.fetch_add(1, std::memory_order_relaxed);
}

asio::awaitable<int> hop_value(int v) {
  co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  co_return v;
}

// Runs `body` on an io_context while sampling RSS once a second.
void soak(const char* name, std::size_t ops,
          const std::function<asio::awaitable<void>(std::atomic<std::size_t>&)>& body) {
  std::atomic<std::size_t> done{0};
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  struct sample {
    double t, rss;
    std::size_t ops;
  };
  std::vector<sample> samples;
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  samples.push_back({0.0, rss_mb(), 0});
  std::thread sampler([&] {
    std::unique_lock<std::mutex> lock(m);
    while (!cv.wait_for(lock, 1s, [&] { return finished; }))
      samples.push_back({since(), rss_mb(), done.load(std::memory_order_relaxed)});
  });
  asio::io_context ctx(1);
  asio::co_spawn(ctx, body(done), [](std::exception_ptr e) {
    if (e) std::rethrow_exception(e);
  });
  ctx.run();
  {
    std::lock_guard<std::mutex> lock(m);
    finished = true;
  }
  cv.notify_one();
  sampler.join();
  samples.push_back({since(), rss_mb(), done.load()});
  std::printf("== %s: %zu operations in %.1f s\n", name, done.load(), samples.back().t);
  for (const auto& s : samples)
    std::printf("   t=%5.1f s  ops=%9zu  rss=%7.2f MB\n", s.t, s.ops, s.rss);
  const double first_running = samples.size() > 2 ? samples[1].rss : samples.front().rss;
  std::printf("   rss growth from the first sample under load to the end: %+.2f MB\n",
              samples.back().rss - first_running);
  if (done.load() != ops) {
    std::printf("   ERROR: expected %zu operations\n", ops);
    std::exit(1);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t ops = 10'000'000;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--ops") == 0) ops = std::strtoull(argv[i + 1], nullptr, 10);

  std::printf("soak: %zu operations per workload; RSS sampled every second\n", ops);

  soak("gather_with_concurrency(64) over a lazy input", ops,
       [ops](std::atomic<std::size_t>& done) -> asio::awaitable<void> {
         sluice_test::lazy_tasks<asio::awaitable<void>> tasks(
             ops, [&done](std::size_t) { return hop(done); });
         co_await sluice::gather_with_concurrency(64, tasks);
       });

  soak("map_unordered(limit 64) over a lazy input, read as completed", ops,
       [ops](std::atomic<std::size_t>& done) -> asio::awaitable<void> {
         sluice_test::lazy_tasks<int> inputs(ops,
                                             [](std::size_t i) { return static_cast<int>(i); });
         auto s = sluice::map_unordered([](int v) { return hop_value(v); }, inputs, 64);
         while (auto v = co_await s.next()) done.fetch_add(1, std::memory_order_relaxed);
       });

  soak("semaphore(4): 16 workers acquire, hop, release", ops,
       [ops](std::atomic<std::size_t>& done) -> asio::awaitable<void> {
         auto ex = co_await asio::this_coro::executor;
         sluice::semaphore sem{ex, 4};
         std::vector<asio::awaitable<void>> workers;
         for (std::size_t w = 0; w < 16; ++w) {
           workers.push_back([](sluice::semaphore& s, std::atomic<std::size_t>& d,
                                std::size_t n) -> asio::awaitable<void> {
             for (std::size_t i = 0; i < n; ++i) {
               co_await s.acquire();
               co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
               s.release();
               d.fetch_add(1, std::memory_order_relaxed);
             }
           }(sem, done, ops / 16 + (w < ops % 16 ? 1 : 0)));
         }
         co_await sluice::gather(std::move(workers));
       });

  soak("queue(64): 4 producers, 4 consumers", ops,
       [ops](std::atomic<std::size_t>& done) -> asio::awaitable<void> {
         auto ex = co_await asio::this_coro::executor;
         sluice::queue<std::size_t> q{ex, 64};
         std::vector<asio::awaitable<void>> tasks;
         for (std::size_t p = 0; p < 4; ++p) {
           tasks.push_back(
               [](sluice::queue<std::size_t>& qq, std::size_t n) -> asio::awaitable<void> {
                 for (std::size_t i = 0; i < n; ++i) co_await qq.put(i);
               }(q, ops / 4 + (p < ops % 4 ? 1 : 0)));
         }
         for (std::size_t c = 0; c < 4; ++c) {
           tasks.push_back([](sluice::queue<std::size_t>& qq, std::atomic<std::size_t>& d,
                              std::size_t n) -> asio::awaitable<void> {
             for (std::size_t i = 0; i < n; ++i) {
               (void)co_await qq.get();
               qq.task_done();
               d.fetch_add(1, std::memory_order_relaxed);
             }
           }(q, done, ops / 4 + (c < ops % 4 ? 1 : 0)));
         }
         co_await sluice::gather(std::move(tasks));
       });
  return 0;
}
