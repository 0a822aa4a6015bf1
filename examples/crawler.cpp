// SPDX-License-Identifier: BSL-1.0
// Crawler: four worker threads, each running its own io_context, crawl four
// sections of a simulated site. Each thread crawls with
// sluice::task_group::run(8, ...): pages are spawned as their links are
// discovered, at most 8 at a time per thread. One sluice::shared_semaphore{8},
// shared by the four threads, caps the requests in flight for the whole
// process at 8 (four per-loop semaphores of 8 would allow 32). Each page is
// "parsed" on a thread pool through sluice::to_thread, and the crawl resumes
// on its own thread.
//
// Part two, per-host politeness (virtual time): a site graph of 52 hosts of
// very different sizes, crawled 8 at a time and at most 2 per host, by
// sluice::map_unordered over the crawl's frontier with sluice::by_key(host,
// 2, {.order = most_waiting}): a slot goes to a page of the host with the
// most pages buffered, so the largest host is kept busy and does not make
// the tail (99% of the ideal schedule; 86% with the default order, the
// oldest page whose host has room). Beside it the same crawl without keys, a
// keyed_semaphore per host taken inside the task (a task waiting for its
// host holds one of the 8 slots: head-of-line blocking): 60%. And the crawl
// as a sluice::keyed_task_group<int>(8, 2): each page spawns its links under
// their host, no frontier.
//
//   crawler             real time: 4 threads, a 2-thread parse pool, latencies scaled 1/10
//   crawler --virtual   one thread on a virtual-time loop (exact, instant): the four sections
//                       run as four groups on that loop and "parse" on it too; then part two
//   crawler --hosts     part two only

#include <sluice/shared_semaphore.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/to_thread.hpp>

#include <sluice/asio.hpp>

#include "support/crawl_scenario.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
namespace testing = sluice::testing;

