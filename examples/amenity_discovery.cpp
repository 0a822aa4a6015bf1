// SPDX-License-Identifier: BSL-1.0
// Property amenity discovery: 9 categories of nearby places, the grocery
// category fanning out to 6 sub-searches (5 supermarket chains + a generic
// search): 14 calls to a places API that answers in 1-5 s.
//
// First one call after another, then gather_with_concurrency(5, ...) with the
// grocery sub-searches bounded inside (nested limits multiply: up to 9 calls in
// flight), then everything gathered with one shared sluice::semaphore{5}
// around each API call (never more than 5 at the provider). Prints a timeline
// per run, the total, the maximum number of calls in flight and the speed-up.
//
//   amenity_discovery            real time, latencies scaled by 1/20
//   amenity_discovery --virtual  virtual time at full scale (instant, exact)

#include <sluice/gather.hpp>
#include <sluice/semaphore.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>

#include <sluice/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
namespace testing = sluice::testing;
using seconds_d = std::chrono::duration<double>;

namespace {

const std::vector<std::string> categories = {"hospital", "bank",       "school", "pharmacy", "gym",
                                             "laundry",  "restaurant", "coffee", "grocery"};
const std::vector<std::string> grocery_searches = {"grocery/continente",  "grocery/pingo-doce",
                                                   "grocery/lidl",        "grocery/aldi",
                                                   "grocery/intermarche", "grocery/supermarket"};

// FNV-1a: the same numbers on every platform.
std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 14695981039346656037ULL;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

// 1-5 s, a function of the query alone, so both runs meet the same latencies.
std::chrono::nanoseconds places_latency(const testing::call_info& c) {
  return std::chrono::milliseconds(1000 + static_cast<long>(fnv1a(c.key) % 4001));
}

// One call to the places API: returns how many places it found.
asio::awaitable<int> find_nearby(testing::slow_service& api, std::string query) {
  co_await api.call(query, "find_nearby");
  co_return static_cast<int>(fnv1a(query) % 7) + 1;
}

asio::awaitable<int> sequential(testing::slow_service& api) {
  int found = 0;
  for (const auto& category : categories) {
    if (category == "grocery") {
      for (const auto& q : grocery_searches) found += co_await find_nearby(api, q);
    } else {
      found += co_await find_nearby(api, category);
    }
  }
  co_return found;
}

asio::awaitable<int> discover_category(testing::slow_service& api, std::string category) {
  if (category != "grocery") co_return co_await find_nearby(api, category);
  std::vector<asio::awaitable<int>> subs;
  for (const auto& q : grocery_searches) subs.push_back(find_nearby(api, q));
  int found = 0;
  for (int n : co_await sluice::gather_with_concurrency(5, std::move(subs))) found += n;
  co_return found;
}

asio::awaitable<int> bounded(testing::slow_service& api) {
  std::vector<asio::awaitable<int>> tasks;
  for (const auto& c : categories) tasks.push_back(discover_category(api, c));
  int found = 0;
  for (int n : co_await sluice::gather_with_concurrency(5, std::move(tasks))) found += n;
  co_return found;
}

// The provider-wide cap: every call to the API holds one of 5 permits.
asio::awaitable<int> find_nearby_capped(testing::slow_service& api, sluice::semaphore& cap,
                                        std::string query) {
  auto permit = co_await cap.scoped_acquire();
  co_return co_await find_nearby(api, std::move(query));
}

asio::awaitable<int> discover_category_capped(testing::slow_service& api, sluice::semaphore& cap,
                                              std::string category) {
  if (category != "grocery") co_return co_await find_nearby_capped(api, cap, category);
  std::vector<asio::awaitable<int>> subs;
  for (const auto& q : grocery_searches) subs.push_back(find_nearby_capped(api, cap, q));
  int found = 0;
  for (int n : co_await sluice::gather(std::move(subs))) found += n;
  co_return found;
}

asio::awaitable<int> shared_cap(testing::slow_service& api) {
  sluice::semaphore cap{5};
  std::vector<asio::awaitable<int>> tasks;
  for (const auto& c : categories) tasks.push_back(discover_category_capped(api, cap, c));
  int found = 0;
  for (int n : co_await sluice::gather(std::move(tasks))) found += n;
  co_return found;
}

struct report {
  seconds_d total;  // in simulated (unscaled) seconds
  std::size_t max_in_flight;
  int found;
};

// One row per call: its bar over a shared time axis.
void print_timeline(const testing::slow_service& api, seconds_d axis, double scale) {
  constexpr int width = 60;
  auto col = [&](std::chrono::nanoseconds t) {
    return static_cast<int>(std::lround(seconds_d(t).count() / scale / axis.count() * width));
  };
  for (const auto& r : api.timeline()) {
    const int a = col(r.start), b = std::max(col(r.end), a + 1);
    std::printf("  %-20s |%s%s%s| %4.1f-%4.1f s\n", r.key.c_str(),
                std::string(static_cast<std::size_t>(a), ' ').c_str(),
                std::string(static_cast<std::size_t>(b - a), '#').c_str(),
                std::string(static_cast<std::size_t>(std::max(0, width - b)), ' ').c_str(),
                seconds_d(r.start).count() / scale, seconds_d(r.end).count() / scale);
  }
  std::string ticks(width + 1, ' ');
  std::string labels;
  for (int s = 0; s <= static_cast<int>(axis.count()); s += 10) {
    const int c = static_cast<int>(s / axis.count() * width);
    ticks[static_cast<std::size_t>(c)] = '|';
  }
  std::printf("  %-20s %s\n", "", ticks.c_str());
  std::printf("  %-20s 0 s%*s%.0f s\n", "", width - 4, "", axis.count());
}

template <class Run>
report run_once(bool virtual_time, double scale, testing::slow_service& api, Run run) {
  int found = 0;
  if (virtual_time) {
    testing::virtual_loop loop;
    found = loop.run(run(api));
    return {seconds_d(loop.now()), api.max_in_flight(), found};
  }
  asio::io_context ctx;
  const auto t0 = std::chrono::steady_clock::now();
  asio::co_spawn(ctx, run(api), [&](std::exception_ptr e, int n) {
    if (e) std::rethrow_exception(e);
    found = n;
  });
  ctx.run();
  return {seconds_d(std::chrono::steady_clock::now() - t0) / scale, api.max_in_flight(), found};
}

}  // namespace

