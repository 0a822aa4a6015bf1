// SPDX-License-Identifier: BSL-1.0
// The C++ side of `make bench-peers` (benchmarks/peers.py): the same four
// workloads as the Go, Rust, asyncio and Trio programs beside it, with the
// same command line and the same one-line JSON answer.
//
//   sluice_peer <impl> <workload> <kind> <n> [unsafe|default]
//     impl      sluice | floor   (floor: the Asio lower bound of the workload)
//               | sluice_next (stream only: read by `while (auto r = co_await s.next())`)
//     workload  fanout   bounded fan-out, limit 100, lazy input:
//                        sluice: gather_with_concurrency(100, lazy range of task(i))
//                        floor:  for (i) sum += co_await task(i)
//               stream   streaming unordered, limit 64:
//                        sluice: for_each(map_unordered(task, iota(n), 64), body)
//                        floor:  the same lazy loop
//               handoff  two coroutines ping-pong through two semaphores of 0
//                        (n hand-offs in all):
//                        sluice: sluice::semaphore release() / co_await acquire()
//                        floor:  one asio::post round trip per hand-off
//     kind      immediate (task(i) completes at once) | suspending (one post first)
//     n         tasks (fanout, stream) or hand-offs (handoff)
//     unsafe    run on io_context{ASIO_CONCURRENCY_HINT_UNSAFE} (no scheduler locking)
//     default   run on io_context{} (the default hint, what most programs use:
//               a post takes the scheduler's lock; the others run on
//               io_context{1}, where a post from the loop's thread does not)
//
// Prints {"ns": CPU ns per task or per hand-off, "sum": ..., "handoffs": ...}:
// task(i) returns i + 1, so fanout and stream sum to n(n+1)/2; handoff's sum
// is the number of acquisitions completed (n) and `handoffs` the releases that
// found the other side suspended in acquire (a real hand-off to a waiter).
// The driver checks both; `rss_kib` is the process's peak RSS (VmHWM).

#include "../bench_common.hpp"

#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/semaphore.hpp>

#include <time.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

namespace {

using sluice_bench::kind;

std::int64_t cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

class iota_input {
 public:
  class iterator {
   public:
    using value_type = std::int64_t;
    using difference_type = std::ptrdiff_t;
    iterator() = default;
    explicit iterator(std::int64_t v) : v_(v) {}
    std::int64_t operator*() const { return v_; }
    iterator& operator++() {
      ++v_;
      return *this;
    }
    iterator operator++(int) {
      auto old = *this;
      ++v_;
      return old;
    }
    bool operator==(const iterator&) const = default;

   private:
    std::int64_t v_ = 0;
  };
  explicit iota_input(std::int64_t n) : n_(n) {}
  iterator begin() const { return iterator(0); }
  iterator end() const { return iterator(n_); }

