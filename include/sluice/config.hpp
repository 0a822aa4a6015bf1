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
/// - `SLUICE_USE_BOOST_ASIO`: define it (the CMake option of the same name does)
///   to build on Boost.Asio (Boost 1.80+) instead of standalone Asio. Public
///   signatures then read `boost::asio::awaitable<T>` and
///   `boost::system::error_code`: sluice names Asio only through the aliases
///   `sluice::asio`, `sluice::error_code` and `sluice::system_error`.
/// - `SLUICE_AFFINITY_CHECKS`: 1 to check in primitives that they are used
///   serially from their loop: no two threads inside at once, no io_context
///   run by several threads without a strand, no use from another thread while
///   the loop runs (aborts with a message naming the primitive; see
///   `sluice::semaphore`). Defaults to 1 when `NDEBUG` is not defined, 0
///   otherwise, which compiles the checks out entirely.
/// - `SLUICE_SEPARATE_COMPILATION`: define it in every translation unit of a
///   program (the `sluice::separate` CMake target does) to compile sluice's
///   type-independent machinery once instead of in every translation unit
///   that uses it, as `ASIO_SEPARATE_COMPILATION` does for Asio's: exactly
///   one translation unit includes `<sluice/src.hpp>` (the target builds it),
///   compiled with the same macros (Asio backend, `NDEBUG`,
///   `SLUICE_AFFINITY_CHECKS`) as the rest. Without it (the default) sluice is
///   header-only. See docs/performance.md, "Compile cost".

#if defined(SLUICE_USE_BOOST_ASIO)
// ---- Boost.Asio backend -------------------------------------------------
#include <boost/version.hpp>
#if BOOST_VERSION < 108000
#error \
    "sluice: SLUICE_USE_BOOST_ASIO needs Boost 1.80 or newer (Asio 1.24+, per-operation cancellation). Debian: apt-get install libboost1.81-dev."
#endif
#if defined(__clang__) && !defined(BOOST_ASIO_HAS_CO_AWAIT) && __has_include(<coroutine>) && \
    defined(__cpp_impl_coroutine)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#if !defined(BOOST_ASIO_HAS_STD_COROUTINE)
#define BOOST_ASIO_HAS_STD_COROUTINE 1
#endif
#endif
#include <boost/asio/awaitable.hpp>
#include <boost/asio/version.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>
#if !defined(BOOST_ASIO_HAS_CO_AWAIT)
#error "sluice needs C++20 coroutines: compile with -std=c++20 (g++ >= 12, clang++ >= 14)."
#endif
/// The selected Asio's version number (`BOOST_ASIO_VERSION` or `ASIO_VERSION`,
/// e.g. 102200 for Asio 1.22), for version checks.
#define SLUICE_ASIO_VERSION BOOST_ASIO_VERSION

namespace sluice {
/// The Asio sluice is built on: `boost::asio` when `SLUICE_USE_BOOST_ASIO` is
/// defined, standalone Asio (namespace `asio`) otherwise. Every public signature names Asio
/// through it, so the same headers serve both.
namespace asio = ::boost::asio;
/// The error code type of the selected Asio (`boost::system::error_code`).
using error_code = ::boost::system::error_code;
/// The exception type the selected Asio throws (`boost::system::system_error`).
using system_error = ::boost::system::system_error;
/// The error category base of the selected Asio.
using error_category = ::boost::system::error_category;
}  // namespace sluice

#else
// ---- standalone Asio (default) -----------------------------------------
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
#include <system_error>
/// The selected Asio's version number (`ASIO_VERSION`, e.g. 102200 for Asio 1.22).
#define SLUICE_ASIO_VERSION ASIO_VERSION

namespace sluice {
/// The Asio sluice is built on: standalone Asio (namespace `asio`) by default,
/// `boost::asio` when `SLUICE_USE_BOOST_ASIO` is defined.
namespace asio = ::asio;
/// The error code type of the selected Asio (`std::error_code`).
using error_code = std::error_code;
/// The exception type the selected Asio throws (`std::system_error`).
using system_error = std::system_error;
/// The error category base of the selected Asio.
using error_category = std::error_category;
}  // namespace sluice

#endif

#if !defined(SLUICE_AFFINITY_CHECKS)
#if defined(NDEBUG)
#define SLUICE_AFFINITY_CHECKS 0
#else
/// 1: primitives check they are used serially from their loop (the default
/// without `NDEBUG`); 0 compiles the checks out. See the file comment.
#define SLUICE_AFFINITY_CHECKS 1
#endif
#endif

// Separate compilation (see the file comment). SLUICE_DECL marks a function
// compiled once by <sluice/src.hpp> when SLUICE_SEPARATE_COMPILATION is
// defined, inline in every user otherwise; SLUICE_HEADER_DEFS says whether a
// header shows the definitions (its impl/*.ipp) to this translation unit.
#if defined(SLUICE_SEPARATE_COMPILATION)
#define SLUICE_DECL
#else
#define SLUICE_DECL inline
#endif
#if !defined(SLUICE_SEPARATE_COMPILATION) || defined(SLUICE_SOURCE)
#define SLUICE_HEADER_DEFS 1
#else
#define SLUICE_HEADER_DEFS 0
#endif

#endif  // SLUICE_CONFIG_HPP
