// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STREAM_CONSUMER_HPP
#define SLUICE_DETAIL_STREAM_CONSUMER_HPP

#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/stream_workers.hpp>
#include <sluice/detail/throw_error.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <stdexcept>
#include <utility>

namespace sluice::detail {

// The consumer side of one sluice::stream, all of it that does not depend on
// the result type: next()'s wait (resumed, cancelled, or served a burst of
// results by one post), the stream's first failure, its stop, and the
// bookkeeping of a sink (the sink itself and the buffer are typed: see
// stream_delivery, which derives from this). Compiled once per executor, with
// SLUICE_SEPARATE_COMPILATION once per program (issue 32: this was per result
// type, a coroutine body and a dozen functions in every TU that reads a
// stream).
//
// error_ is the first failure (a task's or the input's), never the aftermath of
// a stop; next() rethrows it once the buffer is drained and the stream finished.
template <class Executor>
class stream_consumer : public stream_workers<Executor> {
  using workers = stream_workers<Executor>;

 protected:
  explicit stream_consumer(std::size_t limit) : workers(limit) {}
  stream_consumer(const stream_consumer&) = delete;
  stream_consumer& operator=(const stream_consumer&) = delete;
  ~stream_consumer() = default;

  using workers::children_;
  using workers::consumer_;
  using workers::consumer_aborted_;
  using workers::consumer_on_ex_;
  using workers::deferring_kicks_;
  using workers::ex_;
  using workers::exhausted_;
  using workers::finished;
  using workers::input_exhausted;
  using workers::kick;
  using workers::kick_deferred_;
  using workers::live_;
  using workers::resume_parked;
  using workers::started_;
  using workers::stopping_;
  using workers::used_;

  // True while a result waits in the buffer (stream_delivery's).
  [[nodiscard]] virtual bool has_result() const noexcept = 0;

  // ---- worker side ---------------------------------------------------------

  // The first failure: fail fast (cancel = true) stops everything, cancelling
  // the running tasks but `self`; settling (cancel = false) only stops pulling.
  void fail(std::exception_ptr e, std::size_t self, bool cancel);
  void worker_left() {
    --live_;
    notify_consumer();
  }
  // An error of the stream's own machinery (a progress report that threw):
  // next() rethrows it at the end unless a failure came first.
  void report_error(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
  }
  void stop(std::size_t except = child_set::none);

  // A result the sink took: its slot goes back by one post per wave
  // (release_taken()), which also resumes the parked workers: results
  // finishing together (a burst) are all handed to the body before any freed
  // slot pulls an input, as when next() reads them.
  [[gnu::always_inline]] void sink_took() {
    if (taken_++ == 0) post_release();
  }
  [[gnu::noinline]] void post_release();
  // The slots of the results the sink took since the last call go back, and
  // the parked workers resume here, one after the other, for as long as slots
  // are free (their kicks deferred to this loop, as in resume_consumer()).
  void release_taken();

  // ---- consumer side -------------------------------------------------------

  // The waiter inside next(): completes when a result is buffered or the
  // stream finished; a cancelled consumer (cancelled while it waits, or
  // already before: cancel_now) stops the stream and completes with
  // operation_aborted once every worker has left (consumer_aborted_, read
  // when it resumes: no error_code through the handler, whose redirect_error
  // wrapper costs an initiation and a handler of its own per wave).
  asio::awaitable<void, Executor> consumer_wait(bool cancel_now);

  // next() when no result is buffered (stream_core::next(), which keeps `c`
  // alive): starts the stream at the first call, returns when a result is
  // buffered (next() takes it) or the stream has finished (the buffer empty),
  // and then shuts an owned input down if the stream was stopped, and throws
  // the consumer's cancellation or the stream's failure. awaitable<void>, not
  // a bool: every awaitable<T> type costs a TU some 15 functions of Asio's. `waited`: next() has
  // waited once already (`was`: its throw_if_cancelled before it turned it
  // off; `aborted`: that wait ended by the consumer's cancellation).
  static asio::awaitable<void, Executor> wait_result(stream_consumer* c, bool waited = false,
                                                     bool was = true, bool aborted = false);

  // consumer_wait()'s: the sink (if any) takes results while this consumer
  // waits: it runs on the workers' executor, the buffer is empty (next()
  // found nothing), nothing stopped. Every way the wait ends clears it.
  void consumer_waiting(bool cancel_now) {
    if (consumer_on_ex_ && !stopping_ && !cancel_now) sink_ = wanted_sink_;
  }
  void cancel_consumer();

  [[gnu::always_inline]] void notify_consumer() {
    if (consumer_) notify_waiting_consumer();
  }
  [[gnu::noinline]] void notify_waiting_consumer();

  // Hands the consumer a result (or the end) through one post that then also
  // serves the workers whose slots the consumer frees: while the consumer
  // runs there (until it suspends again), a kick that would wake a parked
  // worker through a post of its own is deferred, and the workers are resumed
  // in the same posted function right after the consumer (resume_parked()).
  // The workers still run only after the consumer has suspended.
  void resume_consumer();

