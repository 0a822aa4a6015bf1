// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STREAM_CORE_HPP
#define SLUICE_DETAIL_STREAM_CORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/stream_delivery.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

namespace sluice::detail {

// The shared state of one sluice::stream: the bookkeeping that the consumer
// (next/close/the destructor) and the workers (see map_unordered.hpp) share.
// Held by shared_ptr: by the stream, by each running worker and by a waiting
// next(), so nothing dangles when the stream goes away first.
//
// Four rooms, each a base of the next: stream_workers (the slots, and the
// workers that fill them, park and are woken), stream_consumer (the
// consumer's wait, next()'s slow path, the failure, the stop: nothing that
// depends on T), stream_delivery (the buffer and the sink, per T), and this
// one, the stream's side: next(), close(), and the stream's hold on it.
//
// Ending: the stream is finished once no input will be pulled any more
// (exhausted_ or stopping_) and every worker has left its loop (live_ == 0).
// next() then rethrows the first failure (error_) once the buffer is drained.
template <class T, class Executor>
class stream_core : public stream_delivery<T, Executor> {
  using delivery = stream_delivery<T, Executor>;
  using workers = stream_workers<Executor>;

 public:
  using value_type = T;
  using executor_type = Executor;

  explicit stream_core(std::size_t limit) : delivery(limit) {}
  stream_core(const stream_core&) = delete;
  stream_core& operator=(const stream_core&) = delete;
  // A waiting consumer's handler owns its frame, and with it a next_ref that
  // reads next_refs_ when it goes: drop it while every member still lives.
  virtual ~stream_core() { this->consumer_.reset(); }

  // ---- consumer side -------------------------------------------------------

  // A next() call's hold on the core: a plain count (a stream is
  // loop-affine), not a shared_ptr copy per call. A stream that lets go of
  // the core while calls it made still exist (made and not yet awaited, or
  // not yet destroyed) leaves the core holding itself until the last of them
  // is gone (release()).
  class next_ref {
   public:
    // `c` null: the call of a stream without a core, which yields nothing.
    explicit next_ref(stream_core* c) noexcept : c_(c) {
      if (c_ != nullptr) ++c_->next_refs_;
    }
    next_ref(next_ref&& other) noexcept : c_(std::exchange(other.c_, nullptr)) {}
    next_ref& operator=(next_ref&&) = delete;
    ~next_ref() {
      if (c_ != nullptr && --c_->next_refs_ == 0 && c_->self_) {
        auto last = std::move(c_->self_);  // may destroy the core: c_ is not used after
      }
    }
    stream_core* operator->() const noexcept { return c_; }
    explicit operator bool() const noexcept { return c_ != nullptr; }

   private:
    stream_core* c_;
  };

  // The stream lets go of its core (destroyed, or assigned another): stops
  // it, and keeps it alive while next() calls the stream made still exist.
  static void release(std::shared_ptr<stream_core> c) noexcept {
    c->abandon();
    if (c->next_refs_ != 0) {
      stream_core* raw = c.get();
      raw->self_ = std::move(c);
    }
  }

  // One coroutine for a stream without a core too (`c` null: nothing).
  static asio::awaitable<std::optional<T>, Executor> next(next_ref c) {
    if (!c) co_return std::nullopt;
    // A result already waiting is handed out at once, whatever the caller's
    // cancellation state (a stream not started yet has none). While another
    // next() waits, nothing is buffered (a result wakes it at once).
    if (std::optional<T> out; c->try_take(out)) co_return out;
    // The common wait, between two waves of results, runs here, in this
    // frame: a started stream, not finished, this the only consumer, not
    // cancelled. It is wait_result()'s first round, word for word;
    // wait_result() does the rest (a start, a cancelled caller, the end, a
    // cancelled wait, a wake without a result) as it would have. (A
    // wait_result() frame per wave on top of this one and Asio's for the wait
    // is one more than Asio's frame cache, two blocks, recycles: a heap
    // allocation per wave.) wait_result() does not depend on T: compiled once
    // per executor, not per result type (issue 32).
    if (c->started_ && !c->consumer_ && !c->finished()) {
      const auto state = co_await asio::this_coro::cancellation_state;
      if (state.cancelled() == asio::cancellation_type::none) {
        co_await c->consumer_wait(false);
        const bool aborted = std::exchange(c->consumer_aborted_, false);
        if (std::optional<T> out; !aborted && c->try_take(out)) co_return out;
        // Asio would throw at this co_await if the caller's cancellation was
        // requested meanwhile: off until wait_result() puts it back.
        const bool was = co_await asio::this_coro::throw_if_cancelled();
        co_await asio::this_coro::throw_if_cancelled(false);
        co_await delivery::wait_result(c.operator->(), true, was, aborted);
        co_return take(*c.operator->());
      }
    }
    // `c` (next_ref) keeps the core alive while wait_result() runs. A result
    // it left buffered is taken here before anything else can run.
    co_await delivery::wait_result(c.operator->());
    co_return take(*c.operator->());
  }

  // The result wait_result() left buffered; none when the stream finished.
  static std::optional<T> take(stream_core& c) {
    std::optional<T> out;
    c.try_take(out);
    return out;
  }

  // The stream has already been stopped (abandon()) by stream::close(). The
  // join and the close of the input run with throw_if_cancelled off, so a
  // caller whose cancellation was already requested still waits for every
  // task and closes the upstream. Only a cancellation that arrives while it
  // waits is reported (operation_aborted, after the wait).
  // `c` null (a stream without a core): returns at once.
  static asio::awaitable<void, Executor> close(std::shared_ptr<stream_core> c) {
    return workers::close_stream(std::move(c));
  }
  // sluice::for_each's way out (stream_workers::close_then_rethrow).
  static asio::awaitable<void, Executor> close_then_rethrow(std::shared_ptr<stream_core> c,
                                                            std::exception_ptr error, bool was) {
    return workers::close_then_rethrow(std::move(c), std::move(error), was);
  }

 private:
  std::shared_ptr<stream_core> self_;  // see next_ref
  std::size_t next_refs_ = 0;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STREAM_CORE_HPP
