// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RANGE_HOLDER_HPP
#define SLUICE_DETAIL_RANGE_HOLDER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/ranges.hpp>

#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// Keeps the input of a fan-out alive for as long as the fan-out runs: an
// rvalue range is moved in and owned, an lvalue range is referenced (the
// caller keeps it alive until the awaited call returns). Replaces
// std::views::all, which clang 14 cannot instantiate with libstdc++ 12.
template <class R>
class range_holder {
 public:
  explicit range_holder(R&& r) : r_(std::move(r)) {}
  R& get() noexcept { return r_; }

 private:
  R r_;
};

template <class R>
class range_holder<R&> {
 public:
  explicit range_holder(R& r) noexcept : r_(std::addressof(r)) {}
  R& get() noexcept { return *r_; }

 private:
  R* r_;
};

// The iteration state of a held range, advanced one element at a time. The
// range's begin() is called at the first pull, not when the cursor is made,
// so a fan-out that is never awaited does no work on its input.
template <class R>
class range_cursor {
  using range_type = std::remove_reference_t<R>;

 public:
  explicit range_cursor(R&& r) : holder_(std::forward<R>(r)) {}
  range_cursor(const range_cursor&) = delete;
  range_cursor& operator=(const range_cursor&) = delete;

  bool done() {
    begin_once();
    return *it_ == *end_;
  }
  // Takes the current element and advances. Precondition: !done() (which
  // began the range). An owned
  // range's elements are moved out; a borrowed (lvalue) range belongs to the
  // caller and is copied from, never emptied (a lazy view's prvalues are
  // moved either way).
  auto take() {
    if constexpr (std::is_lvalue_reference_v<R>) {
      auto value = **it_;
      ++*it_;
      return value;
    } else {
      auto value = std::ranges::iter_move(*it_);
      ++*it_;
      return value;
    }
  }
  range_type& range() noexcept { return holder_.get(); }

 private:
  void begin_once() {
    if (it_) [[likely]]
      return;
    it_.emplace(std::ranges::begin(holder_.get()));
    end_.emplace(std::ranges::end(holder_.get()));
  }

  range_holder<R> holder_;
  std::optional<std::ranges::iterator_t<range_type>> it_;
  std::optional<std::ranges::sentinel_t<range_type>> end_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RANGE_HOLDER_HPP