  std::exception_ptr error_;
  // The typed sink (stream_delivery::sink) for_each's body set around its
  // next(), and the same while that next() waits (see consumer_waiting()).
  void* wanted_sink_ = nullptr;
  void* sink_ = nullptr;
  std::size_t taken_ = 0;  // slots of results the sink took, not yet given back
  bool consumer_cancelled_ = false;
};

// Out of the class: compiled once for Asio's default executor with
// SLUICE_SEPARATE_COMPILATION.

template <class Executor>
void stream_consumer<Executor>::fail(std::exception_ptr e, std::size_t self, bool cancel) {
  if (stopping_ || (exhausted_ && error_)) return;
  error_ = std::move(e);
  if (cancel) {
    stop(self);
  } else {
    input_exhausted();
  }
  notify_consumer();
}

template <class Executor>
void stream_consumer<Executor>::stop(std::size_t except) {
  stopping_ = true;
  this->ending_ = true;
  sink_ = nullptr;
  children_->cancel_all(except);
  this->wake_all();
}

template <class Executor>
void stream_consumer<Executor>::post_release() {
  this->post_call(this->shared_from_this(), [](workers& w, erased_handler<>&) {
    static_cast<stream_consumer&>(w).release_taken();
  });
}

template <class Executor>
void stream_consumer<Executor>::release_taken() {
  used_ -= std::exchange(taken_, 0);
  const bool outer = std::exchange(deferring_kicks_, true);
  kick();
  deferring_kicks_ = outer;
  if (std::exchange(kick_deferred_, false)) resume_parked();
}

template <class Executor>
asio::awaitable<void, Executor> stream_consumer<Executor>::consumer_wait(bool cancel_now) {
  return asio::async_initiate<const asio::use_awaitable_t<Executor>&, void()>(
      [this, cancel_now](auto handler) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        if (slot.is_connected() && !cancel_now) {
          slot.assign([this](asio::cancellation_type type) {
            if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                         asio::cancellation_type::total)) == asio::cancellation_type::none)
              return;
            cancel_consumer();
          });
        }
        // A consumer on another executor than the workers' (a stream moved
        // to another strand) is completed by a post of its own.
        consumer_on_ex_ = asio::get_associated_executor(handler, *ex_) == *ex_;
        consumer_aborted_ = false;
        consumer_.hold(std::move(handler), *ex_);
        consumer_waiting(cancel_now);
        if (cancel_now) cancel_consumer();
      },
      asio::use_awaitable_t<Executor>{});
}

template <class Executor>
asio::awaitable<void, Executor> stream_consumer<Executor>::wait_result(stream_consumer* c,
                                                                       bool waited, bool was,
                                                                       bool aborted) {
  bool cancelled = false;
  if (waited) {
    co_await asio::this_coro::throw_if_cancelled(was);
  } else {
    if (c->consumer_)
      throw std::logic_error(
          "sluice::stream::next: another next() is still waiting; a stream has one consumer");
    // A caller whose cancellation was requested before this call (only
    // possible with throw_if_cancelled(false): Asio throws at the co_await
    // otherwise) starts nothing, and is otherwise treated as one cancelled
    // while it waits: a result already waiting is still handed out.
    const auto state = co_await asio::this_coro::cancellation_state;
    cancelled = state.cancelled() != asio::cancellation_type::none;
    if (!c->started_ && !c->stopping_) {
      if (cancelled) {
        c->abandon();
        throw_system_error(asio::error::operation_aborted, "sluice::stream::next");
      }
      c->start(co_await asio::this_coro::executor);
    }
  }
  error_code ec;
  if (aborted) ec = asio::error::operation_aborted;
  while (!ec) {
    if (c->has_result()) co_return;  // read: its slot goes to the next input at once
    if (c->finished()) break;
    co_await c->consumer_wait(cancelled);
    if (std::exchange(c->consumer_aborted_, false)) ec = asio::error::operation_aborted;
  }
  // Stopped (a failure, a cancelled consumer): an owned upstream stage may
  // still run ahead of us; stop it and wait for it before reporting, even
  // if this coroutine was cancelled already.
  if (c->stopping_ && !c->input_shut_) {
    const bool on = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    co_await workers::shut_input(c);
    co_await asio::this_coro::throw_if_cancelled(on);
  }
  if (ec) throw_system_error(ec, "sluice::stream::next");
  if (auto e = std::exchange(c->error_, nullptr)) std::rethrow_exception(e);
}

template <class Executor>
void stream_consumer<Executor>::cancel_consumer() {
  if (consumer_cancelled_) return;
  consumer_cancelled_ = true;
  this->abandon(true);
  // Never complete from inside the slot's own handler (or the initiation).
  this->post_call(this->shared_from_this(), [](workers& w, erased_handler<>&) {
    static_cast<stream_consumer&>(w).notify_consumer();
  });
}

template <class Executor>
void stream_consumer<Executor>::notify_waiting_consumer() {
  if (consumer_cancelled_) {
    if (live_ != 0) return;
    consumer_cancelled_ = false;
    sink_ = nullptr;
    consumer_aborted_ = true;
    consumer_.complete();
  } else if (has_result() || finished()) {
    resume_consumer();
  }
}

template <class Executor>
void stream_consumer<Executor>::resume_consumer() {
  sink_ = nullptr;
  if (!consumer_on_ex_) {
    consumer_.complete();
    return;
  }
  consumer_.clear_slot();
  this->post_call(this->shared_from_this(), &workers::resume_with_parked, consumer_.release());
}

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template class stream_consumer<asio::any_io_executor>;
#endif

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STREAM_CONSUMER_HPP
