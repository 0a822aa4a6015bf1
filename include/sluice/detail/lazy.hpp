// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_LAZY_HPP
#define SLUICE_DETAIL_LAZY_HPP

// Coroutines compiled only in the translation units that call them (issue 32).
//
// g++ 12 emits every coroutine a translation unit instantiates, called or not,
// with everything its body reaches: a header that instantiates one makes every
// includer compile it. Asio's `use_awaitable` initiation and `co_spawn`'s entry
// point are coroutines too, so a header's coroutine, and any call that passes
// `asio::use_awaitable` or reaches `asio::co_spawn`, must sit in a template
// and depend on its parameter: an expression that does not is instantiated
// where the template is defined. The pattern:
//
//   template <class Lazy = void>  // nobody writes the argument
//   asio::awaitable<void> wait() {
//     co_await async_wait(detail::lazy<Lazy>(asio::use_awaitable));
//   }
//
// `lazy<Lazy>(x)` is `x`, as an expression that depends on `Lazy`;
// `lazy_void<Body>` is `void`, as a type that depends on `Body` (`f<lazy_void<Body>>`
// in a template over Body instantiates `f<void>` once, and only with that template).

#include <sluice/config.hpp>

#include <type_traits>

namespace sluice::detail {

template <class Lazy, class T>
[[nodiscard]] constexpr T&& lazy(T&& value) noexcept {
  return static_cast<T&&>(value);
}

template <class Lazy>
using lazy_void = typename std::conditional<true, void, Lazy>::type;

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_LAZY_HPP
