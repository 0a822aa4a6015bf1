// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STRAND_HOP_HPP
#define SLUICE_DETAIL_STRAND_HOP_HPP

#include <sluice/config.hpp>
#include <sluice/detail/caller_return.hpp>

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
//   cleared by the completion, which runs on the caller's executor); the
//   strand side only moves the handler into the completion's post, under the
//   caller's loop lock (hop_return);
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

// Hands on what a successful call produced, for a caller that will never see
// it (strand_bound's pass-on: a permit released, a start kept, a result
// dropped).
template <class R, class Lost>
void hand_on(hop_box<R>& box, Lost& lost) {
  if constexpr (std::is_void_v<R>) {
    lost();
  } else {
    lost(std::move(*box.value));
  }
}

// The caller's completion in flight to its executor. Run, it resumes the
// caller. Dropped unrun (the caller's loop destroyed with it queued), it hands
// a successful call's result on first (posts only: thread-safe), then the
// handler, the caller's frame, dies there with its loop.
template <class R, class Handler, class Lost>
class hop_completion {
  // Not `executor_type`: Asio would take the completion for a handler with an
  // executor of its own.
  using work_executor = asio::associated_executor_t<Handler, asio::any_io_executor>;

 public:
  hop_completion(Handler&& h, asio::executor_work_guard<work_executor>&& w, std::exception_ptr e,
                 std::shared_ptr<hop_box<R>> b, Lost&& lost)
      : handler_(std::move(h)),
        work_(std::move(w)),
        error_(std::move(e)),
        box_(std::move(b)),
        lost_(std::move(lost)) {}
  hop_completion(hop_completion&& o)
      : handler_(std::move(o.handler_)),
        work_(std::move(o.work_)),
        error_(std::move(o.error_)),
        box_(std::move(o.box_)),
        lost_(std::move(o.lost_)) {
    o.handler_.reset();
  }
  hop_completion& operator=(hop_completion&&) = delete;
  ~hop_completion() {
    if (!handler_) return;  // run, or moved from
    if (!error_) {
      try {
        hand_on(*box_, lost_);
      } catch (...) {  // out of memory for the release's post: nothing else to do
      }
    }
    auto slot = asio::get_associated_cancellation_slot(*handler_);
    if (slot.is_connected()) slot.clear();
  }

  void operator()() {
    Handler h(std::move(*handler_));
    handler_.reset();
    auto slot = asio::get_associated_cancellation_slot(h);
    if (slot.is_connected()) slot.clear();
    work_.reset();
    std::move(h)(error_);
  }

 private:
  std::optional<Handler> handler_;
  asio::executor_work_guard<work_executor> work_;
  std::exception_ptr error_;
  std::shared_ptr<hop_box<R>> box_;
  Lost lost_;
};

// The caller's side of one call (see caller_return), shared by the strand
// side until the completion is posted. If the caller's loop is destroyed
// first, on_end destroys the handler there and forwards a terminal
// cancellation to the strand; the strand side then finds the hook detached,
// posts nothing into the dead loop, and hands on what the call was granted
// (see hop_finish).
template <class R, class Handler>
struct hop_return final
    : caller_return<Handler, asio::associated_executor_t<Handler, asio::any_io_executor>> {
  using executor_type = asio::associated_executor_t<Handler, asio::any_io_executor>;

  hop_return(Handler&& h, executor_type ex, std::weak_ptr<hop_box<R>> b, asio::any_io_executor s)
      : caller_return<Handler, executor_type>(std::move(h), std::move(ex)),
        box(std::move(b)),
        strand(std::move(s)) {
    this->on_end = &orphan;
  }
  hop_return(const hop_return&) = delete;
  hop_return& operator=(const hop_return&) = delete;
  ~hop_return() { this->unwatch(); }  // before box and strand go: orphan reads them

  // On the strand: posts the caller's completion (which takes `lost` along)
  // to its executor. False when the caller's loop has ended: nothing was
  // posted, the caller is gone, `lost` is left to the strand side.
  template <class Lost>
  bool resume(std::exception_ptr e, const std::shared_ptr<hop_box<R>>& b, Lost& lost) {
    return this->post_back([&] {
      auto ex = this->work->get_executor();
      asio::post(ex,
                 hop_completion<R, Handler, Lost>(std::move(*this->handler), std::move(*this->work),
                                                  std::move(e), b, std::move(lost)));
      this->drop();
    });
  }

  // At the caller's loop's end (its destroying thread, under its lock).
  static void orphan(loop_hook* hook) noexcept {
    auto* self = static_cast<hop_return*>(hook);
    if (self->handler) {
      auto slot = asio::get_associated_cancellation_slot(*self->handler);
      if (slot.is_connected()) slot.clear();
    }
    self->drop();
    try {  // the wait on the strand need not go on for nobody
      asio::post(self->strand, [b = self->box.lock()] {
        if (b && !b->finished) b->signal.emit(asio::cancellation_type::terminal);
      });
    } catch (...) {  // out of memory: the wait goes on; its grant is handed on
    }
  }

  std::weak_ptr<hop_box<R>> box;
  asio::any_io_executor strand;
};

