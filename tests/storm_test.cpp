// SPDX-License-Identifier: BSL-1.0
// Seeded fan-out storms: thousands of random scenarios through gather,
// gather_with_concurrency and map_unordered chains, with random latencies,
// failures, a caller cancelled at a random instant and consumers that stop
// early. Each scenario is checked against a schedule computed here,
// independently of sluice (greedy list scheduling in input order), and
// against invariants: results in the promised order, the error is the first
// in time, nothing lost or duplicated, nothing running after the call
// returned, in flight never above the limit. A failure prints its seed.

#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <support/asio.hpp>

#include <catch2/catch.hpp>
#include <support/ending.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;
using sluice::testing::virtual_loop;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

// splitmix64: the same numbers from every standard library.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(next() % n); }
};

enum class kind { gather, bounded, stream, chain, for_each, for_each_chain };

// One random scenario. Latencies are multiples of 10 ms and cancellation
// instants end in 5 ms, so a cancellation never ties with a completion.
struct scenario {
  std::uint64_t seed = 0;
  kind k = kind::gather;
  std::size_t n = 0, limit = 1, limit2 = 1;
  std::vector<int> lat, lat2;    // ms, per input, for stage 1 and stage 2
  std::set<int> fail, fail2;     // inputs whose stage-1 / stage-2 call fails
  std::size_t stop_after = 0;    // streams: the consumer stops after this many (n+1: never)
  std::vector<int> consumer_ms;  // chain: the consumer's work per result
  std::optional<int> cancel_at;  // ms; set on the second run of a scenario

  std::string describe() const {
    std::ostringstream o;
    o << "seed " << seed << " kind " << static_cast<int>(k) << " n " << n << " limit " << limit
      << "/" << limit2 << " failing " << fail.size() << "/" << fail2.size() << " stop_after "
      << stop_after << " cancel_at " << (cancel_at ? std::to_string(*cancel_at) : "-");
    return o.str();
  }
};

scenario make(std::uint64_t seed, kind k) {
  rng r{seed * 0x100000001b3ULL + static_cast<std::uint64_t>(k)};
  scenario s;
  s.seed = seed;
  s.k = k;
  s.n = r.below(17);
  s.limit = 1 + r.below(6);
  s.limit2 = 1 + r.below(4);
  const std::size_t fail_pct = r.below(3) == 0 ? 0 : r.below(25);
  for (std::size_t i = 0; i < s.n; ++i) {
    s.lat.push_back(10 * static_cast<int>(r.below(30)));  // 0 .. 290 ms
    s.lat2.push_back(10 * static_cast<int>(r.below(10)));
    s.consumer_ms.push_back(r.below(3) == 0 ? 10 * static_cast<int>(r.below(5)) : 0);
    if (r.below(100) < fail_pct) s.fail.insert(static_cast<int>(i));
    const bool two_stages = k == kind::chain || k == kind::for_each_chain;
    if (two_stages && r.below(100) < fail_pct / 2) s.fail2.insert(static_cast<int>(i));
  }
  s.stop_after = r.below(3) == 0 ? r.below(s.n + 1) : s.n + 1;
  return s;
}

// What one run observed.
struct observed {
  bool done = false;
  std::string ending;                           // "ok", "aborted", or "fail <i>"
  nanoseconds at{0};                            // virtual time when the call returned
  std::size_t in_flight = 99;                   // calls still running when it returned
  std::size_t calls = 0;                        // calls started when it returned
  std::vector<int> results;                     // in the order the call delivered them
  std::map<int, nanoseconds> end1, end2;        // per input, per stage
  std::map<int, nanoseconds> failed1, failed2;  // per input, per stage
};

int value_of(int i) {
  return 7 * i + 1;
}

struct world {
  const scenario& s;
  virtual_loop loop;
  slow_service svc1, svc2;
  observed o;

