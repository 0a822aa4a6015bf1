// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_ASIO_HPP
#define SLUICE_TESTS_SUPPORT_ASIO_HPP

// Tests, examples and benchmarks name Asio as `asio::` whichever backend the
// build selected: under SLUICE_USE_BOOST_ASIO, `asio` is an alias of
// `boost::asio` (sluice itself uses `sluice::asio`).
#include <sluice/detail/asio.hpp>

#if defined(SLUICE_USE_BOOST_ASIO)
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_future.hpp>
namespace asio = ::boost::asio;
#else
#include <asio/bind_executor.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/awaitable_operators.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_future.hpp>
#endif

#include <utility>

namespace sluice_test {

// Like asio::bind_cancellation_slot(slot, f), but the handler exposes its slot
// itself. Asio 1.24+ (Boost 1.80+) dispatches co_spawn's cancellation to the
// executor of a handler whose associated executor is specialised (the
// binder's is), so an emit() from outside the loop would take effect only
// after the coroutine ran; with this handler it is emitted at once, as in
// Asio 1.22, on every version.
template <class F>
struct slot_handler {
  asio::cancellation_slot slot;
  F f;
  using cancellation_slot_type = asio::cancellation_slot;
  cancellation_slot_type get_cancellation_slot() const noexcept { return slot; }
  template <class... Args>
  void operator()(Args&&... args) {
    f(std::forward<Args>(args)...);
  }
};

template <class F>
slot_handler<F> bind_slot(asio::cancellation_slot slot, F f) {
  return {slot, std::move(f)};
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_ASIO_HPP
