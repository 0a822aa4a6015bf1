// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_RESULT_RING_HPP
#define SLUICE_DETAIL_RESULT_RING_HPP

#include <sluice/config.hpp>

#include <cstddef>
#include <deque>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// The finished, unread results of a stream, first in first out: a ring
// buffer whose capacity (a power of two) doubles when it is full. A stream
// never holds more than `limit` results (each keeps its slot until it is
// read), so the ring stops growing at the first power of two >= limit and a
// steady stream allocates nothing. Cheaper per result than std::deque, which
// allocates and frees a block every few hundred bytes as results cycle.
//
// Invariants: cap_ is 0 or a power of two; the size_ elements live at
// data_[(head_ + i) & (cap_ - 1)], i < size_. Not copyable (a stream's state).
template <class T>
class result_ring {
 public:
  result_ring() = default;
  result_ring(const result_ring&) = delete;
  result_ring& operator=(const result_ring&) = delete;
  ~result_ring() {
    clear();
    if (data_ != nullptr) std::allocator<T>().deallocate(data_, cap_);
  }

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  // Precondition: !empty().
  T& front() noexcept { return data_[head_]; }

  // has_room(): emplace_back_in_room() may be called (no growth needed).
  static constexpr bool can_check_room = true;
  [[nodiscard]] bool has_room() const noexcept { return size_ != cap_; }
  // Precondition: has_room().
  template <class... A>
  void emplace_back_in_room(A&&... a) {
    ::new (static_cast<void*>(data_ + ((head_ + size_) & (cap_ - 1)))) T(std::forward<A>(a)...);
    ++size_;
  }

  // Strong guarantee: if growing or T's constructor throws, nothing changed
  // but (perhaps) the capacity (T nothrow-movable or copyable: see the
  // specialization below for the others).
  template <class... A>
  void emplace_back(A&&... a) {
    if (size_ == cap_) grow();
    ::new (static_cast<void*>(data_ + ((head_ + size_) & (cap_ - 1)))) T(std::forward<A>(a)...);
    ++size_;
  }

  // Precondition: !empty().
  void pop_front() noexcept {
    data_[head_].~T();
    head_ = (head_ + 1) & (cap_ - 1);
    --size_;
  }

  void clear() noexcept {
    while (size_ != 0) pop_front();
    head_ = 0;
  }

 private:
  [[gnu::noinline]] void grow() {
    const std::size_t cap = cap_ == 0 ? 8 : cap_ * 2;
    T* data = std::allocator<T>().allocate(cap);
    std::size_t moved = 0;
    try {
      for (; moved < size_; ++moved)
        ::new (static_cast<void*>(data + moved))
            T(std::move_if_noexcept(data_[(head_ + moved) & (cap_ - 1)]));
    } catch (...) {
      while (moved != 0) data[--moved].~T();
      std::allocator<T>().deallocate(data, cap);
      throw;
    }
    const std::size_t size = size_;
    clear();  // destroys the moved-from elements
    if (data_ != nullptr) std::allocator<T>().deallocate(data_, cap_);
    data_ = data;
    cap_ = cap;
    head_ = 0;
    size_ = size;
  }

  T* data_ = nullptr;
  std::size_t cap_ = 0;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

// A T that can only be moved, by a move that may throw, cannot be relocated
// with the strong guarantee: a move failing midway would leave the waiting
// results moved-from. Such results stay in a std::deque, which never moves
// its elements.
template <class T>
requires(!std::is_nothrow_move_constructible_v<T> &&
         !std::is_copy_constructible_v<T>) class result_ring<T> {
 public:
  result_ring() = default;
  result_ring(const result_ring&) = delete;
  result_ring& operator=(const result_ring&) = delete;

  static constexpr bool can_check_room = false;
  [[nodiscard]] bool empty() const noexcept { return items_.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return items_.size(); }
  T& front() noexcept { return items_.front(); }
  template <class... A>
  void emplace_back(A&&... a) {
    items_.emplace_back(std::forward<A>(a)...);
  }
  void pop_front() noexcept { items_.pop_front(); }
  void clear() noexcept { items_.clear(); }

 private:
  std::deque<T> items_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_RESULT_RING_HPP