  static sluice::testing::latency_model from(const std::vector<int>& lat) {
    return sluice::testing::latency::from([lat](const sluice::testing::call_info& c) {
      return nanoseconds(milliseconds(lat.at(std::stoul(std::string(c.key)))));
    });
  }
  static sluice::testing::failure_model failing(const std::set<int>& f) {
    std::vector<std::string> keys;
    for (int i : f) keys.push_back(std::to_string(i));
    return sluice::testing::failures::for_keys(keys);
  }

  explicit world(const scenario& sc)
      : s(sc),
        svc1({.latency = from(sc.lat), .failure = failing(sc.fail)}),
        svc2({.latency = from(sc.lat2), .failure = failing(sc.fail2)}) {}

  // One call of input i to `svc`: records when it ended or failed.
  asio::awaitable<int> work(int stage, int i) {
    try {
      co_await (stage == 1 ? svc1 : svc2).call(std::to_string(i));
    } catch (const sluice::testing::service_error&) {
      (stage == 1 ? o.failed1 : o.failed2)[i] = loop.now();
      throw std::runtime_error("fail" + std::to_string(stage) + " " + std::to_string(i));
    }
    (stage == 1 ? o.end1 : o.end2)[i] = loop.now();
    co_return value_of(i);
  }

  std::vector<asio::awaitable<int>> tasks() {
    std::vector<asio::awaitable<int>> v;
    for (std::size_t i = 0; i < s.n; ++i) v.push_back(work(1, static_cast<int>(i)));
    return v;
  }

  std::vector<int> inputs() const {
    std::vector<int> in;
    for (std::size_t i = 0; i < s.n; ++i) in.push_back(static_cast<int>(i));
    return in;
  }

  // Reads a stream as for_each does: stops early if told, and on every way
  // out closes it and waits for its tasks before returning or rethrowing.
  template <class Stream>
  asio::awaitable<void> consume(Stream st, bool delays) {
    std::exception_ptr err;
    try {
      while (o.results.size() < s.stop_after) {
        std::optional<int> v = co_await st.next();
        if (!v) break;
        o.results.push_back(*v);
        const int ms = s.consumer_ms[static_cast<std::size_t>((*v - 1) / 7)];
        if (delays && ms > 0) co_await sluice::sleep(milliseconds(ms));
      }
    } catch (...) {
      err = std::current_exception();
    }
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await st.close();
    if (err) std::rethrow_exception(err);
  }

  asio::awaitable<void> body() {
    switch (s.k) {
      case kind::gather:
        o.results = co_await sluice::gather(tasks());
        break;
      case kind::bounded:
        o.results = co_await sluice::gather_with_concurrency(s.limit, tasks());
        break;
      case kind::stream:
        co_await consume(
            sluice::map_unordered([this](int i) { return work(1, i); }, inputs(), s.limit), false);
        break;
      case kind::chain:
        co_await consume(
            sluice::map_unordered(
                [this](int v) { return work(2, (v - 1) / 7); },
                sluice::map_unordered([this](int i) { return work(1, i); }, inputs(), s.limit),
                s.limit2),
            true);
        break;
      case kind::for_each:
        // The scoped form: a plain bool body; false stops.
        co_await sluice::for_each(
            sluice::map_unordered([this](int i) { return work(1, i); }, inputs(), s.limit),
            [this](int v) {
              o.results.push_back(v);
              return o.results.size() < s.stop_after;
            });
        break;
      case kind::for_each_chain:
        // Two stages, and a body that works (sleeps) on some results.
        co_await sluice::for_each(
            sluice::map_unordered(
                [this](int v) { return work(2, (v - 1) / 7); },
                sluice::map_unordered([this](int i) { return work(1, i); }, inputs(), s.limit),
                s.limit2),
            [this](int v) -> asio::awaitable<bool> {
              o.results.push_back(v);
              const int ms = s.consumer_ms[static_cast<std::size_t>((v - 1) / 7)];
              if (ms > 0) co_await sluice::sleep(milliseconds(ms));
              co_return o.results.size() < s.stop_after;
            });
        break;
    }
  }

