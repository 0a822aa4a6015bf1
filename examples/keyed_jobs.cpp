// SPDX-License-Identifier: BSL-1.0
// Keyed concurrency, after pynenc's concurrency demo: 12 jobs for 3 accounts
// (4 operations each) against a provider that allows parallel calls across
// accounts but refuses (a 429: a collision) a call for an account that
// already has its limit in flight (1, or 2 in the last row). Each call holds
// its account for 0.4 s.
//
//   no control        every job calls at once                  -> collisions
//   keyed wait        keyed_semaphore{1}, scoped_acquire(acct)   -> 0 collisions, all run
//   keyed drop        keyed_semaphore{1}, try_acquire(acct)      -> 0 collisions, the rest dropped
//   dedupe            single_flight, 12 "refresh acct" requests -> one call per account
//   per_key = 2       keyed_semaphore{2}, a provider allowing 2  -> 2 per account at once
//
//   keyed_jobs             real time (about 4 s)
//   keyed_jobs --virtual   virtual time (exact, instantaneous)

#include <sluice/gather.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/single_flight.hpp>
#include <sluice/testing/slow_service.hpp>
#include <sluice/testing/virtual_time.hpp>
#include <sluice/time.hpp>

#include <sluice/asio.hpp>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::testing::slow_service;

namespace {

const char* const accounts[] = {"acme", "globex", "initech"};
const char* const operations[] = {"fetch_profile", "list_invoices", "update_metadata",
                                  "refresh_usage"};

struct row {
  const char* mode;
  std::size_t calls = 0, collisions = 0, dropped = 0, results = 0;
  double makespan_s = 0;
};

// The 12 jobs, operation by operation (the order pynenc enqueues them in).
template <class Job>
std::vector<asio::awaitable<void>> twelve_jobs(Job& job) {
  std::vector<asio::awaitable<void>> v;
  for (const char* op : operations)
    for (const char* account : accounts) v.push_back(job(std::string(account), std::string(op)));
  return v;
}

// One scenario: `per_key` is the provider's (and the keyed semaphore's) limit.
asio::awaitable<row> scenario(const char* mode, std::size_t per_key) {
  slow_service provider(
      {.latency = sluice::testing::latency::fixed(400ms), .key_quota = {.max_in_flight = per_key}});
  sluice::keyed_semaphore<std::string> per_account{per_key};
  sluice::single_flight<std::string, std::string> refreshes;
  row r{mode};
  const std::string m = mode;

  auto job = [&](std::string account, std::string op) -> asio::awaitable<void> {
    if (m == "no control") {
      try {
        co_await provider.call(account, op);
        ++r.results;
      } catch (const sluice::testing::throttled_error&) {
        // refused: the collision pynenc's demo counts
      }
    } else if (m == "keyed drop") {
      auto permit = per_account.try_acquire(account);
      if (!permit) {
        ++r.dropped;  // the account is busy: skip, as reroute=False does
        co_return;
      }
      co_await provider.call(account, op);
      ++r.results;
    } else if (m == "dedupe") {
      auto refresh = [&provider, account]() -> asio::awaitable<std::string> {
        co_await provider.call(account, "refresh");
        co_return "refreshed " + account;
      };
      const std::string got = co_await refreshes.run(account, refresh);
      r.results += got == "refreshed " + account ? 1 : 0;
    } else {  // keyed wait, with per_key holders per account
      auto permit = co_await per_account.scoped_acquire(account);
      co_await provider.call(account, op);
      ++r.results;
    }
  };

  auto ex = co_await asio::this_coro::executor;
  const auto start = sluice::now(ex);
  co_await sluice::gather(twelve_jobs(job));
  r.makespan_s = std::chrono::duration<double>(sluice::now(ex) - start).count();
  r.calls = provider.calls();
  r.collisions = provider.throttles();
  co_return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bool virtual_time = argc > 1 && std::strcmp(argv[1], "--virtual") == 0;
  std::function<row(const char*, std::size_t)> run;
  if (virtual_time) {
    run = [](const char* mode, std::size_t per_key) {
      sluice::testing::virtual_loop loop;
      return loop.run(scenario(mode, per_key));
    };
  } else {
    run = [](const char* mode, std::size_t per_key) {
      asio::io_context ctx;
      row r{};
      asio::co_spawn(ctx, scenario(mode, per_key), [&](std::exception_ptr e, row v) {
        if (e) std::rethrow_exception(e);
        r = v;
      });
      ctx.run();
      return r;
    };
  }
  try {
    std::printf(
        "[%s] 12 jobs, 3 accounts, 0.4 s per call; collisions: calls the provider\n"
        "refused because the account already had its limit in flight; results: jobs\n"
        "that got the provider's answer\n\n",
        virtual_time ? "virtual time" : "real time");
    std::printf(
        "| mode                    | calls made | collisions | jobs dropped | results | makespan "
        "|\n");
    std::printf(
        "|-------------------------|-----------:|-----------:|-------------:|--------:|---------:|"
        "\n");
    const row rows[] = {run("no control", 1), run("keyed wait", 1), run("keyed drop", 1),
                        run("dedupe", 1), run("keyed wait, per_key = 2", 2)};
    for (const row& r : rows) {
      std::printf("| %-23s | %10zu | %10zu | %12zu | %7zu | %7.2fs |\n", r.mode, r.calls,
                  r.collisions, r.dropped, r.results, r.makespan_s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "keyed_jobs: %s\n", e.what());
    return 1;
  }
  return 0;
}
