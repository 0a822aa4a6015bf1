// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_JOB_RUNNER_HPP
#define SLUICE_TESTS_SUPPORT_JOB_RUNNER_HPP

// The job-runner shape of a service that shuts down: a queue of jobs, a
// producer (the task_group's body) that takes them with spawn_when_ready, a
// per-tenant keyed_semaphore and the group's global limit, each job one call
// to a slow_service keyed by its tenant. Every job's fate is recorded by the
// job itself (RAII), independently of the group, so a test can check that
// each one is accounted for: done, cancelled, or never started.

#include <sluice/keyed_semaphore.hpp>
#include <sluice/queue.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/task_group.hpp>
#include <sluice/testing/slow_service.hpp>

#include <support/asio.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace sluice_test {

enum class job_state { queued, taken, running, done, cancelled };

struct job_runner {
  job_runner(std::size_t jobs, std::size_t tenants, sluice::testing::slow_service::options o)
      : states(jobs, job_state::queued), tenant_count(tenants), service(std::move(o)) {}

  std::vector<job_state> states;
  std::size_t tenant_count;
  sluice::testing::slow_service service;
  std::size_t refused = 0;  // taken from the queue, refused by spawn_when_ready

  std::string tenant(std::size_t job) const { return "t" + std::to_string(job % tenant_count); }

  std::size_t count(job_state s) const {
    std::size_t n = 0;
    for (auto x : states) n += x == s ? 1 : 0;
    return n;
  }

  // Marks the job done when its call returned, cancelled on any other way out.
  struct fate {
    job_state& s;
    bool ok = false;
    ~fate() { s = ok ? job_state::done : job_state::cancelled; }
  };

  asio::awaitable<void> job(std::size_t i, sluice::keyed_semaphore<std::string>& per_tenant) {
    states[i] = job_state::running;
    fate f{states[i]};
    auto permit = co_await per_tenant.scoped_acquire(tenant(i));
    co_await service.call(tenant(i), "job");
    f.ok = true;
  }

  // The producer: takes jobs while the group accepts them.
  asio::awaitable<void> produce(sluice::task_group& g, sluice::queue<std::size_t>& q,
                                sluice::keyed_semaphore<std::string>& per_tenant) {
    for (;;) {
      const std::size_t i = co_await q.get();
      states[i] = job_state::taken;
      if (!co_await g.spawn_when_ready(job(i, per_tenant))) {
        states[i] = job_state::queued;  // refused: it never started
        ++refused;
        co_return;
      }
    }
  }
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_JOB_RUNNER_HPP
