// SPDX-License-Identifier: BSL-1.0
// The per-host crawl, in virtual time: 850 pages on 52 hosts of very
// different sizes (120, 90, 60, 60, 8 x 30, 40 x 7), links discovered as
// pages are fetched (page i links to 3i+1 .. 3i+3 of its host), each fetch
// 100-300 ms (a function of the page), 8 at once and at most 2 per host.
// Crawled by map_unordered over the crawl's frontier (a plain FIFO of
// discovered pages), with by_key(host, 2) in either order, or with a
// keyed_semaphore per host taken inside the task; or by a
// keyed_task_group<int>(8, 2) whose pages spawn their links; beside them the
// ideal schedule and the lower bound. Shared by tests/by_key_test.cpp and
// examples/crawler.cpp; it ships beside the examples and includes installed
// headers only.
#ifndef SLUICE_EXAMPLES_SUPPORT_CRAWL_SCENARIO_HPP
#define SLUICE_EXAMPLES_SUPPORT_CRAWL_SCENARIO_HPP

#include <sluice/asio.hpp>
#include <sluice/by_key.hpp>
#include <sluice/event.hpp>
#include <sluice/for_each.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/keyed_task_group.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace sluice_examples::crawl {

inline constexpr std::size_t limit = 8;     // pages fetched at once
inline constexpr std::size_t per_host = 2;  // of one host at once (politeness)
inline constexpr std::size_t buffer = 64;   // discovered pages waiting for their host

/// Pages per host: one large site, a few middle ones, many small ones.
inline std::vector<int> host_sizes() {
  std::vector<int> sizes{120, 90, 60, 60};
  for (int i = 0; i < 8; ++i) sizes.push_back(30);
  for (int i = 0; i < 40; ++i) sizes.push_back(7);
  return sizes;
}

inline int total_pages() {
  int n = 0;
  for (int s : host_sizes()) n += s;
  return n;
}

/// Each page's fetch takes 100-300 ms, a function of the page (FNV-1a of its
/// name), the same whatever the schedule.
inline std::chrono::nanoseconds page_latency(std::string_view host, std::string_view index) {
  std::uint64_t h = 1469598103934665603ULL;
  for (std::string_view part : {host, std::string_view("/"), index})
    for (char c : part) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return std::chrono::milliseconds(100 + static_cast<int>(h % 201));
}

struct page {
  int host;
  int index;
};

inline std::string host_name(int h) {
  return "host" + std::to_string(h);
}

inline double latency_s(const page& p) {
  return std::chrono::duration<double>(page_latency(host_name(p.host), std::to_string(p.index)))
      .count();
}

/// Page i of a host links to pages 3i+1 .. 3i+3 of that host while they exist.
inline std::vector<page> links_of(const page& p, const std::vector<int>& sizes) {
  std::vector<page> out;
  for (int k = 1; k <= 3; ++k)
    if (3 * p.index + k < sizes[static_cast<std::size_t>(p.host)])
      out.push_back({p.host, 3 * p.index + k});
  return out;
}

/// The crawl's to-do list, an async source for map_unordered: next() yields
/// the oldest page discovered and not yet handed out; it waits while pages
/// are being fetched (they may discover more), and ends when nothing is left.
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

