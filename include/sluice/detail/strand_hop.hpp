// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STRAND_HOP_HPP
#define SLUICE_DETAIL_STRAND_HOP_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// One call run on a strand for a caller on another executor: strand_bound's
// machinery. The caller's coroutine suspends in hop(); the call is posted to
// the strand (hop 1), runs there as a coroutine of its own, and its end posts
// the caller's completion to the caller's executor (hop 2).
//
// Thread rules (each field is touched on one side only, or handed over by a
// post, which orders the accesses):
// - caller side: the handler, its cancellation slot (armed at initiation,
//   cleared by the completion, which runs on the caller's executor);
// - strand side: `signal` (the strand coroutine's cancellation) and
//   `finished`; a cancellation of the caller is forwarded by a post to the
//   strand and emitted there only while the call has not finished;
// - `value` is written on the strand before the completion is posted and read
//   by the caller after it resumed.
// The box is shared (the caller's frame, the strand coroutine, forwarded
// cancellations), so nothing dangles whichever side ends first, even when a
// post is dropped at shutdown.
template <class R>
struct hop_box {
  asio::cancellation_signal signal;
  bool finished = false;
  std::optional<std::conditional_t<std::is_void_v<R>, char, R>> value;
};

// Installed in the caller's cancellation slot: forwards to the strand.
template <class R>
struct hop_forward_cancel {
  hop_forward_cancel(std::shared_ptr<hop_box<R>> b, asio::any_io_executor s) noexcept
      : box(std::move(b)), strand(std::move(s)) {}
  std::shared_ptr<hop_box<R>> box;
  asio::any_io_executor strand;
  void operator()(asio::cancellation_type_t type) const {
    asio::post(strand, [b = box, type] {
      if (!b->finished) b->signal.emit(type);
    });
  }
};

// The caller's handler and a work guard on its executor (that loop keeps
// running while the call is on the strand), carried to the strand and back.
template <class Handler>
struct hop_handler {
  using executor_type = asio::associated_executor_t<Handler, asio::any_io_executor>;
  Handler handler;
  asio::executor_work_guard<executor_type> work;

  // Runs on the caller's executor.
  void complete(std::exception_ptr e) {
    auto slot = asio::get_associated_cancellation_slot(handler);
    if (slot.is_connected()) slot.clear();
    Handler h(std::move(handler));
    work.reset();
    std::move(h)(e);
  }
};

// The strand coroutine's completion handler (runs on the strand): marks the
// call finished and posts the caller's completion to the caller's executor.
template <class R, class Handler>
struct hop_finish {
  std::shared_ptr<hop_box<R>> box;
  hop_handler<Handler> caller;
  void operator()(std::exception_ptr e) {
    box->finished = true;
    auto ex = caller.work.get_executor();
    asio::post(ex, [c = std::move(caller), e]() mutable { c.complete(e); });
  }
};

template <class R, class Make>
asio::awaitable<void> hop_body(std::shared_ptr<hop_box<R>> box, Make make) {
  // Every kind the caller forwards (a coroutine passes on terminal only by
  // default; L's waits support partial and total too).
  co_await asio::this_coro::reset_cancellation_state(asio::enable_total_cancellation());
  if constexpr (std::is_void_v<R>) {
    co_await make();
  } else {
    box->value.emplace(co_await make());
  }
}

// The strand-side fast path of a call that has none.
struct no_fast_path {
  bool operator()() const noexcept { return false; }
};

template <class R>
struct hop_initiation {
  asio::any_io_executor strand;
  std::shared_ptr<hop_box<R>>* out;

  template <class Handler, class Make, class Fast>
  void operator()(Handler&& handler, Make make, Fast fast) const {
    using H = std::decay_t<Handler>;
    auto box = std::make_shared<hop_box<R>>();
    *out = box;
    auto work_ex = asio::get_associated_executor(handler, strand);
    hop_handler<H> caller{
        H(std::forward<Handler>(handler)),
        asio::executor_work_guard<typename hop_handler<H>::executor_type>(std::move(work_ex))};
    auto slot = asio::get_associated_cancellation_slot(caller.handler);
    if (slot.is_connected()) slot.template emplace<hop_forward_cancel<R>>(box, strand);
    // Posted after the slot is armed: a forwarded cancellation reaches the
    // strand after the start (a strand runs what one thread posts in order).
    asio::post(strand, [s = strand, box, caller = std::move(caller), make = std::move(make),
                        fast = std::move(fast)]() mutable {
      // The fast path: done at once on the strand (no coroutine); an
      // exception of it goes to the caller, not out of the strand's run().
      std::exception_ptr error;
      bool done = false;
      try {
        done = fast();
      } catch (...) {
        error = std::current_exception();
      }
      if (done || error) {
        hop_finish<R, H>{box, std::move(caller)}(error);
        return;
      }
      auto cs = box->signal.slot();
      asio::co_spawn(s, hop_body<R>(box, std::move(make)),
                     asio::bind_cancellation_slot(cs, hop_finish<R, H>{box, std::move(caller)}));
    });
  }
};

// Runs make() -> asio::awaitable<R> as a coroutine on `strand` and returns its
// result (or rethrows its exception) on the awaiting coroutine's executor.
// The caller's cancellation is forwarded to it. First, on the strand, fast()
// (void calls only): true means the call is done without waiting (a free
// permit taken by try_acquire), and no coroutine is started. Precondition:
// the caller is not on `strand` (strand_bound calls make() directly there).
template <class R, class Make, class Fast = no_fast_path>
asio::awaitable<R> hop(asio::any_io_executor strand, Make make, Fast fast = {}) {
  static_assert(std::is_void_v<R> || std::is_same_v<Fast, no_fast_path>);
  std::shared_ptr<hop_box<R>> box;
  hop_initiation<R> init{std::move(strand), &box};
  co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(std::exception_ptr)>(
      std::move(init), asio::use_awaitable, std::move(make), std::move(fast));
  if constexpr (!std::is_void_v<R>) co_return std::move(*box->value);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STRAND_HOP_HPP
