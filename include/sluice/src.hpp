// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SRC_HPP
#define SLUICE_SRC_HPP

/// @file
/// sluice's type-independent machinery, compiled once: include this header in
/// exactly one translation unit of a program that defines
/// `SLUICE_SEPARATE_COMPILATION` everywhere (config.hpp says what that does;
/// the `sluice::separate` CMake target builds this for you), before any other
/// sluice header, with the same macros as the program's other translation
/// units. What it compiles: the functions the headers declare `SLUICE_DECL`
/// and the instantiations they declare `extern template` for Asio's default
/// executor, `asio::any_io_executor`.

#if !defined(SLUICE_SEPARATE_COMPILATION)
#error \
    "sluice/src.hpp: define SLUICE_SEPARATE_COMPILATION in every translation unit (or link the sluice::separate CMake target); without it sluice is header-only and needs no source file."
#endif
#if defined(SLUICE_CONFIG_HPP)
#error \
    "sluice/src.hpp: include it first, before any other sluice header, in its own translation unit."
#endif
#define SLUICE_SOURCE 1

#include <sluice/sluice.hpp>

namespace sluice {

template asio::awaitable<void> semaphore::acquire<void>();
template asio::awaitable<semaphore::permit> semaphore::scoped_acquire<void>();

namespace detail {

template std::shared_ptr<child_set> child_set::make<void>();
template std::size_t child_set::spawn(const asio::any_io_executor&, asio::awaitable<void>);
template asio::awaitable<void> child_set::join(const asio::any_io_executor&, error_code&);
template class erased_handler<>;
template class stream_workers<asio::any_io_executor>;
template class stream_consumer<asio::any_io_executor>;
template void loop_held_handler<>::hold(awaitable_handler_t<void()>&&,
                                        const asio::any_io_executor&);

}  // namespace detail

// The umbrella's cold paths (the rest of them are the SLUICE_DECL functions of
// impl/*.ipp, compiled by the includes above).
namespace detail {

template std::unique_ptr<wait_bound> wait_bound::make<void>(const shed_options&, const char*,
                                                            void (*)(void*), void*);

}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_SRC_HPP
