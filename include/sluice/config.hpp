// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_CONFIG_HPP
#define SLUICE_CONFIG_HPP

/// @file
/// Configuration shared by every sluice header. Include it (directly or through
/// any sluice header) *before* any Asio header.
///
/// Asio 1.22 detects C++20 coroutines on clang only through libc++'s
/// `<experimental/coroutine>`, so clang with libstdc++ sees no `co_await`
/// support. sluice turns it on (`ASIO_HAS_CO_AWAIT`, `ASIO_HAS_STD_COROUTINE`)
/// when the compiler provides `<coroutine>`. The `sluice::sluice` CMake target
/// also defines both macros, so projects that link it never notice.
///
/// Configuration points:
/// - `SLUICE_AFFINITY_CHECKS`: 1 to check in primitives that they are used from
///   the thread running their loop (aborts with a message naming the primitive).
///   Defaults to 1 when `NDEBUG` is not defined, 0 otherwise.

#if defined(__clang__) && !defined(ASIO_HAS_CO_AWAIT)
// Asio decides coroutine support when <asio/awaitable.hpp> is first included;
// enabling it afterwards is too late.
#if defined(ASIO_AWAITABLE_HPP)
#error \
    "sluice: Asio was included before sluice and, on clang with libstdc++, Asio 1.22 does not enable coroutines. Include <sluice/...> first, link the sluice::sluice CMake target, or compile with -DASIO_HAS_CO_AWAIT=1 -DASIO_HAS_STD_COROUTINE=1."
#endif
#if __has_include(<coroutine>) && defined(__cpp_impl_coroutine)
#define ASIO_HAS_CO_AWAIT 1
#if !defined(ASIO_HAS_STD_COROUTINE)
#define ASIO_HAS_STD_COROUTINE 1
#endif
#endif
#endif

#include <asio/version.hpp>

#if ASIO_VERSION < 102201
#error "sluice needs Asio 1.22.1 or newer (Debian: libasio-dev)."
#endif

#include <asio/awaitable.hpp>

#if !defined(ASIO_HAS_CO_AWAIT)
#error "sluice needs C++20 coroutines: compile with -std=c++20 (g++ >= 12, clang++ >= 14)."
#endif

#if !defined(SLUICE_AFFINITY_CHECKS)
#if defined(NDEBUG)
#define SLUICE_AFFINITY_CHECKS 0
#else
#define SLUICE_AFFINITY_CHECKS 1
#endif
#endif

#endif  // SLUICE_CONFIG_HPP
