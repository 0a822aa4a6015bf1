// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_SEMAPHORE_PERMIT_HPP
#define SLUICE_REDIS_SEMAPHORE_PERMIT_HPP

#include <sluice/config.hpp>
#include <sluice/redis/detail/semaphore_state.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

namespace sluice::detail {
struct redis_sem_permit_access;
}  // namespace sluice::detail

namespace sluice::redis {

/// Thrown by `semaphore::run()` when the permit's lease stopped being certain
/// while the body ran (the body was cancelled and has finished).
class lease_lost : public std::runtime_error {
 public:
  lease_lost()
      : std::runtime_error(
            "sluice::redis::semaphore: the lease is no longer certain; the body was cancelled") {}
};

/// Move-only ownership of one permit of a `redis::semaphore` (its
/// `semaphore::permit`, from `scoped_acquire()`); releases it on destruction.
///
/// It carries the grant's fencing token and tells when its lease stops being
/// certain (see `redis::semaphore` for the lease rules). Loop-affine, like
/// its semaphore, which must outlive it.
///
/// @code
/// sluice::redis::semaphore::permit p = co_await cap.scoped_acquire();
/// co_await call_service(p.fencing_token());   // the service rejects older tokens
/// if (p.lost()) { /* the lease ran out: stop writing */ }
/// p.reset();                                  // or at scope exit
/// @endcode
class semaphore_permit {
  using state = detail::redis_sem_state;
  using held_ptr = state::held_ptr;

 public:
  /// An empty permit that owns nothing.
  semaphore_permit() noexcept = default;
  /// Takes over `o`'s ownership; `o` is left empty.
  semaphore_permit(semaphore_permit&& o) noexcept : st_(std::move(o.st_)), h_(std::move(o.h_)) {}
  /// Releases what this owns, then takes over `o`'s ownership.
  semaphore_permit& operator=(semaphore_permit&& o) noexcept {
    if (this != &o) {
      reset();
      st_ = std::move(o.st_);
      h_ = std::move(o.h_);
    }
    return *this;
  }
  ~semaphore_permit() { reset(); }
  /// True while it owns a permit (also once it was lost, until `reset()`).
  explicit operator bool() const noexcept { return h_ != nullptr; }
  /// Releases the permit now (no-op when empty or lost).
  void reset() noexcept {
    if (auto h = std::exchange(h_, nullptr)) {
      st_->release(h, st_);
      st_.reset();
    }
  }
  /// The grant's fencing token: strictly increasing per semaphore (see
  /// `redis::semaphore`); 0 when empty.
  [[nodiscard]] std::int64_t fencing_token() const noexcept { return h_ ? h_->token : 0; }
  /// True once the lease stopped being certain (see `redis::semaphore`).
  [[nodiscard]] bool lost() const noexcept { return h_ && h_->lost; }
  /// Until when the lease is certain now (extended by each confirmed
  /// renewal, and through Sentinel by each check that the node is still the
  /// primary); `time_point::max()` for an endless lease. Not a guarantee
  /// across a failover: a promoted replica may lack the permit (replica
  /// lag) and grant it again after its restart grace, while this process
  /// renewed on the old primary or was paused; the fencing token is the
  /// protection there (see `redis::semaphore`).
  [[nodiscard]] std::chrono::steady_clock::time_point certain_until() const {
    return h_ ? st_->certain(*h_) : std::chrono::steady_clock::time_point{};
  }
  /// Completes when the permit is lost (at once if it is). Throws
  /// `operation_aborted` when cancelled or when the permit is released
  /// meanwhile, `std::logic_error` when empty. Resumes on the caller's
  /// executor. The permit must outlive the wait.
  [[nodiscard]] asio::awaitable<void> wait_lost() const {
    auto h = h_;
    if (!h) throw std::logic_error("sluice::redis::semaphore::permit::wait_lost: empty permit");
    while (!h->lost) {
      if (h->released) throw system_error(asio::error::operation_aborted);
      error_code ec;
      co_await h->signal.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      auto cs = co_await asio::this_coro::cancellation_state;
      if (!h->lost && cs.cancelled() != asio::cancellation_type::none)
        throw system_error(asio::error::operation_aborted);
    }
  }

 private:
  friend struct detail::redis_sem_permit_access;
  semaphore_permit(std::shared_ptr<state> st, held_ptr h) noexcept
      : st_(std::move(st)), h_(std::move(h)) {
    h_->owned = true;
  }
  std::shared_ptr<state> st_;
  held_ptr h_;
};

}  // namespace sluice::redis

namespace sluice::detail {

// How the semaphore makes a permit of a grant, and run() watches its lease.
struct redis_sem_permit_access {
  static redis::semaphore_permit make(std::shared_ptr<redis_sem_state> st,
                                      redis_sem_state::held_ptr h) noexcept {
    return redis::semaphore_permit(std::move(st), std::move(h));
  }
  static const redis_sem_state::held_ptr& held(const redis::semaphore_permit& p) noexcept {
    return p.h_;
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_SEMAPHORE_PERMIT_HPP
