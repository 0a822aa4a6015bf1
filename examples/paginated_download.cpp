// SPDX-License-Identifier: BSL-1.0
// Download every object of a bucket whose keys come from a paginated listing
// API, 5 downloads at a time, processing each one as it arrives.
//
// The listing is an asynchronous source (one page per call, 10 keys a page),
// so map_unordered starts downloading the first page's keys while the later
// pages are still being listed, and never asks the listing for two pages at
// once. Both services are simulated (sluice::testing::slow_service).
//
//   paginated_download            real time (about 6 s)
//   paginated_download --virtual  the same in virtual time: instant, exact
#include <sluice/for_each.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <sluice/asio.hpp>

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

using namespace std::chrono_literals;
namespace testing = sluice::testing;

namespace {

constexpr std::size_t pages = 6;
constexpr std::size_t keys_per_page = 10;
constexpr std::size_t limit = 5;

struct listing_progress {
  std::size_t pages_listed = 0;
  bool finished = false;
};

// The paginated listing as an async source: next() yields one key, calling the
// API for the next page when the current one is used up.
class bucket_listing {
 public:
  bucket_listing(testing::slow_service& api, listing_progress& progress)
      : api_(&api), progress_(&progress) {}

  asio::awaitable<std::optional<std::string>> next() {
    if (keys_.empty() && progress_->pages_listed < pages) {
      const std::size_t page = progress_->pages_listed;
      co_await api_->call("bucket", "list page " + std::to_string(page));
      for (std::size_t i = 0; i < keys_per_page; ++i)
        keys_.push_back("logs/" + std::to_string(page) + "/" + std::to_string(i) + ".gz");
      ++progress_->pages_listed;
    }
    if (keys_.empty()) {
      progress_->finished = true;
      co_return std::nullopt;
    }
    std::string key = std::move(keys_.front());
    keys_.pop_front();
    co_return key;
  }

 private:
  testing::slow_service* api_;
  listing_progress* progress_;
  std::deque<std::string> keys_;
};

double seconds(std::chrono::nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

asio::awaitable<int> run() {
  auto ex = co_await asio::this_coro::executor;
  testing::slow_service api({.latency = testing::latency::fixed(400ms)});
  testing::slow_service storage({.latency = testing::latency::uniform(200ms, 900ms, 42)});
  listing_progress listed;
  const bool tty = isatty(fileno(stdout));
  const auto t0 = sluice::now(ex);

  auto download = [&](std::string key) -> asio::awaitable<std::size_t> {
    co_await storage.call(key, "get");
    co_return 1000 + key.size() * 37;  // "bytes"
  };

  std::size_t done = 0, bytes = 0, pages_at_first = 0;
  double first_at = 0;
  // for_each: on every way out (the end, an exception, a cancellation) every
  // download has finished before it returns, so the `[&]` lambdas above never
  // outlive this frame.
  auto downloads = sluice::map_unordered(download, bucket_listing(api, listed), limit);
  co_await sluice::for_each(std::move(downloads), [&](std::size_t n) {
    ++done;
    bytes += n;
    const double elapsed = seconds(sluice::now(ex) - t0);
    if (done == 1) {
      first_at = elapsed;
      pages_at_first = listed.pages_listed;
    }
    const std::string total = listed.finished ? std::to_string(pages * keys_per_page) : "?";
    std::printf("%sdone %3zu/%-3s  in flight %zu  pages listed %zu/%zu  elapsed %5.2f s%s",
                tty ? "\r" : "", done, total.c_str(), storage.in_flight(), listed.pages_listed,
                pages, elapsed, tty ? "" : "\n");
    std::fflush(stdout);
  });
  const double elapsed = seconds(sluice::now(ex) - t0);
  std::printf("%s%zu objects, %zu bytes in %.2f s; at most %zu downloads in flight\n",
              tty ? "\n" : "", done, bytes, elapsed, storage.max_in_flight());
  std::printf("first download finished at %.2f s, with %zu of %zu pages listed\n", first_at,
              pages_at_first, pages);

  const bool ok = done == pages * keys_per_page && storage.max_in_flight() == limit &&
                  pages_at_first < pages && api.max_in_flight() == 1;
  if (!ok) std::printf("unexpected result\n");
  co_return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool virtual_time = argc > 1 && std::string_view(argv[1]) == "--virtual";
  try {
    if (virtual_time) {
      testing::virtual_loop loop;
      return loop.run(run());
    }
    asio::io_context ctx;
    int rc = 1;
    asio::co_spawn(ctx, run(), [&](std::exception_ptr e, int r) {
      if (e) std::rethrow_exception(e);
      rc = r;
    });
    ctx.run();
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paginated_download: %s\n", e.what());
    return 1;
  }
}