int main(int argc, char** argv) {
  const bool virtual_time = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  const double scale = virtual_time ? 1.0 : 0.05;
  auto make_api = [&] {
    return testing::slow_service::options{.latency = places_latency, .time_scale = scale};
  };

  std::printf("Amenity discovery: 9 categories, grocery = 6 sub-searches, 14 calls of 1-5 s\n");
  std::printf("(%s)\n\n", virtual_time
                              ? "virtual time, full scale"
                              : "real time, latencies scaled by 1/20, reported at full scale");

  testing::slow_service seq_api(make_api());
  const report seq = run_once(virtual_time, scale, seq_api, sequential);
  testing::slow_service par_api(make_api());
  const report par = run_once(virtual_time, scale, par_api, bounded);
  testing::slow_service cap_api(make_api());
  const report cap = run_once(virtual_time, scale, cap_api, shared_cap);

  const seconds_d axis = std::max(seq.total, par.total);
  std::printf("One call after another:\n");
  print_timeline(seq_api, axis, scale);
  std::printf("  total %.1f s, max in flight %zu, %zu calls\n\n", seq.total.count(),
              seq.max_in_flight, seq_api.calls());
  std::printf("sluice::gather_with_concurrency(5, ...), grocery bounded by 5 inside:\n");
  print_timeline(par_api, axis, scale);
  std::printf("  total %.1f s, max in flight %zu, %zu calls\n\n", par.total.count(),
              par.max_in_flight, par_api.calls());
  std::printf(
      "sluice::gather over everything, one shared sluice::semaphore{5} around each call:\n");
  print_timeline(cap_api, axis, scale);
  std::printf("  total %.1f s, max in flight %zu, %zu calls\n\n", cap.total.count(),
              cap.max_in_flight, cap_api.calls());
  std::printf(
      "speed-up: %.1fx (%.1f s -> %.1f s) with nested limits (%zu in flight at the provider),\n",
      seq.total / par.total, seq.total.count(), par.total.count(), par.max_in_flight);
  std::printf("          %.1fx (%.1f s -> %.1f s) with a provider-wide cap of 5 (%zu in flight);\n",
              seq.total / cap.total, seq.total.count(), cap.total.count(), cap.max_in_flight);
  std::printf("          the same %d places found every time\n", seq.found);
  return seq.found == par.found && seq.found == cap.found && cap.max_in_flight <= 5 ? 0 : 1;
}
