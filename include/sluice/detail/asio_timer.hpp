// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ASIO_TIMER_HPP
#define SLUICE_DETAIL_ASIO_TIMER_HPP

// Asio's steady timer, on the selected backend: apart from detail/asio.hpp,
// which every header includes, for the few that use it (its header and what
// it pulls in cost every translation unit that includes it).

#include <sluice/config.hpp>

#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio/steady_timer.hpp>
#else
#include <asio/steady_timer.hpp>
#endif

#endif  // SLUICE_DETAIL_ASIO_TIMER_HPP
