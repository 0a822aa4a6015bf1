// SPDX-License-Identifier: BSL-1.0
// Provider-side accounting for the call-policy layers (`shed`, `limits`):
// the permits of abandoned calls kept a while longer, so that a cap means
// calls at the provider. Its machinery waits on time (`time.hpp`) and so
// sits above `detail/`; users name it through the layers' `.linger` options.
#ifndef SLUICE_LINGER_HPP
#define SLUICE_LINGER_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::detail {

// Permits of abandoned calls that a layer keeps a while longer (provider-side
// accounting), each held by a timer coroutine spawned on the abandoning
// caller's executor. The set counts them and completes every join() when
// none is left. Thread-safe (one mutex). Invariant: joiners is non-empty
// only while lingering > 0 and a join() waits.
class linger_set {
 public:
  // Holds `held` until `until` on `ex`'s clock, then destroys it. Counted
  // before the spawn (whose body may end inside it); if making or spawning
  // the timer coroutine throws (out of memory, a Held whose move throws),
  // `held` is destroyed on the way out, the count goes back down (a join
  // waiting for it completes) and the exception propagates.
  template <class Executor, class Held>
  void hold(const Executor& ex, Held held, clock::time_point until) {
    {
      std::lock_guard lock(s_->mutex);
      ++s_->lingering;
    }
    try {
      asio::co_spawn(ex, wait(ex, std::move(held), until), done{s_});
    } catch (...) {
      done{s_}(nullptr);
      throw;
    }
  }

  // Permits lingering now.
  [[nodiscard]] std::size_t lingering() const {
    std::lock_guard lock(s_->mutex);
    return s_->lingering;
  }

  // Completes when no permit lingers (at once if none does). Any number of
  // joins may wait at once (two shutdown paths of one server).
  template <class Executor>
  asio::awaitable<void, Executor> join(Executor ex) {
    // Named, not a temporary of the co_await expression: g++ 12 destroys
    // such temporaries twice (an over-released shared_ptr), as time.hpp notes.
    auto initiation = [s = s_, ex](auto handler) {
      std::unique_lock lock(s->mutex);
      if (s->lingering == 0) {
        lock.unlock();
        asio::post(ex, std::move(handler));
        return;
      }
      s->joiners.push_back([h = std::make_shared<decltype(handler)>(std::move(handler)),
                            ex]() mutable { asio::post(ex, std::move(*h)); });
    };
    co_await asio::async_initiate<const asio::use_awaitable_t<Executor>&, void()>(
        std::move(initiation), asio::use_awaitable_t<Executor>{});
  }

 private:
  struct state {
    mutable std::mutex mutex;
    std::size_t lingering = 0;
    std::vector<std::function<void()>> joiners;
  };
  struct done {
    std::shared_ptr<state> s;
    void operator()(const std::exception_ptr&) const {
      std::vector<std::function<void()>> joiners;
      {
        std::lock_guard lock(s->mutex);
        if (--s->lingering == 0) joiners.swap(s->joiners);
      }
      for (auto& j : joiners) j();
    }
  };
  template <class Executor, class Held>
  static asio::awaitable<void, Executor> wait(Executor ex, [[maybe_unused]] Held held,
                                              clock::time_point until) {
    co_await wait_until(ex, find_virtual_clock(ex), until);
  }

  std::shared_ptr<state> s_ = std::make_shared<state>();
};

// A call was abandoned: its own timeout, the caller's cancellation, a hedge
// that lost.
inline bool abandoned(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const timeout_error&) {
    return true;
  } catch (...) {
    return is_operation_aborted(e);
  }
}

// Awaits next() holding `held`; when the call was abandoned and `linger` is
// positive, `held` goes to `set` for `linger` more instead of being released.
template <class Held, class Next>
auto call_holding(linger_set& set, clock::duration linger, Held held, Next& next)
    -> std::invoke_result_t<Next&> {
  using T = task_result_t<std::invoke_result_t<Next&>>;
  std::exception_ptr error;
  try {
    if constexpr (std::is_void_v<T>) {
      co_await next();
      co_return;
    } else {
      co_return co_await next();
    }
  } catch (...) {
    error = std::current_exception();
  }
  if (linger > clock::duration::zero() && abandoned(error)) {
    const auto ex = co_await asio::this_coro::executor;
    set.hold(ex, std::move(held), add_saturating(sluice::now(ex), linger));
  }
  std::rethrow_exception(error);
}

}  // namespace sluice::detail

#endif  // SLUICE_LINGER_HPP
