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
// Part two, per-host politeness (virtual time): a site graph of 40 hosts of
// very different sizes, crawled 8 at a time and at most 2 per host, by
// sluice::map_unordered over the crawl's frontier with sluice::by_key(host,
// 2): a slot goes to the oldest discovered page whose host has room. Beside
// it the same crawl without keys, a keyed_semaphore per host taken inside the
// task (a task waiting for its host holds one of the 8 slots: head-of-line
// blocking), and the ideal schedule's rate. With the frontier's FIFO order
// the keyed crawl reaches 86% of the ideal (the largest host's pages come
// last and make the tail), without keys 60%.
//
//   crawler             real time: 4 threads, a 2-thread parse pool, latencies scaled 1/10
//   crawler --virtual   one thread on a virtual-time loop (exact, instant): the four sections
//                       run as four groups on that loop and "parse" on it too; then part two
//   crawler --hosts     part two only

#include <sluice/by_key.hpp>
#include <sluice/event.hpp>
#include <sluice/for_each.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>
#include <sluice/to_thread.hpp>

#include <sluice/asio.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
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

// ---- part two: per-host limits --------------------------------------------

constexpr std::size_t crawl_limit = 8;    // pages fetched at once
constexpr std::size_t per_host = 2;       // of one host at once (politeness)
constexpr std::size_t crawl_buffer = 64;  // discovered pages waiting for their host

// Pages per host: one large site, a few middle ones, many small ones.
std::vector<int> host_sizes() {
  std::vector<int> sizes{120, 90, 60, 60};
  for (int i = 0; i < 8; ++i) sizes.push_back(30);
  for (int i = 0; i < 40; ++i) sizes.push_back(7);
  return sizes;
}

// Each page's fetch takes 100-300 ms, a function of the page (FNV-1a of its
// name), the same whatever the schedule.
std::chrono::nanoseconds page_latency(std::string_view host, std::string_view index) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::string_view part : {host, std::string_view("/"), index})
    for (char c : part) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return std::chrono::milliseconds(100 + static_cast<int>(h % 201));
}

struct page {
  int host;
  int index;
};

// Page i of a host links to pages 3i+1 .. 3i+3 of that host while they exist.
std::vector<page> links_of(const page& p, const std::vector<int>& sizes) {
  std::vector<page> out;
  for (int k = 1; k <= 3; ++k)
    if (3 * p.index + k < sizes[static_cast<std::size_t>(p.host)])
      out.push_back({p.host, 3 * p.index + k});
  return out;
}

std::string host_name(int h) {
  return "host" + std::to_string(h);
}

// The crawl's to-do list, an async source for map_unordered: next() yields
// the oldest page discovered and not yet handed out; it waits while pages
// are being fetched (they may discover more), and ends when nothing is left.
struct frontier {
  std::deque<page> todo;
  std::size_t outstanding = 0;  // handed out, not yet fetched
  sluice::event changed;

  asio::awaitable<std::optional<page>> next() {
    for (;;) {
      if (!todo.empty()) {
        page p = todo.front();
        todo.pop_front();
        ++outstanding;
        co_return p;
      }
      if (outstanding == 0) co_return std::nullopt;
      changed.clear();
      co_await changed.wait();
    }
  }
  void fetched(const std::vector<page>& found) {
    for (auto& p : found) todo.push_back(p);
    --outstanding;
    changed.set();
  }
};

// The schedule of a crawler that knows the whole site in advance: pages
// still start only once their parent was fetched, 8 at once, 2 per host,
// but each free slot goes to the host with the most work left (longest
// remaining work first). No online crawler knows that much: the ideal.
double clairvoyant_makespan_s() {
  const std::vector<int> sizes = host_sizes();
  const std::size_t hosts = sizes.size();
  std::vector<double> left(hosts, 0.0);  // work not yet started, per host
  auto lat = [](const page& p) {
    return std::chrono::duration<double>(page_latency(host_name(p.host), std::to_string(p.index)))
        .count();
  };
  std::vector<std::deque<page>> ready(hosts);
  std::vector<std::size_t> busy(hosts, 0);
  for (int h = 0; h < static_cast<int>(hosts); ++h) {
    for (int i = 0; i < sizes[static_cast<std::size_t>(h)]; ++i) left[h] += lat({h, i});
    ready[static_cast<std::size_t>(h)].push_back({h, 0});
  }
  std::multimap<double, page> running;  // by end time
  double now = 0;
  for (;;) {
    while (running.size() < crawl_limit) {
      int best = -1;
      for (int h = 0; h < static_cast<int>(hosts); ++h)
        if (busy[h] < per_host && !ready[h].empty() && (best < 0 || left[h] > left[best])) best = h;
      if (best < 0) break;
      page p = ready[best].front();
      ready[best].pop_front();
      ++busy[best];
      left[best] -= lat(p);
      running.emplace(now + lat(p), p);
    }
    if (running.empty()) return now;
    auto done = running.begin();
    now = done->first;
    const page p = done->second;
    running.erase(done);
    --busy[static_cast<std::size_t>(p.host)];
    for (auto& l : links_of(p, sizes)) ready[static_cast<std::size_t>(l.host)].push_back(l);
  }
}