 private:
  std::int64_t n_;
};

// sluice_next: the stream read by `while (auto r = co_await s.next())`.
bool next_loop = false;

struct result {
  std::int64_t sum = 0;
  std::int64_t handoffs = 0;
};

template <kind K>
asio::awaitable<void> fanout(bool sluice_impl, std::int64_t n, result& r) {
  if (sluice_impl) {
    auto v = co_await sluice::gather_with_concurrency(
        100, sluice_bench::lazy_tasks<K>(static_cast<std::size_t>(n)));
    for (int x : v) r.sum += x;
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      r.sum += co_await sluice_bench::task<K>(static_cast<int>(i));
  }
}

template <kind K>
asio::awaitable<void> stream(bool sluice_impl, std::int64_t n, result& r) {
  if (sluice_impl && next_loop) {
    auto s = sluice::map_unordered(
        [](std::int64_t i) { return sluice_bench::task<K>(static_cast<int>(i)); }, iota_input(n),
        64);
    while (auto x = co_await s.next()) r.sum += *x;
  } else if (sluice_impl) {
    co_await sluice::for_each(
        sluice::map_unordered(
            [](std::int64_t i) { return sluice_bench::task<K>(static_cast<int>(i)); },
            iota_input(n), 64),
        [&](int x) { r.sum += x; });
  } else {
    for (std::int64_t i = 0; i < n; ++i)
      r.sum += co_await sluice_bench::task<K>(static_cast<int>(i));
  }
}

// handoff: each side acquires its own semaphore, counts, releases the
// other's. `waiting` says whether a release finds the other side suspended.
struct side {
  sluice::semaphore sem{0};
  bool waiting = false;
};

asio::awaitable<void> player(std::shared_ptr<std::array<side, 2>> sides, int me, std::int64_t n,
                             result& r) {
  auto& s = *sides;
  for (;;) {
    s[me].waiting = true;
    co_await s[me].sem.acquire();
    s[me].waiting = false;
    if (r.sum >= n) {
      s[1 - me].sem.release();  // let the other side see the end
      co_return;
    }
    ++r.sum;
    if (s[1 - me].waiting) ++r.handoffs;
    s[1 - me].sem.release();
  }
}

void handoff(asio::io_context& ctx, bool sluice_impl, std::int64_t n, result& r) {
  if (!sluice_impl) {
    asio::co_spawn(
        ctx,
        [&]() -> asio::awaitable<void> {
          auto ex = co_await asio::this_coro::executor;
          for (std::int64_t i = 0; i < n; ++i) {
            co_await asio::post(ex, asio::use_awaitable);
            ++r.sum;
            ++r.handoffs;
          }
        },
        sluice_bench::rethrow);
    return;
  }
  auto sides = std::make_shared<std::array<side, 2>>();
  asio::co_spawn(ctx, player(sides, 0, n, r), sluice_bench::rethrow);
  asio::co_spawn(ctx, player(sides, 1, n, r), sluice_bench::rethrow);
  asio::post(ctx, [sides] { (*sides)[0].sem.release(); });
}

// The process's peak resident set (VmHWM, KiB): its own, unlike the
// parent's wait4 ru_maxrss, which keeps the forking parent's peak across exec.
long peak_rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
  std::fclose(f);
  return kib;
}

[[noreturn]] void usage() {
  std::fputs(
      "usage: sluice_peer sluice|sluice_next|floor fanout|stream|handoff immediate|suspending N "
      "[unsafe|default]\n",
      stderr);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 5) usage();
  const std::string impl = argv[1], workload = argv[2], k = argv[3];
  const std::int64_t n = std::atoll(argv[4]);
  const bool unsafe = argc > 5 && std::strcmp(argv[5], "unsafe") == 0;
  const bool any_hint = argc > 5 && std::strcmp(argv[5], "default") == 0;
  if (impl == "sluice_next") next_loop = true;
  if ((impl != "sluice" && impl != "floor" && !next_loop) ||
      (k != "immediate" && k != "suspending") || n <= 0)
    usage();
  const bool s = impl != "floor", susp = k == "suspending";
#if defined(SLUICE_USE_BOOST_ASIO)
  const int hint = unsafe     ? BOOST_ASIO_CONCURRENCY_HINT_UNSAFE
                   : any_hint ? BOOST_ASIO_CONCURRENCY_HINT_DEFAULT
                              : 1;
#else
  const int hint = unsafe     ? ASIO_CONCURRENCY_HINT_UNSAFE
                   : any_hint ? ASIO_CONCURRENCY_HINT_DEFAULT
                              : 1;
#endif
  asio::io_context ctx(hint);
  result r;
  const auto t0 = cpu_ns();
  if (workload == "fanout") {
    asio::co_spawn(ctx, susp ? fanout<kind::suspending>(s, n, r) : fanout<kind::immediate>(s, n, r),
                   sluice_bench::rethrow);
  } else if (workload == "stream") {
    asio::co_spawn(ctx, susp ? stream<kind::suspending>(s, n, r) : stream<kind::immediate>(s, n, r),
                   sluice_bench::rethrow);
  } else if (workload == "handoff") {
    handoff(ctx, s, n, r);
  } else {
    usage();
  }
  ctx.run();
  const auto t1 = cpu_ns();
  std::printf("{\"ns\": %.3f, \"sum\": %lld, \"handoffs\": %lld, \"rss_kib\": %ld}\n",
              static_cast<double>(t1 - t0) / static_cast<double>(n), static_cast<long long>(r.sum),
              static_cast<long long>(r.handoffs), peak_rss_kib());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "sluice_peer: %s\n", e.what());
  return 1;
}
