// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_AFFINITY_HPP
#define SLUICE_DETAIL_AFFINITY_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <type_traits>

namespace sluice::detail {

// Debug-build check that a loop-affine primitive is used from the thread that
// runs its loop (SLUICE_AFFINITY_CHECKS).
//
// What is checked, exactly:
// - The primitive's loop is the asio::io_context of the executor it was
//   constructed with or, failing that, of the associated executor of the first
//   wait operation. Recognised executors: io_context::executor_type, a strand
//   of it, and an any_io_executor holding either (what coroutines carry).
//   Until a loop is known nothing is checked; other executors (thread_pool,
//   system, use_future's) are never checked.
// - A call made while the calling thread runs that io_context is accepted and
//   records the thread as the loop's thread.
// - A call from a thread that does not run the loop is accepted if the loop has
//   not run the primitive yet (set-up) or if it is the recorded loop thread
//   (between two run() calls, or after the loop returned). Any other thread is
//   a violation: the process aborts with a message naming the primitive.
// Destructors and the const diagnostics are not checked.
//
// Invariant: ctx_ never changes once set.
class affinity {
 public:
  template <class Executor>
  void bind(const Executor& ex) noexcept {
#if SLUICE_AFFINITY_CHECKS
    if (ctx_ == nullptr) ctx_ = context_of(ex);
#else
    (void)ex;
#endif
  }

  // True if a call from this thread, now, breaks loop affinity. Records the
  // loop's thread when called from it.
  bool violated() noexcept {
#if SLUICE_AFFINITY_CHECKS
    if (ctx_ == nullptr) return false;
    const auto self = std::this_thread::get_id();
    if (ctx_->get_executor().running_in_this_thread()) {
      owner_ = self;
      return false;
    }
    return owner_ != std::thread::id{} && owner_ != self;
#else
    return false;
#endif
  }

  // Aborts with a message naming `what` if violated().
  void check(const char* what) noexcept {
#if SLUICE_AFFINITY_CHECKS
    if (violated()) {
      std::fprintf(stderr,
                   "sluice: %s used from a thread that is not running its loop; sluice "
                   "primitives are loop-affine and not thread-safe (post the call to the "
                   "primitive's executor instead)\n",
                   what);
      std::fflush(stderr);
      std::abort();
    }
#else
    (void)what;
#endif
  }

 private:
#if SLUICE_AFFINITY_CHECKS
  // The io_context behind an executor, when it is one of the executor types a
  // coroutine or a user normally holds; null otherwise.
  template <class Executor>
  static asio::io_context* context_of(const Executor& ex) noexcept {
    using io_executor = asio::io_context::executor_type;
    if constexpr (std::is_same_v<Executor, io_executor>) {
      return &ex.context();
    } else if constexpr (std::is_same_v<Executor, asio::strand<io_executor>>) {
      return &ex.get_inner_executor().context();
    } else if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
      if (!ex) return nullptr;
      if (const auto* e = ex.template target<io_executor>()) return &e->context();
      if (const auto* s = ex.template target<asio::strand<io_executor>>()) {
        return &s->get_inner_executor().context();
      }
      return nullptr;
    } else {
      return nullptr;
    }
  }

  asio::io_context* ctx_ = nullptr;
  std::thread::id owner_{};
#endif
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_AFFINITY_HPP