  observed run() {
    asio::cancellation_signal cancel;
    if (s.cancel_at) {
      asio::co_spawn(
          loop.get_executor(),
          [](nanoseconds t, asio::cancellation_signal& c) -> asio::awaitable<void> {
            co_await sluice::sleep(t);
            c.emit(asio::cancellation_type::terminal);
          }(milliseconds(*s.cancel_at), cancel),
          asio::detached);
    }
    asio::co_spawn(loop.get_executor(), body(),
                   sluice_test::bind_slot(cancel.slot(), [this](std::exception_ptr e) {
                     o.done = true;
                     o.ending = sluice_test::ending_of_exception(e);
                     o.at = loop.now();
                     o.in_flight = svc1.in_flight() + svc2.in_flight();
                     o.calls = svc1.calls() + svc2.calls();
                   }));
    loop.run_for(1h);
    return o;
  }
};

// Greedy list scheduling in input order on `workers` slots: start times.
std::vector<int> schedule(const std::vector<int>& lat, std::size_t workers) {
  std::vector<int> free_at(std::max<std::size_t>(workers, 1), 0), start;
  for (int l : lat) {
    auto it = std::min_element(free_at.begin(), free_at.end());
    start.push_back(*it);
    *it += l;
  }
  return start;
}

// Invariants every run must keep, whatever happened.
void check_invariants(const scenario& s, const world& w, const observed& o) {
  REQUIRE(o.done);
  CHECK(o.in_flight == 0);                            // nothing running after return
  CHECK(w.svc1.calls() + w.svc2.calls() == o.calls);  // nothing started after return
  CHECK(w.svc1.calls() <= s.n);
  if (s.k != kind::gather) CHECK(w.svc1.max_in_flight() <= s.limit);
  const bool two_stages = s.k == kind::chain || s.k == kind::for_each_chain;
  if (two_stages) CHECK(w.svc2.max_in_flight() <= s.limit2);
  // Nothing lost or duplicated: each result once, each a real input's value.
  std::set<int> seen;
  for (int v : o.results) {
    CHECK(seen.insert(v).second);
    CHECK((v - 1) % 7 == 0);
    CHECK((v - 1) / 7 < static_cast<int>(s.n));
  }
  // The error is the first failure in time (ties: any of them) of its
  // stage. In a chain a stage-1 error reaches the consumer when stage 2 pulls
  // it, so it may surface later, or lose to a stage-2 failure meanwhile.
  if (o.ending.rfind("fail", 0) == 0) {
    const int stage = o.ending[4] - '0';
    const int i = std::stoi(o.ending.substr(6));
    const auto& failed = stage == 1 ? o.failed1 : o.failed2;
    REQUIRE(failed.count(i) == 1);
    for (const auto& [j, t] : failed) CHECK(failed.at(i) <= t);
    if (two_stages) {
      CHECK(o.at >= failed.at(i));
      if (stage == 1)
        for (const auto& [j, t] : o.failed2) CHECK(t >= o.at);  // stage 2 had not failed first
    } else {
      CHECK(o.at == failed.at(i));
    }
  } else {
    CAPTURE(o.ending);
    CHECK((o.ending == "ok" || o.ending == "aborted"));
  }
  // Streams yield in completion order.
  const auto& ends = two_stages ? o.end2 : o.end1;
  if (s.k != kind::gather && s.k != kind::bounded) {
    for (std::size_t j = 1; j < o.results.size(); ++j)
      CHECK(ends.at((o.results[j - 1] - 1) / 7) <= ends.at((o.results[j] - 1) / 7));
  }
}

