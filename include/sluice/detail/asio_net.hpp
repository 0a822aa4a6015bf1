// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_ASIO_NET_HPP
#define SLUICE_DETAIL_ASIO_NET_HPP

// The Asio networking headers of the optional Redis client
// (include/sluice/redis/), from standalone Asio or Boost.Asio. Kept apart
// from detail/asio.hpp so that the core headers do not pull in sockets.
#include <sluice/detail/asio.hpp>

#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio/connect.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/write.hpp>
#else
#include <asio/connect.hpp>
#include <asio/generic/stream_protocol.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/local/stream_protocol.hpp>
#include <asio/write.hpp>
#endif

#endif  // SLUICE_DETAIL_ASIO_NET_HPP
