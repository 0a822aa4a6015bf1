// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_UNIQUE_PERMIT_HPP
#define SLUICE_DETAIL_UNIQUE_PERMIT_HPP

#include <sluice/detail/virtual_clock.hpp>

#include <utility>

namespace sluice::detail {

/// Move-only ownership of one permit of an `Owner` (a `semaphore`, a `lock`, a
/// `shared_semaphore`): releases it on destruction. Only the owner makes a
/// non-empty one, in its `scoped_acquire()`.
///
/// Not thread-safe itself (move it within one thread); whether it may be
/// destroyed on another thread than the one that acquired it is the owner's
/// rule. It must not outlive its owner.
// Invariant: owner_ is null or points at an owner from which exactly one
// permit was taken on this permit's behalf, at since_ on the owner's stats
// clock; reset() gives it back once through Owner::release_held(since_), which
// records the hold and must not throw for a permit it granted.
template <class Owner>
class unique_permit {
 public:
  /// An empty permit that owns nothing.
  unique_permit() noexcept = default;
  /// Takes over `other`'s ownership; `other` is left empty.
  unique_permit(unique_permit&& other) noexcept
      : owner_(std::exchange(other.owner_, nullptr)), since_(other.since_) {}
  /// Releases what this owns, then takes over `other`'s ownership.
  unique_permit& operator=(unique_permit&& other) noexcept {
    if (this != &other) {
      reset();
      owner_ = std::exchange(other.owner_, nullptr);
      since_ = other.since_;
    }
    return *this;
  }
  unique_permit(const unique_permit&) = delete;
  unique_permit& operator=(const unique_permit&) = delete;
  ~unique_permit() { reset(); }

  /// True while it owns a permit.
  explicit operator bool() const noexcept { return owner_ != nullptr; }

  /// Releases the permit now (no-op when empty).
  void reset() noexcept {
    if (Owner* o = std::exchange(owner_, nullptr)) o->release_held(since_);
  }

 private:
  friend Owner;
  unique_permit(Owner& o, clock::time_point since) noexcept : owner_(&o), since_(since) {}
  Owner* owner_ = nullptr;
  clock::time_point since_{};
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_UNIQUE_PERMIT_HPP
