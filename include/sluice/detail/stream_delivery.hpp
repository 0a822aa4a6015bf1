// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STREAM_DELIVERY_HPP
#define SLUICE_DETAIL_STREAM_DELIVERY_HPP

#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/loop_service.hpp>
#include <sluice/detail/result_ring.hpp>
#include <sluice/detail/stream_workers.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// How one sluice::stream's results reach its consumer: the buffer, the
// sink, and the consumer's wait inside next() (resumed, cancelled, or
// served a burst of results by one post). The middle layer of the stream's
// shared state: stream_workers (slots, workers) below it, stream_core (next(),
// close(), the stream's hold on it) above it.
//
// Results: buffer_ (a ring of at most limit_) is read by next() and, without
// a next() frame per result, by sluice::for_each (try_take()). A waiting
// sink (for_each's synchronous body) takes them from the workers instead.
//
// error_ is the first failure (a task's or the input's), never the aftermath of
// a stop; next() rethrows it once the buffer is drained and the stream finished.
template <class T, class Executor>
class stream_delivery : public stream_workers<Executor>,
                        public std::enable_shared_from_this<stream_delivery<T, Executor>> {
  using workers = stream_workers<Executor>;

 public:
  [[nodiscard]] std::size_t ready() const noexcept { return buffer_.size(); }

  // A result already waiting, handed out without suspending (the fast path
  // of sluice::for_each): exactly what next() does when one waits, its slot
  // given back at once. Empty when none waits (not started yet, running,
  // finished or stopped): the caller then awaits next(), which starts, waits,
  // ends or reports the failure. Never a cancellation point by itself: a
  // result that waits is handed out even to a cancelled caller, as by next().
  // Out parameter, not a returned optional: a small optional<T> returned in
  // registers costs a store-forwarding stall on every result.
  [[gnu::always_inline]] bool try_take(std::optional<T>& out) {
    if (buffer_.empty()) return false;
    out.emplace(std::move(buffer_.front()));
    buffer_.pop_front();
    give_back_slot();
    return true;
  }

  // A synchronous consumer that takes results straight from the workers
  // while it waits in next(): sluice::for_each with a body that returns void
  // or bool. take() runs the body on a finished result (see hand_to_sink()):
  // taken (go on), stop (the body returned false or threw: the sink keeps the
  // exception), or refused (the consumer's cancellation was requested: the
  // result is buffered as usual and next() hands it out). Never throws. Set
  // only while that next() waits.
  struct sink {
    enum class verdict { taken, stop, refused };
    verdict (*take)(sink& self, T& value) noexcept;
  };
  void set_sink(sink* s) noexcept {
    wanted_sink_ = s;
    if (s == nullptr) sink_ = nullptr;
  }

  // Stops without waiting: no more input, running tasks cancelled, unread
  // results dropped (and a failure not yet reported too, unless keep_error:
  // a cancelled consumer still gets it from a later next()). The destructor
  // of a stream and close() call it.
  void abandon(bool keep_error = false) final {
    stop();
    buffer_.clear();
    if (!keep_error) error_ = nullptr;
  }

 protected:
  explicit stream_delivery(std::size_t limit) : workers(limit) {}
  stream_delivery(const stream_delivery&) = delete;
  stream_delivery& operator=(const stream_delivery&) = delete;
  ~stream_delivery() = default;

  using workers::children_;
  using workers::consumer_;
  using workers::consumer_aborted_;
  using workers::consumer_on_ex_;
  using workers::deferring_kicks_;
  using workers::ending_;
  using workers::ex_;
  using workers::exhausted_;
  using workers::finished;
  using workers::give_back_slot;
  using workers::input_exhausted;
  using workers::kick;
  using workers::kick_deferred_;
  using workers::live_;
  using workers::post;
  using workers::resume_parked;
  using workers::run_deferring_kicks;
  using workers::stopping_;
  using workers::used_;
  using workers::wake_all;

  // ---- worker side ---------------------------------------------------------

  // A finished task's result, from worker `self` (its slot stays taken until
  // next() hands it out). With a sink waiting and nothing buffered before it,
  // the sink takes it here (hand_to_sink()).
  template <class... A>
  [[gnu::always_inline]] void deliver(std::size_t self, A&&... a) {
    if (sink_ != nullptr) {
      if constexpr (sizeof...(A) == 1 && (std::is_same_v<std::remove_cvref_t<A>, T> && ...)) {
        hand_to_sink(self, a...);
      } else if constexpr (sizeof...(A) == 0) {
        T value{};
        hand_to_sink(self, value);
      } else {
        T value(std::forward<A>(a)...);
        hand_to_sink(self, value);
      }
      return;
    }
    if constexpr (result_ring<T>::can_check_room) {
      if (!stopping_ && buffer_.has_room()) {
        buffer_.emplace_back_in_room(std::forward<A>(a)...);
        notify_consumer();
        return;
      }
    }
    buffer_result(std::forward<A>(a)...);
  }
  template <class... A>
  [[gnu::noinline]] void buffer_result(A&&... a) {
    if (stopping_) {
      give_back_slot();
      return;
    }
    buffer_.emplace_back(std::forward<A>(a)...);
    notify_consumer();
  }

  // The first failure: fail fast (cancel = true) stops everything, cancelling
  // the running tasks but `self`; settling (cancel = false) only stops pulling.
  void fail(std::exception_ptr e, std::size_t self, bool cancel) {
    if (stopping_ || (exhausted_ && error_)) return;
    error_ = std::move(e);
    if (cancel) {
      stop(self);
    } else {
      input_exhausted();
    }
    notify_consumer();
  }

  void worker_left() {
    --live_;
    notify_consumer();
  }
  // An error of the stream's own machinery (a progress report that threw):
  // next() rethrows it at the end unless a failure came first.
  void report_error(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
  }

  // ---- consumer side -------------------------------------------------------

  // The waiting sink (sluice::for_each's body) takes `value` here, in the
  // worker that finished it: no buffer, no consumer resumed per result. The
  // body runs on the consumer's executor (consumer_on_ex_), one result at a
  // time, in completion order (only with nothing buffered). Its slot is not
  // given back at once but by one post per wave (release_taken()), which also
  // resumes the parked workers: results finishing together (a burst) are all
  // handed to the body before any freed slot pulls an input, as when next()
  // reads them. A body that returns false or throws (the sink keeps its
  // exception) stops the stream, its running tasks but `self` cancelled;
  // next() ends once every worker has left.
  [[gnu::always_inline]] void hand_to_sink(std::size_t self, T& value) {
    const auto v = sink_->take(*sink_, value);
    if (v == sink::verdict::taken) [[likely]] {
      if (taken_++ == 0) post_release();
      return;
    }
    sink_declined(self, value, v);
  }
  [[gnu::noinline]] void post_release() {
    this->post_call(this->shared_from_this(), [](workers& w, erased_handler<>&) {
      static_cast<stream_delivery&>(w).release_taken();
    });
  }
  [[gnu::noinline]] void sink_declined(std::size_t self, T& value, typename sink::verdict v) {
    if (v == sink::verdict::refused) {
      buffer_.emplace_back(std::move(value));
      notify_consumer();
      return;
    }
    give_back_slot(false);
    stop(self);
    error_ = nullptr;
    notify_consumer();
  }

  // The slots of the results the sink took since the last call go back, and
  // the parked workers resume here, one after the other, for as long as slots
  // are free (their kicks deferred to this loop, as in resume_consumer()).
  void release_taken() {
    used_ -= std::exchange(taken_, 0);
    const bool outer = std::exchange(deferring_kicks_, true);
    kick();
    deferring_kicks_ = outer;
    if (std::exchange(kick_deferred_, false)) resume_parked();
  }

  void stop(std::size_t except = child_set::none) {
    stopping_ = true;
    ending_ = true;
    sink_ = nullptr;
    children_->cancel_all(except);
    wake_all();
  }

  // The waiter inside next(): completes when a result is buffered or the
  // stream finished; a cancelled consumer (cancelled while it waits, or
  // already before: cancel_now) stops the stream and completes with
  // operation_aborted once every worker has left (consumer_aborted_, read
  // when it resumes: no error_code through the handler, whose redirect_error
  // wrapper costs an initiation and a handler of its own per wave).
  asio::awaitable<void, Executor> async_wait(bool cancel_now) {
    return this->consumer_wait(cancel_now);
  }

  // consumer_wait()'s: the sink (if any) takes results while this consumer
  // waits: it runs on the workers' executor, the buffer is empty (next()
  // found nothing), nothing stopped. Every way the wait ends clears it.
  void consumer_waiting(bool cancel_now) final {
    if (consumer_on_ex_ && !stopping_ && !cancel_now) sink_ = wanted_sink_;
  }

  void cancel_consumer() final {
    if (consumer_cancelled_) return;
    consumer_cancelled_ = true;
    abandon(true);
    // Never complete from inside the slot's own handler (or the initiation).
    this->post_call(this->shared_from_this(), [](workers& w, erased_handler<>&) {
      static_cast<stream_delivery&>(w).notify_consumer();
    });
  }

  [[gnu::always_inline]] void notify_consumer() {
    if (consumer_) notify_waiting_consumer();
  }
  [[gnu::noinline]] void notify_waiting_consumer() {
    if (consumer_cancelled_) {
      if (live_ != 0) return;
      consumer_cancelled_ = false;
      sink_ = nullptr;
      consumer_aborted_ = true;
      consumer_.complete();
    } else if (!buffer_.empty() || finished()) {
      resume_consumer();
    }
  }

  // Hands the consumer a result (or the end) through one post that then also
  // serves the workers whose slots the consumer frees: while the consumer
  // runs there (until it suspends again), a kick that would wake a parked
  // worker through a post of its own is deferred, and the workers are resumed
  // in the same posted function right after the consumer (resume_parked()).
  // The workers still run only after the consumer has suspended.
  void resume_consumer() {
    sink_ = nullptr;
    if (!consumer_on_ex_) {
      consumer_.complete();
      return;
    }
    consumer_.clear_slot();
    this->post_call(this->shared_from_this(), &workers::resume_with_parked, consumer_.release());
  }

  result_ring<T> buffer_;
  std::exception_ptr error_;
  sink* wanted_sink_ = nullptr;  // for_each's body, set around its next()
  sink* sink_ = nullptr;         // the same while that next() waits (see async_wait)
  std::size_t taken_ = 0;        // slots of results the sink took, not yet given back
  bool consumer_cancelled_ = false;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STREAM_DELIVERY_HPP