/// The schedule of a crawler that knows the whole site in advance: pages
/// still start only once their parent was fetched, 8 at once, 2 per host,
/// but each free slot goes to the host with the most work left (longest
/// remaining work first). No online crawler knows that much: the ideal.
inline double ideal_makespan_s() {
  const std::vector<int> sizes = host_sizes();
  const std::size_t hosts = sizes.size();
  std::vector<double> left(hosts, 0.0);  // work not yet started, per host
  std::vector<std::deque<page>> ready(hosts);
  std::vector<std::size_t> busy(hosts, 0);
  for (std::size_t h = 0; h < hosts; ++h) {
    for (int i = 0; i < sizes[h]; ++i) left[h] += latency_s({static_cast<int>(h), i});
    ready[h].push_back({static_cast<int>(h), 0});
  }
  std::multimap<double, page> running;  // by end time
  double now = 0;
  for (;;) {
    while (running.size() < limit) {
      std::size_t best = hosts;
      for (std::size_t h = 0; h < hosts; ++h)
        if (busy[h] < per_host && !ready[h].empty() && (best == hosts || left[h] > left[best]))
          best = h;
      if (best == hosts) break;
      page p = ready[best].front();
      ready[best].pop_front();
      ++busy[best];
      left[best] -= latency_s(p);
      running.emplace(now + latency_s(p), p);
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

/// No schedule beats all the work over 8 slots, nor the busiest host's work
/// over its 2.
inline double lower_bound_s() {
  const std::vector<int> sizes = host_sizes();
  double total = 0, busiest = 0;
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h) {
    double host = 0;
    for (int i = 0; i < sizes[static_cast<std::size_t>(h)]; ++i) host += latency_s({h, i});
    total += host;
    busiest = std::max(busiest, host);
  }
  return std::max(total / limit, busiest / per_host);
}

/// How the crawl limits hosts.
enum class mode {
  most_waiting,     ///< by_key(host, 2, {.order = key_order::most_waiting})
  oldest,           ///< by_key(host, 2): the oldest page whose host has room
  keyed_semaphore,  ///< no keys: a keyed_semaphore per host inside the task
  group             ///< keyed_task_group<int>: each page spawns its links, most_waiting
};

struct result {
  int pages = 0;
  std::chrono::nanoseconds makespan{0};
  std::size_t max_in_flight = 0, max_per_host = 0, max_waiting = 0;
  [[nodiscard]] double makespan_s() const {
    return std::chrono::duration<double>(makespan).count();
  }
};

/// Crawls the site with a keyed_task_group: no frontier, each fetched page
/// spawns its links under their host (spawn never waits: what waits for its
/// host is every page discovered and not started).
inline result run_group() {
  namespace testing = sluice::testing;
  using group = sluice::keyed_task_group<int>;
  const std::vector<int> sizes = host_sizes();
  testing::slow_service site({.latency = testing::latency::from([](const testing::call_info& c) {
                                return page_latency(c.key, c.op);
                              })});
  testing::virtual_loop loop;
  result r;
  std::function<asio::awaitable<void>(group&, page)> visit = [&](group& g,
                                                                 page p) -> asio::awaitable<void> {
    co_await site.call(host_name(p.host), std::to_string(p.index));
    ++r.pages;
    for (auto& l : links_of(p, sizes)) g.spawn(l.host, visit(g, l));
    r.max_waiting = std::max(r.max_waiting, g.waiting());
  };
  loop.run([&]() -> asio::awaitable<void> {
    co_await group::run(limit, per_host,
                        [&](group& g) -> asio::awaitable<void> {
                          for (int h = 0; h < static_cast<int>(sizes.size()); ++h)
                            g.spawn(h, visit(g, {h, 0}));
                          r.max_waiting = std::max(r.max_waiting, g.waiting());
                          co_return;
                        },
                        {.order = sluice::key_order::most_waiting});
  });
  r.makespan = loop.now();
  r.max_in_flight = site.max_in_flight();
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h)
    r.max_per_host = std::max(r.max_per_host, site.max_in_flight(host_name(h)));
  return r;
}

/// Crawls the site in virtual time.
inline result run(mode m) {
  if (m == mode::group) return run_group();
  namespace testing = sluice::testing;
  const std::vector<int> sizes = host_sizes();
  testing::slow_service site({.latency = testing::latency::from([](const testing::call_info& c) {
                                return page_latency(c.key, c.op);
                              })});
  testing::virtual_loop loop;
  frontier f;
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h) f.todo.push_back({h, 0});
  sluice::keyed_semaphore<std::string> host_permits{per_host};
  result r;
  std::size_t running = 0;
  auto fetch = [&](page p) -> asio::awaitable<int> {
    std::optional<sluice::keyed_semaphore<std::string>::permit> permit;
    if (m == mode::keyed_semaphore)
      permit = co_await host_permits.scoped_acquire(host_name(p.host));
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
    if (m == mode::keyed_semaphore) {
      co_await sluice::for_each(sluice::map_unordered(fetch, f, limit), count);
    } else {
      auto host_of = [](const page& p) {
        return p.host;
      };
      const auto order =
          m == mode::most_waiting ? sluice::key_order::most_waiting : sluice::key_order::oldest;
      co_await sluice::for_each(
          sluice::map_unordered(
              fetch, f, limit,
              sluice::by_key(host_of, per_host, {.buffer = buffer, .order = order})),
          count);
    }
  });
  r.makespan = loop.now();
  r.max_in_flight = site.max_in_flight();
  for (int h = 0; h < static_cast<int>(sizes.size()); ++h)
    r.max_per_host = std::max(r.max_per_host, site.max_in_flight(host_name(h)));
  return r;
}

}  // namespace sluice_examples::crawl

#endif  // SLUICE_EXAMPLES_SUPPORT_CRAWL_SCENARIO_HPP
