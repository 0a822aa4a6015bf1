// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_FAIR_LIMIT_KEY_HPP
#define SLUICE_FAIR_LIMIT_KEY_HPP

#include <sluice/concepts.hpp>
#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <utility>

namespace sluice {

/// One key of a `fair_limit` as a limit of its own, for a call policy
/// (`sluice::shed(view, {...})`): what `fair_limit::for_key(key)` returns
/// (`fair_limit<L, Key>::key_view`). `scoped_acquire()` / `acquire(n)` /
/// `try_acquire(n)` are the `fair_limit`'s for that key. Must not outlive it.
template <class F>
class fair_limit_key {
  using L = typename F::limit_type;
  using Key = typename F::key_type;

 public:
  /// `scoped_acquire(key)` of the `fair_limit`.
  [[nodiscard]] auto scoped_acquire() requires permit_limit<L> { return f_->scoped_acquire(k_); }
  /// `acquire(key, n)` of the `fair_limit`.
  [[nodiscard]] asio::awaitable<void> acquire(std::size_t n = 1) requires unit_limit<L> {
    return f_->acquire(k_, n);
  }
  /// `try_acquire(key, n)` of the `fair_limit`.
  [[nodiscard]] bool try_acquire(std::size_t n = 1) requires unit_limit<L> {
    return f_->try_acquire(k_, n);
  }
  /// The key.
  [[nodiscard]] const Key& key() const noexcept { return k_; }

 private:
  friend F;
  fair_limit_key(F& f, Key k) : f_(&f), k_(std::move(k)) {}
  F* f_;
  Key k_;
};

}  // namespace sluice

#endif  // SLUICE_FAIR_LIMIT_KEY_HPP
