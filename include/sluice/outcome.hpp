// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_OUTCOME_HPP
#define SLUICE_OUTCOME_HPP

#include <sluice/config.hpp>

#include <exception>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>

namespace sluice {

namespace detail {

// The exception `e` holds, if it is an `E` (or derived from it); null otherwise.
// On the Itanium C++ ABI (g++, clang++) std::rethrow_exception throws the
// object the exception_ptr owns, not a copy, so the pointer stays valid as
// long as an exception_ptr to it exists.
template <class E>
const E* exception_as(const std::exception_ptr& e) noexcept {
  if (!e) return nullptr;
  try {
    std::rethrow_exception(e);
  } catch (const E& x) {
    return &x;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace detail

/// Tag type of `sluice::return_exceptions`.
struct return_exceptions_t {
  explicit constexpr return_exceptions_t() = default;
};

/// Passed last to a fail-fast combinator (`gather`, `gather_with_concurrency`,
/// `map_unordered`), turns it into a settling one: nothing is cancelled when a
/// task fails, every task runs, and each result is an `outcome<T>`.
///
/// @code
/// auto results = co_await sluice::gather(tasks, sluice::return_exceptions);
/// for (auto& r : results)
///   if (!r) log(r.error());
/// @endcode
inline constexpr return_exceptions_t return_exceptions{};

/// The result of one task: a value of `T` (nothing for `void`) or the
/// exception it threw.
///
/// Never empty. `value()` rethrows the stored exception; `error()` is null when
/// a value is held; `error_as<E>()` gives the exception as an `E` (null when a
/// value is held or the exception is of another type), so a throttle can be told
/// from a failure without a rethrow-and-catch ladder.
///
/// @code
/// sluice::outcome<int> r = 42;
/// if (r) use(*r);
/// sluice::outcome<int> e = std::make_exception_ptr(std::runtime_error("boom"));
/// e.value();  // throws std::runtime_error
/// @endcode
template <class T>
class outcome {
  static_assert(!std::is_reference_v<T>, "sluice::outcome<T>: T must not be a reference");
  static_assert(!std::is_same_v<std::decay_t<T>, std::exception_ptr>,
                "sluice::outcome<T>: T must not be std::exception_ptr");

 public:
  using value_type = T;

  /// Holds a value.
  template <class U = T>
  requires std::is_constructible_v<T, U&&> &&(!std::is_same_v<std::remove_cvref_t<U>, outcome>)&&(
      !std::is_same_v<std::remove_cvref_t<U>, std::exception_ptr>)outcome(U&& value)
      : state_(std::in_place_index<0>, std::forward<U>(value)) {}

  /// Holds an exception. Throws `std::invalid_argument` for a null pointer.
  outcome(std::exception_ptr error) : state_(std::in_place_index<1>, check(std::move(error))) {}

  [[nodiscard]] bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value; rethrows the stored exception if there is none.
  T& value() & { return rethrow_if_error(), std::get<0>(state_); }
  const T& value() const& { return rethrow_if_error(), std::get<0>(state_); }
  T&& value() && { return rethrow_if_error(), std::get<0>(std::move(state_)); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The stored exception, or null when a value is held.
  [[nodiscard]] std::exception_ptr error() const noexcept {
    return has_value() ? nullptr : std::get<1>(state_);
  }

  /// The stored exception as an `E` (an exception of type `E` or derived from
  /// it), or null when a value is held or the exception is of another type.
  /// The pointer refers to the exception object this outcome holds: valid while
  /// the outcome (or a copy of `error()`) lives. Costs one rethrow per call.
  ///
  /// @code
  /// for (auto& r : results)
  ///   if (auto* t = r.template error_as<sluice::testing::throttled_error>())
  ///   retry_later(t->what());
  /// @endcode
  template <class E>
  [[nodiscard]] const E* error_as() const noexcept {
    return has_value() ? nullptr : detail::exception_as<E>(std::get<1>(state_));
  }

 private:
  static std::exception_ptr check(std::exception_ptr e) {
    if (!e) throw std::invalid_argument("sluice::outcome: null exception_ptr");
    return e;
  }
  void rethrow_if_error() const {
    if (!has_value()) std::rethrow_exception(std::get<1>(state_));
  }

  std::variant<T, std::exception_ptr> state_;
};

/// `outcome<void>`: success, or the exception the task threw.
template <>
class outcome<void> {
 public:
  using value_type = void;

  /// Success.
  outcome() noexcept = default;
  /// Holds an exception. Throws `std::invalid_argument` for a null pointer.
  outcome(std::exception_ptr error) : error_(std::move(error)) {
    if (!error_) throw std::invalid_argument("sluice::outcome: null exception_ptr");
  }

  [[nodiscard]] bool has_value() const noexcept { return !error_; }
  explicit operator bool() const noexcept { return has_value(); }
  /// Returns if successful; rethrows the stored exception otherwise.
  void value() const {
    if (error_) std::rethrow_exception(error_);
  }
  [[nodiscard]] std::exception_ptr error() const noexcept { return error_; }
  /// The stored exception as an `E`, or null (see `outcome<T>::error_as`).
  template <class E>
  [[nodiscard]] const E* error_as() const noexcept {
    return detail::exception_as<E>(error_);
  }

 private:
  std::exception_ptr error_;
};

}  // namespace sluice

#endif  // SLUICE_OUTCOME_HPP
