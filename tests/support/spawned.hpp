// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_SPAWNED_HPP
#define SLUICE_TESTS_SUPPORT_SPAWNED_HPP

// Tasks started on a virtual_loop that a test can inspect and cancel from the
// outside between loop.poll() calls (the analogue of asyncio's create_task /
// task.cancel() / sleep(0) in CPython's test_locks.py and test_queues.py).

#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <system_error>
#include <vector>

namespace sluice_test {

struct task {
  std::function<asio::awaitable<void>()> body;
  asio::cancellation_signal signal;
  bool done = false;
  std::exception_ptr error;

  // Requests terminal cancellation, as task.cancel() does.
  void cancel() { signal.emit(asio::cancellation_type::terminal); }

  bool succeeded() const { return done && !error; }
  bool failed() const { return done && error; }

  // True if it finished with sluice::system_error(operation_aborted).
  bool cancelled() const {
    if (!done || !error) return false;
    try {
      std::rethrow_exception(error);
    } catch (const sluice::system_error& e) {
      return e.code() == asio::error::operation_aborted;
    } catch (...) {
      return false;
    }
  }

  // Rethrows the task's exception, if any.
  void rethrow() const {
    if (error) std::rethrow_exception(error);
  }
};

// Owns the tasks and the loop. Tasks are declared first so they outlive the
// loop: a pending coroutine's cancellation slot points into its task.
struct tasks_on_loop {
  std::vector<std::unique_ptr<task>> tasks;
  sluice::testing::virtual_loop loop;

  template <class F>
  task& spawn(F f) {
    auto t = std::make_unique<task>();
    t->body = std::move(f);
    task* raw = t.get();
    tasks.push_back(std::move(t));
    asio::co_spawn(loop.get_executor(), raw->body(),
                   sluice_test::bind_slot(raw->signal.slot(), [raw](std::exception_ptr e) {
                     raw->done = true;
                     raw->error = e;
                   }));
    return *raw;
  }

  // Runs everything that is ready (asyncio: a few sleep(0)s).
  void poll() { loop.poll(); }
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_SPAWNED_HPP