struct host_crawl_result {
  int pages = 0;
  double makespan_s = 0;
  std::size_t max_in_flight = 0, max_per_host = 0, max_waiting = 0;
};

// keyed: by_key(host, 2); else a keyed_semaphore per host inside the task.
host_crawl_result crawl_hosts(bool keyed) {
  const std::vector<int> sizes = host_sizes();
  testing::slow_service site({.latency = testing::latency::from([](const testing::call_info& c) {
                                return page_latency(c.key, c.op);
                              })});
  testing::virtual_loop loop;
  frontier f;
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h) f.todo.push_back({h, 0});
  sluice::keyed_semaphore<std::string> host_permits{per_host};
  host_crawl_result r;
  std::size_t running = 0;
  auto fetch = [&](page p) -> asio::awaitable<int> {
    std::optional<sluice::keyed_semaphore<std::string>::permit> permit;
    if (!keyed) permit = co_await host_permits.scoped_acquire(host_name(p.host));
    // Handed out by the frontier and not started: waiting for a host.
    r.max_waiting = std::max(r.max_waiting, f.outstanding - ++running);
    co_await site.call(host_name(p.host), std::to_string(p.index));
    --running;
    permit.reset();
    f.fetched(links_of(p, sizes));
    co_return 1;
  };
  loop.run([&]() -> asio::awaitable<void> {
    auto count = [&](int n) {
      r.pages += n;
    };
    if (keyed) {
      auto host_of = [](const page& p) {
        return p.host;
      };
      co_await sluice::for_each(
          sluice::map_unordered(fetch, f, crawl_limit,
                                sluice::by_key(host_of, per_host, {.buffer = crawl_buffer})),
          count);
    } else {
      co_await sluice::for_each(sluice::map_unordered(fetch, f, crawl_limit), count);
    }
  });
  r.makespan_s = std::chrono::duration<double>(loop.now()).count();
  r.max_in_flight = site.max_in_flight();
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h)
    r.max_per_host = std::max(r.max_per_host, site.max_in_flight(host_name(h)));
  return r;
}

// No schedule beats all the work over 8 slots, nor the busiest host's work
// over its 2.
double lower_bound_makespan_s() {
  const std::vector<int> sizes = host_sizes();
  double total = 0, busiest = 0;
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h) {
    double host = 0;
    for (int i = 0; i < sizes[static_cast<std::size_t>(h)]; ++i)
      host += std::chrono::duration<double>(page_latency(host_name(h), std::to_string(i))).count();
    total += host;
    busiest = std::max(busiest, host);
  }
  return std::max(total / crawl_limit, busiest / per_host);
}

bool run_host_crawl() {
  const int total = [] {
    int n = 0;
    for (int s : host_sizes()) n += s;
    return n;
  }();
  const auto keyed = crawl_hosts(true);
  const auto plain = crawl_hosts(false);
  const double ideal = clairvoyant_makespan_s();
  const double bound = lower_bound_makespan_s();
  std::printf(
      "\nper-host limits: %d pages on %zu hosts (%d to 7 pages each), %zu at once, "
      "%zu per host\n(virtual time, latencies 100-300 ms)\n\n",
      total, host_sizes().size(), host_sizes().front(), crawl_limit, per_host);
  std::printf("%-34s %8s %10s %9s %12s %14s\n", "", "pages", "makespan", "pages/s", "of ideal",
              "waiting (max)");
  auto row = [&](const char* name, const host_crawl_result& r) {
    std::printf("%-34s %8d %9.2fs %9.1f %11.0f%% %14zu\n", name, r.pages, r.makespan_s,
                r.pages / r.makespan_s, 100 * ideal / r.makespan_s, r.max_waiting);
  };
  std::printf("%-34s %8d %9.2fs %9.1f %11.0f%% %14s\n", "lower bound (work / slots)", total, bound,
              total / bound, 100 * ideal / bound, "-");
  std::printf("%-34s %8d %9.2fs %9.1f %11s %14s\n", "ideal (clairvoyant schedule)", total, ideal,
              total / ideal, "100%", "-");
  row("map_unordered + by_key(host, 2)", keyed);
  row("map_unordered + keyed_semaphore", plain);
  std::printf(
      "\nmax in flight: %zu and %zu (limit %zu); per host: %zu and %zu (limit %zu); "
      "by_key buffer %zu\n",
      keyed.max_in_flight, plain.max_in_flight, crawl_limit, keyed.max_per_host, plain.max_per_host,
      per_host, crawl_buffer);
  return keyed.pages == total && plain.pages == total && keyed.max_in_flight <= crawl_limit &&
         keyed.max_per_host <= per_host && keyed.max_waiting <= crawl_buffer &&
         keyed.makespan_s <= ideal / 0.85 && plain.makespan_s > 1.3 * keyed.makespan_s;
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
