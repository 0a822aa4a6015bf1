// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_CONCEPTS_HPP
#define SLUICE_CONCEPTS_HPP

#include <sluice/config.hpp>
#include <sluice/detail/ranges.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <cstddef>
#include <iterator>
#include <optional>
#include <type_traits>

namespace sluice {

namespace detail {
template <class A>
struct awaitable_traits {
  static constexpr bool value = false;
};
template <class T, class Executor>
struct awaitable_traits<asio::awaitable<T, Executor>> {
  static constexpr bool value = true;
  using result_type = T;
  using executor_type = Executor;
};
template <class O>
struct optional_traits {
  static constexpr bool value = false;
};
template <class U>
struct optional_traits<std::optional<U>> {
  static constexpr bool value = true;
  using value_type = U;
};
}  // namespace detail

/// An `asio::awaitable<T, Executor>`: one task.
template <class A>
concept task = detail::awaitable_traits<std::remove_cvref_t<A>>::value;

/// `T` of a task `asio::awaitable<T, Executor>`.
template <task A>
using task_result_t = typename detail::awaitable_traits<std::remove_cvref_t<A>>::result_type;

/// `Executor` of a task `asio::awaitable<T, Executor>`.
template <task A>
using task_executor_t = typename detail::awaitable_traits<std::remove_cvref_t<A>>::executor_type;

/// An input range (it may be lazy) whose elements are tasks.
/// A limit whose waits hand out a permit: `scoped_acquire()` (`semaphore`,
/// `adaptive_limit`, `shared_semaphore`, `strand_bound` of those).
template <class L>
concept permit_limit = requires(L& l) {
  { l.scoped_acquire() } -> task;
};

/// A limit that grants units, kept (a start, tokens): `acquire(n)`
/// (`rate_limiter`, `token_bucket`, `strand_bound` of those).
template <class L>
concept unit_limit = requires(L& l, std::size_t n) {
  { l.acquire(n) } -> std::same_as<asio::awaitable<void>>;
};

template <class R>
concept task_range = std::ranges::input_range<R> && task<std::ranges::range_value_t<R>>;

namespace detail {
// A range of tasks stored elsewhere and only lent out: a container passed as
// an lvalue, a span or a view of one (its elements are lvalues the caller can
// still reach). A fan-out would move each awaitable out, and an awaitable
// runs only once; such a range must be passed as an rvalue instead. A lazy
// range that makes each task on dereference (its reference type is not an
// lvalue reference) is fine as an lvalue.
template <class R>
concept lends_stored_tasks = std::ranges::borrowed_range<R> &&
    std::is_lvalue_reference_v<std::ranges::range_reference_t<R>> &&
    task<std::ranges::range_value_t<R>>;
}  // namespace detail

/// An asynchronous source: `next()` returns `asio::awaitable<std::optional<U>>`,
/// empty at the end. `sluice::stream<T>` is one.
///
/// @code
/// struct pages {  // a paginated listing API as a source of keys
///   asio::awaitable<std::optional<std::string>> next();
/// };
/// static_assert(sluice::async_source<pages>);
/// auto downloads = sluice::map_unordered(download, pages{...}, 5);
/// @endcode
template <class S>
concept async_source = requires(S& s) {
  { s.next() } -> task;
}
&&detail::optional_traits<task_result_t<decltype(std::declval<S&>().next())>>::value;

/// `U` of an async source whose `next()` yields `std::optional<U>`.
template <async_source S>
using async_source_value_t = typename detail::optional_traits<
    task_result_t<decltype(std::declval<S&>().next())>>::value_type;

}  // namespace sluice

#endif  // SLUICE_CONCEPTS_HPP
