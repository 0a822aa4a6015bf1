// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_SEMAPHORE_OPS_HPP
#define SLUICE_REDIS_DETAIL_SEMAPHORE_OPS_HPP

// The longer operations of redis::semaphore, on its shared state: acquire in
// its three shapes (permit, void, error_code), run(body) with its lease
// watch, and stop/close.

#include <sluice/config.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/redis/connection.hpp>
#include <sluice/redis/detail/script.hpp>
#include <sluice/redis/detail/semaphore_loops.hpp>
#include <sluice/redis/detail/semaphore_state.hpp>
#include <sluice/redis/semaphore_permit.hpp>

#include <sluice/detail/asio.hpp>
#include <sluice/detail/asio_timer.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// What semaphore::run(body) returns: body(fencing token) or body().
template <class F, bool = std::is_invocable_v<F&, std::int64_t>>
struct redis_run_result {
  using type = std::invoke_result_t<F&, std::int64_t>;
};
template <class F>
struct redis_run_result<F, false> {
  using type = std::invoke_result_t<F&>;
};

// scoped_acquire(): a grant, owned by a permit.
inline asio::awaitable<redis::semaphore_permit> redis_sem_scoped_acquire(
    std::shared_ptr<redis_sem_state> st) {
  redis_sem_state::held_ptr h = co_await redis_without_throw_if_cancelled(redis_sem_acquire(st));
  co_return redis_sem_permit_access::make(st, std::move(h));
}

// acquire(): a grant that release() returns.
inline asio::awaitable<void> redis_sem_acquire_void(std::shared_ptr<redis_sem_state> st) {
  co_await redis_sem_acquire(st);
}

// async_acquire(): a grant, or the error as a code.
inline asio::awaitable<error_code> redis_sem_acquire_ec(std::shared_ptr<redis_sem_state> st) {
  try {
    co_await redis_without_throw_if_cancelled(redis_sem_acquire(st));
  } catch (const system_error& e) {
    co_return e.code();
  } catch (const redis::server_error&) {
    co_return redis::make_error_code(redis::errc::protocol_error);
  }
  co_return error_code{};
}

// run(body): the body runs in a task of its own while this coroutine watches
// for the lease's loss or the caller's cancellation; either cancels the body
// (terminal), which is then awaited with the caller's cancellation shut off.
template <class F>
auto redis_sem_run(std::shared_ptr<redis_sem_state> st, F body) ->
    typename redis_run_result<F>::type {
  using awaitable_t = typename redis_run_result<F>::type;
  using value_t = typename awaitable_t::value_type;
  redis::semaphore_permit p = co_await redis_sem_scoped_acquire(st);
  auto h = redis_sem_permit_access::held(p);
  auto ex = co_await asio::this_coro::executor;
  auto cs = co_await asio::this_coro::cancellation_state;
  asio::cancellation_signal stop_body;
  asio::steady_timer wake(ex, redis_clock::time_point::max());
  bool done = false;
  bool stopping = false;
  std::exception_ptr error;
  std::optional<std::conditional_t<std::is_void_v<value_t>, int, value_t>> value;
  h->on_lost = [&wake] {
    wake.cancel();
  };
  auto on_done = [&](std::exception_ptr e, auto... v) {
    done = true;
    error = e;
    if constexpr (sizeof...(v) == 1) {
      if (!e) value.emplace(std::move(v)...);
    }
    wake.cancel();
  };
  auto start = [&] {
    if constexpr (std::is_invocable_v<F&, std::int64_t>) {
      return body(h->token);
    } else {
      return body();
    }
  };
  asio::co_spawn(ex, start(), asio::bind_cancellation_slot(stop_body.slot(), on_done));
  while (!done) {
    if (!stopping && (h->lost || cs.cancelled() != asio::cancellation_type::none)) {
      stopping = true;
      stop_body.emit(asio::cancellation_type::terminal);
      continue;
    }
    error_code ec;
    if (stopping) {
      co_await wake.async_wait(asio::bind_cancellation_slot(
          asio::cancellation_slot(), asio::redirect_error(asio::use_awaitable, ec)));
    } else {
      co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
  }
  h->on_lost = nullptr;
  if (h->lost && stopping) throw redis::lease_lost();
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<value_t>) co_return std::move(*value);
}

// Stops renewing, releases the permits still held (pipelined) and wakes the
// waiters (they end with operation_aborted). Idempotent.
inline void redis_sem_stop(const std::shared_ptr<redis_sem_state>& self) noexcept {
  auto& st = *self;
  if (st.stopped) return;
  st.stopped = true;
  st.renew_timer.cancel();
  st.watchdog.cancel();
  while (!st.held.empty()) st.release(st.held.back(), self);
  st.wake(st.waiters.size());
  if (st.sub) {
    st.sub->on_message(nullptr);
    st.sub->on_lost(nullptr);
  }
}

// close(): stop, wait for the renewal loop, close the subscriber; runs to the
// end even when the caller was cancelled.
inline asio::awaitable<void> redis_sem_close(std::shared_ptr<redis_sem_state> st) {
  redis_sem_stop(st);
  const bool was = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  if (st->renewing) {
    auto token = asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable);
    auto init = [p = st.get()](auto&& handler) {
      p->renewal_done.emplace_back(std::forward<decltype(handler)>(handler),
                                   p->conn->get_executor());
    };
    auto op = asio::async_initiate<decltype(token), void()>(init, token);
    co_await std::move(op);
  }
  if (auto sub = std::exchange(st->sub, nullptr)) co_await sub->close();
  co_await asio::this_coro::throw_if_cancelled(was);
}

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_SEMAPHORE_OPS_HPP
