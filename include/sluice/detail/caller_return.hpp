// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_CALLER_RETURN_HPP
#define SLUICE_DETAIL_CALLER_RETURN_HPP

#include <sluice/config.hpp>
#include <sluice/detail/loop_service.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <optional>
#include <utility>

namespace sluice::detail {

// The caller's side of a call that runs away from the caller's loop, on a
// thread pool (to_thread) or a strand (strand_bound's hop): the handler that
// resumes the caller, and a work guard on its executor (that loop keeps
// running while the call is away). A hook on the caller's loop_service: if
// the caller's loop is destroyed first, on_end destroys the handler (the
// caller's frame) there, on the destroying thread while the context still
// lives (drop(); a derived type may set an on_end that does more), and the
// other side later finds the hook detached and posts nothing into the dead
// loop. The other side holds the loop's lock across its post (post_back()),
// so the context cannot be destroyed in the middle of it (ThreadSanitizer:
// the scheduler's condition variable).
template <class Handler, class Executor>
struct caller_return : loop_hook {
  using executor_type = Executor;

  caller_return(Handler&& h, Executor ex)
      : handler(std::move(h)), work(std::in_place, std::move(ex)) {
    on_end = &orphan;
  }
  caller_return(const caller_return&) = delete;
  caller_return& operator=(const caller_return&) = delete;
  ~caller_return() { unwatch(); }

  // On the caller's executor, before the call leaves it.
  void watch() {
    life = loop_service::life_of_executor(work->get_executor());
    if (life) life->attach(*this);  // false only for a context already shut down
  }

  // Off the caller's loop_service: no on_end can run any more. A derived type
  // with members of its own that on_end reads calls it first in its
  // destructor (the base's runs after those members are gone).
  void unwatch() noexcept {
    if (life) life->detach(*this);
  }

  // On the other side, when the call is done: runs post(), which posts the
  // caller's completion (taking `handler`) and drop()s, unless the caller's
  // loop has ended. False then: nothing was posted, the caller is gone.
  template <class Post>
  bool post_back(Post&& post) {
    if (!life) {  // no loop behind the handler: nothing can die first
      post();
      return true;
    }
    const auto lock = life->lock();
    if (!attached) return false;
    life->detach(*this);
    post();
    return true;
  }

  // The handler (the caller's frame) and the work guard go.
  void drop() noexcept {
    handler.reset();
    work.reset();
  }

  // At the caller's loop's end (its destroying thread, under its lock).
  static void orphan(loop_hook* hook) noexcept { static_cast<caller_return*>(hook)->drop(); }

  std::optional<Handler> handler;
  std::optional<asio::executor_work_guard<Executor>> work;
  std::shared_ptr<loop_life> life;  // of the caller's context
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_CALLER_RETURN_HPP
