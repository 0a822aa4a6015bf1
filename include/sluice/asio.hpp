// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_ASIO_HPP
#define SLUICE_ASIO_HPP

/// @file
/// All of Asio, from the backend sluice is configured with, named `asio` on
/// both backends: for programs that build on standalone Asio and on
/// Boost.Asio alike (the examples use it).
///
/// - Standalone Asio (the default): includes `<asio.hpp>` and
///   `<asio/experimental/awaitable_operators.hpp>`; `asio` is Asio's own
///   namespace.
/// - Boost.Asio (`SLUICE_USE_BOOST_ASIO`): includes `<boost/asio.hpp>` and
///   `<boost/asio/experimental/awaitable_operators.hpp>`, and declares
///   `namespace asio = boost::asio;` at global scope. Do not also include
///   standalone Asio in such a program: both would claim the name `asio`.
///
/// Opt-in, and not part of `<sluice/sluice.hpp>`: it brings in the whole of
/// Asio and, on Boost, a global name.
///
/// Without it, do not write `namespace asio = sluice::asio;` at global scope:
/// on standalone Asio the global `asio` already is Asio's own namespace, and
/// clang rejects the alias (`redefinition of 'asio'`; g++ 12 accepts it, so
/// the mistake shows up only on the other compiler). Spellings that compile on
/// both compilers and both backends: a name of your own at global scope
/// (`namespace net = sluice::asio;`), or the alias inside your own namespace
/// (`namespace app { namespace asio = sluice::asio; }`).
///
/// @code
/// #include <sluice/sluice.hpp>
/// #include <sluice/asio.hpp>
///
/// int main() {
///   asio::io_context ctx;   // standalone Asio or Boost.Asio, as configured
///   asio::co_spawn(ctx, sluice::sleep(std::chrono::seconds(1)), [](std::exception_ptr e) {
///     if (e) std::rethrow_exception(e);   // out of ctx.run(): nothing is dropped
///   });
///   ctx.run();
/// }
/// @endcode

#include <sluice/config.hpp>

#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
/// Boost.Asio under the name standalone Asio has, at global scope (only with
/// `SLUICE_USE_BOOST_ASIO`; see the file comment).
namespace asio = ::boost::asio;
#else
#include <asio.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#endif

#endif  // SLUICE_ASIO_HPP