namespace {

constexpr int sections = 4;
constexpr int pages_per_section = 60;
constexpr std::size_t group_limit = 8;
constexpr std::size_t process_cap = 8;

// The links on page `id` of a section: 3id+1 .. 3id+3 while they exist. The
// "parse" burns a little CPU, as a real HTML parser would.
std::vector<int> parse(int id) {
  std::uint64_t h = static_cast<std::uint64_t>(id);
  for (int i = 0; i < 20000; ++i) h = h * 6364136223846793005ULL + 1442695040888963407ULL;
  std::vector<int> links;
  for (int k = 1; k <= 3; ++k)
    if (3 * id + k < pages_per_section) links.push_back(3 * id + k);
  if (h == 42) links.clear();  // keeps the loop from being optimised away
  return links;
}

struct process_stats {
  std::atomic<int> in_flight{0};
  std::atomic<int> max_in_flight{0};
  std::atomic<int> pages{0};
  void enter() {
    const int now = ++in_flight;
    int m = max_in_flight.load();
    while (now > m && !max_in_flight.compare_exchange_weak(m, now)) {
    }
  }
};

// One worker thread's section: its own simulated site (slow_service is
// loop-affine), its own counters.
struct section {
  int index = 0;
  testing::slow_service site;
  int in_flight = 0;
  int max_in_flight = 0;
  int pages = 0;
  explicit section(int i, double scale)
      : index(i),
        site({.latency = testing::latency::uniform(100ms, 300ms, static_cast<std::uint64_t>(i) + 1),
              .time_scale = scale}) {}
};

struct crawl {
  sluice::shared_semaphore& cap;
  process_stats& stats;
  asio::any_io_executor parse_ex;
};

// Fetches one page (holding a process-wide permit only while the request is
// in flight), parses it on the pool, and spawns the pages it links to.
asio::awaitable<void> fetch_page(crawl& c, section& s, sluice::task_group& g, int id) {
  {
    auto permit = co_await c.cap.scoped_acquire();
    c.stats.enter();
    s.max_in_flight = std::max(s.max_in_flight, ++s.in_flight);
    co_await s.site.call("s" + std::to_string(s.index) + "/page" + std::to_string(id));
    --s.in_flight;
    --c.stats.in_flight;
  }
  auto links = co_await sluice::to_thread(c.parse_ex, [id] { return parse(id); });
  ++s.pages;
  ++c.stats.pages;
  for (int link : links) g.spawn(fetch_page(c, s, g, link));
}

asio::awaitable<void> crawl_section(crawl& c, section& s) {
  co_await sluice::task_group::run(group_limit,
                                   [&](sluice::task_group& g) -> asio::awaitable<void> {
                                     g.spawn(fetch_page(c, s, g, 0));
                                     co_return;
                                   });
}

// The sum of all request latencies over the cap: no schedule can beat it.
double lower_bound_s(const std::vector<std::unique_ptr<section>>& all) {
  std::chrono::nanoseconds busy{0};
  for (auto& s : all)
    for (auto& r : s->site.timeline()) busy += r.end - r.start;
  return std::chrono::duration<double>(busy).count() / static_cast<double>(process_cap);
}

// ---- part two: per-host limits (the scenario: support/crawl_scenario.hpp) --

bool run_host_crawl() {
  namespace crawl = sluice_examples::crawl;
  const int total = crawl::total_pages();
  const auto busiest = crawl::run(crawl::mode::most_waiting);
  const auto oldest = crawl::run(crawl::mode::oldest);
  const auto plain = crawl::run(crawl::mode::keyed_semaphore);
  const auto group = crawl::run(crawl::mode::group);
  const double ideal = crawl::ideal_makespan_s();
  const double bound = crawl::lower_bound_s();
  std::printf(
      "\nper-host limits: %d pages on %zu hosts (%d to 7 pages each), %zu at once, "
      "%zu per host\n(virtual time, latencies 100-300 ms)\n\n",
      total, crawl::host_sizes().size(), crawl::host_sizes().front(), crawl::limit,
      crawl::per_host);
  std::printf("%-40s %6s %10s %9s %9s %14s\n", "", "pages", "makespan", "pages/s", "of ideal",
              "waiting (max)");
  auto row = [&](const char* name, const crawl::result& r) {
    std::printf("%-40s %6d %9.3fs %9.1f %8.0f%% %14zu\n", name, r.pages, r.makespan_s(),
                r.pages / r.makespan_s(), 100 * ideal / r.makespan_s(), r.max_waiting);
  };
  std::printf("%-40s %6d %9.3fs %9.1f %8.0f%% %14s\n", "lower bound (work / slots)", total, bound,
              total / bound, 100 * ideal / bound, "-");
  std::printf("%-40s %6d %9.3fs %9.1f %9s %14s\n", "ideal (clairvoyant schedule)", total, ideal,
              total / ideal, "100%", "-");
  row("by_key(host, 2), most_waiting", busiest);
  row("by_key(host, 2), oldest", oldest);
  row("keyed_task_group(8, 2), most_waiting", group);
  row("no keys: keyed_semaphore in the task", plain);
  std::printf(
      "\nmax in flight, by row: %zu, %zu, %zu, %zu (limit %zu); per host: %zu, %zu, %zu, %zu "
      "(limit %zu); by_key buffer %zu\n",
      busiest.max_in_flight, oldest.max_in_flight, group.max_in_flight, plain.max_in_flight,
      crawl::limit, busiest.max_per_host, oldest.max_per_host, group.max_per_host,
      plain.max_per_host, crawl::per_host, crawl::buffer);
  bool ok = true;
  for (const auto* r : {&busiest, &oldest})
    ok = ok && r->pages == total && r->max_in_flight <= crawl::limit &&
         r->max_per_host <= crawl::per_host && r->max_waiting <= crawl::buffer;
  ok = ok && group.pages == total && group.max_in_flight <= crawl::limit &&
       group.max_per_host <= crawl::per_host && group.makespan_s() <= ideal / 0.90;
  return ok && plain.pages == total && busiest.makespan_s() <= ideal / 0.90 &&
         oldest.makespan_s() <= ideal / 0.85 && plain.makespan_s() > 1.3 * oldest.makespan_s();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--hosts") == 0) return run_host_crawl() ? 0 : 1;
  const bool virtual_time = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  const double scale = virtual_time ? 1.0 : 0.1;
  sluice::shared_semaphore cap{process_cap};
  process_stats stats;
  std::vector<std::unique_ptr<section>> all;
  for (int i = 0; i < sections; ++i) all.push_back(std::make_unique<section>(i, scale));

  double makespan_s = 0;
  if (virtual_time) {
    testing::virtual_loop loop;
    crawl c{cap, stats, loop.get_executor()};  // "parse" on the loop itself: deterministic
    loop.run([&]() -> asio::awaitable<void> {
      co_await sluice::task_group::run([&](sluice::task_group& g) -> asio::awaitable<void> {
        for (auto& s : all) g.spawn(crawl_section(c, *s));
        co_return;
      });
    });
    makespan_s = std::chrono::duration<double>(loop.now()).count();
  } else {
    asio::thread_pool pool(2);
    crawl c{cap, stats, pool.get_executor()};
    std::vector<asio::io_context> loops(sections);
    std::vector<std::thread> threads;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < sections; ++i) {
      auto& ctx = loops[static_cast<std::size_t>(i)];
      auto& s = *all[static_cast<std::size_t>(i)];
      asio::co_spawn(ctx, crawl_section(c, s), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
      threads.emplace_back([&ctx] { ctx.run(); });
    }
    for (auto& t : threads) t.join();
    makespan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    pool.join();
  }

  std::printf("crawler: %d sections, task_group::run(%zu, ...) each, one shared_semaphore{%zu}\n",
              sections, group_limit, process_cap);
  std::printf("(%s)\n\n", virtual_time ? "one thread, virtual time, latencies 100-300 ms"
                                       : "4 worker threads + 2 parse threads, real time, "
                                         "latencies 100-300 ms scaled to 10-30 ms");
  std::printf("pages crawled:            %d of %d\n", stats.pages.load(),
              sections * pages_per_section);
  std::printf("max in flight per section:");
  for (auto& s : all) std::printf(" %d", s->max_in_flight);
  std::printf("   (each group alone would allow %zu)\n", group_limit);
  std::printf("max in flight, process:   %d   (cap %zu; %zu without the shared cap)\n",
              stats.max_in_flight.load(), process_cap, group_limit * sections);
  const double bound = lower_bound_s(all);
  std::printf("makespan:                 %.3f s   (lower bound at %zu in flight: %.3f s, %.2fx)\n",
              makespan_s, process_cap, bound, makespan_s / bound);
  const bool ok = stats.pages.load() == sections * pages_per_section &&
                  stats.max_in_flight.load() <= static_cast<int>(process_cap) &&
                  cap.value() == process_cap;
  const bool hosts_ok = !virtual_time || run_host_crawl();
  return ok && hosts_ok ? 0 : 1;
}
