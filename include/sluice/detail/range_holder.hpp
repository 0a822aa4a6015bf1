// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RANGE_HOLDER_HPP
#define SLUICE_DETAIL_RANGE_HOLDER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/ranges.hpp>

#include <concepts>
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

// Where a cursor keeps an iterator or sentinel before begin() is called: the
// type itself when it can be made empty and assigned (every container's and
// most views'), an optional otherwise. Not an optional for all: std::optional
// of an iterator instantiates some 40 functions in every TU that fans out over
// that range type (issue 32: the fan-out TU's compile cost).
template <class X>
using cursor_slot =
    std::conditional_t<std::default_initializable<X> && std::is_move_assignable_v<X>, X,
                       std::optional<X>>;
template <class X>
X& slot_value(X& x) noexcept {
  return x;
}
template <class X>
X& slot_value(std::optional<X>& x) noexcept {
  return *x;
}

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
    return slot_value(it_) == slot_value(end_);
  }
  // Takes the current element and advances. Precondition: !done() (which
  // began the range). An owned
  // range's elements are moved out; a borrowed (lvalue) range belongs to the
  // caller and is copied from, never emptied (a lazy view's prvalues are
  // moved either way).
  auto take() {
    auto& it = slot_value(it_);
    if constexpr (std::is_lvalue_reference_v<R>) {
      auto value = *it;
      ++it;
      return value;
    } else {
      auto value = std::ranges::iter_move(it);
      ++it;
      return value;
    }
  }
  range_type& range() noexcept { return holder_.get(); }

 private:
  void begin_once() {
    if (begun_) [[likely]]
      return;
    it_ = std::ranges::begin(holder_.get());
    end_ = std::ranges::end(holder_.get());
    begun_ = true;
  }

  range_holder<R> holder_;
  cursor_slot<std::ranges::iterator_t<range_type>> it_;
  cursor_slot<std::ranges::sentinel_t<range_type>> end_;
  bool begun_ = false;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RANGE_HOLDER_HPP
