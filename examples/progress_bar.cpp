// SPDX-License-Identifier: BSL-1.0
// A one-line progress bar for a long fan-out: the 200-call batch (calls of
// 50-500 ms, seeded) against a simulated slow service, 8 at a time, with
// sluice::progress reporting at most every 200 ms.
//
// On a terminal the line is rewritten in place (\r); when stdout is not a
// terminal (a pipe, a CI log) each report is a plain line of its own.
//
//   progress_bar             real time, scaled by 1/2 (about 3.5 s)
//   progress_bar --virtual   virtual time (exact, instantaneous): the report
//                            instants are the same on every run

#include <sluice/gather.hpp>
#include <sluice/progress.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <sluice/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <unistd.h>

using namespace std::chrono_literals;
namespace testing = sluice::testing;

namespace {

constexpr std::size_t calls = 200;
constexpr std::size_t limit = 8;

// Renders one report: [#########.........]  93/200  47%  8 in flight  0 failed  1.6 s
class bar {
 public:
  explicit bar(bool tty) : tty_(tty) {}

  void operator()(const sluice::progress_info& p) {
    const std::size_t total = p.total.value_or(0);
    const std::size_t width = 30;
    const std::size_t filled = total ? p.finished() * width / total : 0;
    std::string line = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
    std::printf("%s%s %3zu/%zu %3zu%%  %zu in flight  %zu failed  %.1f s%s", tty_ ? "\r" : "",
                line.c_str(), p.finished(), total, total ? p.finished() * 100 / total : 0,
                p.in_flight, p.failed, std::chrono::duration<double>(p.elapsed).count(),
                tty_ ? "" : "\n");
    std::fflush(stdout);
  }

  // After the last report: end the rewritten line.
  void done() const {
    if (tty_) std::printf("\n");
  }

 private:
  bool tty_;
};

asio::awaitable<void> batch(double scale, bool tty) {
  testing::slow_service service(
      {.latency = testing::latency::uniform(50ms, 500ms, 11), .time_scale = scale});
  std::vector<asio::awaitable<void>> work;
  for (std::size_t i = 0; i < calls; ++i) work.push_back(service.call("", "fetch"));
  bar b(tty);
  co_await sluice::gather_with_concurrency(
      limit, std::move(work),
      sluice::progress([&b](const sluice::progress_info& p) { b(p); }, 200ms));
  b.done();
  std::printf("%zu calls, at most %zu in flight\n", service.completed(), service.max_in_flight());
}

}  // namespace

int main(int argc, char** argv) {
  const bool virtual_time = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  try {
    if (virtual_time) {
      std::printf("[virtual time: 200 calls of 50-500 ms, 8 at a time]\n");
      testing::virtual_loop loop;
      loop.run(batch(1.0, tty));
      return 0;
    }
    std::printf("[real time, scaled by 1/2: 200 calls of 25-250 ms, 8 at a time]\n");
    asio::io_context ctx;
    asio::co_spawn(ctx, batch(0.5, tty), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
    ctx.run();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "progress_bar: %s\n", e.what());
    return 1;
  }
}
