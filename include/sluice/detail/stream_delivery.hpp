// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STREAM_DELIVERY_HPP
#define SLUICE_DETAIL_STREAM_DELIVERY_HPP

#include <sluice/config.hpp>
#include <sluice/detail/result_ring.hpp>
#include <sluice/detail/stream_consumer.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <optional>
#include <type_traits>
#include <utility>

namespace sluice::detail {

// How one sluice::stream's results reach its consumer: the buffer and the
// sink, the part of the consumer side that depends on the result type. The
// stream's shared state in layers: stream_workers (slots, workers) and
// stream_consumer (next()'s wait, the failure, the stop) below it, stream_core
// (next(), close(), the stream's hold on it) above it.
//
// Results: buffer_ (a ring of at most limit_) is read by next() and, without
// a next() frame per result, by sluice::for_each (try_take()). A waiting
// sink (for_each's synchronous body) takes them from the workers instead.
template <class T, class Executor>
class stream_delivery : public stream_consumer<Executor> {
  using consumer = stream_consumer<Executor>;

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
    this->wanted_sink_ = s;
    if (s == nullptr) this->sink_ = nullptr;
  }

  // Stops without waiting: no more input, running tasks cancelled, unread
  // results dropped (and a failure not yet reported too, unless keep_error:
  // a cancelled consumer still gets it from a later next()). The destructor
  // of a stream and close() call it.
  void abandon(bool keep_error = false) final {
    this->stop();
    buffer_.clear();
    if (!keep_error) this->error_ = nullptr;
  }

 protected:
  explicit stream_delivery(std::size_t limit) : consumer(limit) {}
  stream_delivery(const stream_delivery&) = delete;
  stream_delivery& operator=(const stream_delivery&) = delete;
  ~stream_delivery() = default;

  using consumer::give_back_slot;
  using consumer::notify_consumer;
  using consumer::sink_;
  using consumer::stop;
  using consumer::stopping_;

  [[nodiscard]] bool has_result() const noexcept final { return !buffer_.empty(); }

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
    auto& s = *static_cast<sink*>(sink_);
    const auto v = s.take(s, value);
    if (v == sink::verdict::taken) [[likely]] {
      this->sink_took();
      return;
    }
    sink_declined(self, value, v);
  }
  [[gnu::noinline]] void sink_declined(std::size_t self, T& value, typename sink::verdict v) {
    if (v == sink::verdict::refused) {
      buffer_.emplace_back(std::move(value));
      notify_consumer();
      return;
    }
    give_back_slot(false);
    stop(self);
    this->error_ = nullptr;
    notify_consumer();
  }

  result_ring<T> buffer_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STREAM_DELIVERY_HPP