// The schedule of an uncancelled gather / gather_with_concurrency / prompt
// single-stage stream, computed independently of sluice.
void check_schedule(const scenario& s, const observed& o) {
  const std::size_t workers = s.k == kind::gather ? s.n : s.limit;
  const std::vector<int> start = schedule(s.lat, workers);
  int t_fail = -1, makespan = 0;
  for (std::size_t i = 0; i < s.n; ++i) {
    const int end = start[i] + s.lat[i];
    makespan = std::max(makespan, end);
    if (s.fail.count(static_cast<int>(i)) && (t_fail < 0 || end < t_fail)) t_fail = end;
  }
  const bool streams = s.k == kind::stream || s.k == kind::for_each;
  const bool stops_early = streams && s.stop_after < s.n;
  if (t_fail < 0 && !stops_early) {
    CHECK(o.ending == "ok");
    CHECK(o.at == milliseconds(makespan));
    CHECK(o.calls == s.n);
    if (streams) {
      CHECK(o.results.size() == s.n);
    } else {
      std::vector<int> expect;
      for (std::size_t i = 0; i < s.n; ++i) expect.push_back(value_of(static_cast<int>(i)));
      CHECK(o.results == expect);  // input order
    }
  } else if (t_fail >= 0 && !stops_early) {
    CHECK(o.ending.rfind("fail1 ", 0) == 0);
    CHECK(o.at == milliseconds(t_fail));
    // Started: every task whose slot freed before the failure (a start at
    // the failure's instant may go either way).
    std::size_t before = 0, at_or_before = 0;
    for (int st : start) {
      before += st < t_fail;
      at_or_before += st <= t_fail;
    }
    CHECK(o.calls >= before);
    CHECK(o.calls <= at_or_before);
  }
}

void storm(kind k, std::uint64_t first_seed, std::uint64_t count) {
  std::size_t cancelled = 0, failed = 0, ok = 0;
  for (std::uint64_t seed = first_seed; seed < first_seed + count; ++seed) {
    scenario s = make(seed, k);
    INFO(s.describe());
    world first(s);
    const observed a = first.run();
    check_invariants(s, first, a);
    if (k != kind::chain && k != kind::for_each_chain) check_schedule(s, a);
    (a.ending == "ok" ? ok : failed) += 1;

    // The same scenario with the caller cancelled at a random instant.
    rng r{seed ^ 0xc0ffee};
    const int natural = static_cast<int>(std::chrono::duration_cast<milliseconds>(a.at).count());
    s.cancel_at = 10 * static_cast<int>(r.below(static_cast<std::size_t>(natural / 10 + 2))) + 5;
    INFO(s.describe());
    world second(s);
    const observed b = second.run();
    check_invariants(s, second, b);
    if (*s.cancel_at < natural) {
      ++cancelled;
      CHECK(b.ending == "aborted");
      CHECK(b.at == milliseconds(*s.cancel_at));
    } else {
      CHECK(b.ending == a.ending);
      CHECK(b.at == a.at);
      CHECK(b.results == a.results);
    }
  }
  // The storm exercised every way out.
  CHECK(ok > 0);
  CHECK(failed > 0);
  CHECK(cancelled > 0);
}

}  // namespace

TEST_CASE("400 random gather storms keep order, fail first-in-time and leave nothing running",
          "[storm]") {
  storm(kind::gather, 1, 400);
}

TEST_CASE("400 random gather_with_concurrency storms follow the greedy schedule under the limit",
          "[storm]") {
  storm(kind::bounded, 1, 400);
}

TEST_CASE("300 random map_unordered storms yield in completion order and stop cleanly", "[storm]") {
  storm(kind::stream, 1, 300);
}

TEST_CASE("300 random two-stage map_unordered chains with slow consumers lose nothing", "[storm]") {
  storm(kind::chain, 1, 300);
}

TEST_CASE("300 random for_each storms follow the schedule, stop early and leave nothing running",
          "[storm]") {
  storm(kind::for_each, 1, 300);
}

TEST_CASE("300 random for_each over two-stage chains with awaiting bodies lose nothing",
          "[storm]") {
  storm(kind::for_each_chain, 1, 300);
}
