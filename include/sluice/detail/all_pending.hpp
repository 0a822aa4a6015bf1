// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ALL_PENDING_HPP
#define SLUICE_DETAIL_ALL_PENDING_HPP

// FIFO among sluice::acquire_all callers: the pending calls of the whole
// process, oldest first, behind one mutex. A call may take only when no older
// pending call names one of its budgets: the oldest is never held back, so
// there is no deadlock, and a younger call that shares a budget never
// overtakes it. The list belongs to no loop and no strand: calls on any
// thread, strand or io_context that share a budget (a shared_semaphore, a
// strand_bound limit) are ordered, and calls on disjoint budgets only share
// the mutex for the length of a list walk.

#include <sluice/config.hpp>
#include <sluice/detail/all_budgets.hpp>
#include <sluice/shared_semaphore.hpp>

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace sluice::detail {

// One pending acquire_all: the budgets it names. `left` gets one permit when
// the call ends (granted, cancelled or failed); each call waiting behind it
// takes that permit and puts it back, so all of them wake, on their own
// executors, whatever thread the older call ended on. The waiting calls' frames
// share ownership of the entry.
struct all_waiter {
  std::vector<budget_id> ids;
  shared_semaphore left{0};
  bool listed = false;  // guarded by all_pending's mutex
  std::list<std::shared_ptr<all_waiter>>::iterator at;

  bool conflicts(const all_waiter& o) const noexcept {
    for (const auto& a : ids)
      for (const auto& b : o.ids)
        if (a == b) return true;
    return false;
  }
};

class all_pending {
 public:
  static all_pending& instance() {
    static all_pending p;
    return p;
  }

  std::shared_ptr<all_waiter> enqueue(std::vector<budget_id> ids) {
    auto w = std::make_shared<all_waiter>();
    w->ids = std::move(ids);
    const std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(w);
    w->at = std::prev(pending_.end());
    w->listed = true;
    return w;
  }

  // The youngest pending call older than `w` that shares a budget with it.
  std::shared_ptr<all_waiter> older_conflict(const all_waiter& w) {
    const std::lock_guard<std::mutex> lock(mu_);
    for (auto it = w.at; it != pending_.begin();) {
      --it;
      if ((*it)->conflicts(w)) return *it;
    }
    return nullptr;
  }

  // `w` ends: the calls behind it look again.
  void leave(all_waiter& w) noexcept {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      if (!w.listed) return;
      w.listed = false;
      pending_.erase(w.at);
    }
    try {
      w.left.release();
    } catch (...) {  // cannot overflow: released once
    }
  }

 private:
  std::mutex mu_;
  std::list<std::shared_ptr<all_waiter>> pending_;
};

struct all_leave_guard {
  std::shared_ptr<all_waiter> w;
  ~all_leave_guard() { all_pending::instance().leave(*w); }
};

// Waits until `older` has left. Throws operation_aborted when cancelled,
// holding nothing (the wake is passed on to the others behind it).
inline asio::awaitable<void> wait_left(std::shared_ptr<all_waiter> older) {
  co_await older->left.acquire();
  older->left.release();
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_ALL_PENDING_HPP