// The strand coroutine's completion handler (runs on the strand): marks the
// call finished and posts the caller's completion to the caller's executor.
// If the caller's loop is gone, a successful call's result goes to `lost`
// instead. Destroyed unrun (the strand's loop destroyed with the call queued
// or waiting there: nothing was granted), it resumes the caller with
// operation_aborted, so a caller on a live loop is not left unresumed.
template <class R, class Handler, class Lost>
struct hop_finish {
  hop_finish(std::shared_ptr<hop_box<R>> b, std::shared_ptr<hop_return<R, Handler>> c, Lost l)
      : box(std::move(b)), caller(std::move(c)), lost(std::move(l)) {}
  hop_finish(hop_finish&&) = default;  // the moved-from one has no caller
  hop_finish& operator=(hop_finish&&) = delete;
  ~hop_finish() {
    if (!caller) return;  // run, or moved from
    box->finished = true;
    try {
      caller->resume(std::make_exception_ptr(system_error(asio::error::operation_aborted,
                                                          "sluice::strand_bound: the loop ended")),
                     box, lost);
    } catch (...) {  // out of memory for the post: the caller is dropped with its hook
    }
  }

  std::shared_ptr<hop_box<R>> box;
  std::shared_ptr<hop_return<R, Handler>> caller;
  Lost lost;
  void operator()(std::exception_ptr e) {
    const auto c = std::move(caller);
    box->finished = true;
    if (c->resume(e, box, lost) || e) return;
    hand_on(*box, lost);
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

  template <class Handler, class Make, class Fast, class Lost>
  void operator()(Handler&& handler, Make make, Fast fast, Lost lost) const {
    using H = std::decay_t<Handler>;
    auto box = std::make_shared<hop_box<R>>();
    *out = box;
    auto work_ex = asio::get_associated_executor(handler, strand);
    auto caller = std::make_shared<hop_return<R, H>>(H(std::forward<Handler>(handler)),
                                                     std::move(work_ex), box, strand);
    auto slot = asio::get_associated_cancellation_slot(*caller->handler);
    if (slot.is_connected()) slot.template emplace<hop_forward_cancel<R>>(box, strand);
    caller->watch();
    // Posted after the slot is armed: a forwarded cancellation reaches the
    // strand after the start (a strand runs what one thread posts in order).
    // The completion goes along from the start: if the post is dropped unrun
    // (the strand's loop destroyed first), it resumes the caller aborted.
    asio::post(strand, [s = strand, box,
                        fin = hop_finish<R, H, Lost>(box, std::move(caller), std::move(lost)),
                        make = std::move(make), fast = std::move(fast)]() mutable {
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
        fin(error);
        return;
      }
      auto cs = box->signal.slot();
      asio::co_spawn(s, hop_body<R>(box, std::move(make)),
                     asio::bind_cancellation_slot(cs, std::move(fin)));
    });
  }
};

// Runs make() -> asio::awaitable<R> as a coroutine on `strand` and returns its
// result (or rethrows its exception) on the awaiting coroutine's executor.
// The caller's cancellation is forwarded to it. First, on the strand, fast()
// (void calls only): true means the call is done without waiting (a free
// permit taken by try_acquire), and no coroutine is started. If the caller's
// loop is destroyed before the caller resumed, the caller's frame goes with
// it and a successful call's result is handed to lost() (lost(R), or lost()
// for void): on the strand, or on the thread that destroys that loop when the
// completion was already queued there. Precondition: the caller is not on `strand`
// (strand_bound calls make() directly there).
template <class R, class Make, class Lost, class Fast = no_fast_path>
asio::awaitable<R> hop(asio::any_io_executor strand, Make make, Lost lost, Fast fast = {}) {
  static_assert(std::is_void_v<R> || std::is_same_v<Fast, no_fast_path>);
  std::shared_ptr<hop_box<R>> box;
  hop_initiation<R> init{std::move(strand), &box};
  co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(std::exception_ptr)>(
      std::move(init), asio::use_awaitable, std::move(make), std::move(fast), std::move(lost));
  if constexpr (!std::is_void_v<R>) co_return std::move(*box->value);
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STRAND_HOP_HPP
