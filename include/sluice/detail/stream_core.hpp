// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STREAM_CORE_HPP
#define SLUICE_DETAIL_STREAM_CORE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/loop_service.hpp>
#include <sluice/detail/result_ring.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace sluice::detail {

// The shared state of one sluice::stream: the bookkeeping that the consumer
// (next/close/the destructor) and the workers (see map_unordered.hpp) share.
// Held by shared_ptr: by the stream, by each running worker and by a waiting
// next(), so nothing dangles when the stream goes away first.
//
// Slots: used_ counts inputs taken and not yet given back: tasks being pulled
// or running, and finished results in buffer_ (unread). next() gives a slot
// back the moment it hands a result out, so the next input starts while the
// consumer works on that result. A worker takes a slot before it pulls;
// used_ <= limit_ always, which is the stream's backpressure.
//
// Workers: at most limit_ are ever spawned (spawned_); live_ of them have not
// left their loop yet. A worker that finds no slot (or another worker pulling
// an async source: pulling_) parks in parked_. kick() wakes or spawns one
// worker when a slot is free and nobody is on the way to take it (waking_ == 0);
// the woken worker kicks again after its pull, so free slots fill in a chain of
// posts and a worker that runs short tasks inline fills them all by itself.
// A wake is a post that looks again when it runs (wake_one()): a worker with
// no slot by then stays parked. The post that resumes a waiting consumer
// (resume_consumer()) also serves the slots it frees: kicks are deferred while
// the consumer runs there, and parked workers resume in that post right after
// it suspends, so a burst of results costs one post, not one per worker.
//
// Results: buffer_ (a ring of at most limit_) is read by next() and, without
// a next() frame per result, by sluice::for_each (try_take()).
//
// Ending: the stream is finished once no input will be pulled any more
// (exhausted_ or stopping_) and every worker has left its loop (live_ == 0).
// error_ is the first failure (a task's or the input's), never the aftermath of
// a stop; next() rethrows it once the buffer is drained and the stream finished.
template <class T, class Executor>
class stream_core : public std::enable_shared_from_this<stream_core<T, Executor>> {
 public:
  using value_type = T;
  using executor_type = Executor;

  explicit stream_core(std::size_t limit)
      : limit_(limit), children_(std::make_shared<child_set>()) {}
  stream_core(const stream_core&) = delete;
  stream_core& operator=(const stream_core&) = delete;
  // A waiting consumer's handler owns its frame, and with it a next_ref that
  // reads next_refs_ when it goes: drop it while every member still lives.
  virtual ~stream_core() { consumer_.reset(); }

  [[nodiscard]] std::size_t running() const noexcept { return running_; }
  [[nodiscard]] std::size_t ready() const noexcept { return buffer_.size(); }
  // True while a task runs or an input is being pulled: what may still touch
  // the consumer's state (a parked worker touches nothing when it wakes).
  [[nodiscard]] bool busy() const noexcept { return running_ != 0 || pulling_; }

  // ---- consumer side -------------------------------------------------------

  // A next() call's hold on the core: a plain count (a stream is
  // loop-affine), not a shared_ptr copy per call. A stream that lets go of
  // the core while calls it made still exist (made and not yet awaited, or
  // not yet destroyed) leaves the core holding itself until the last of them
  // is gone (release()).
  class next_ref {
   public:
    explicit next_ref(stream_core* c) noexcept : c_(c) { ++c_->next_refs_; }
    next_ref(next_ref&& other) noexcept : c_(std::exchange(other.c_, nullptr)) {}
    next_ref& operator=(next_ref&&) = delete;
    ~next_ref() {
      if (c_ != nullptr && --c_->next_refs_ == 0 && c_->self_) {
        auto last = std::move(c_->self_);  // may destroy the core: c_ is not used after
      }
    }
    stream_core* operator->() const noexcept { return c_; }

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

  static asio::awaitable<std::optional<T>, Executor> next(next_ref c) {
    // A result already waiting is handed out at once, whatever the caller's
    // cancellation state (a stream not started yet has none). While another
    // next() waits, nothing is buffered (a result wakes it at once).
    if (std::optional<T> out; c->try_take(out)) co_return out;
    // The common wait, between two waves of results, runs here, in this
    // frame: a started stream, not finished, this the only consumer, not
    // cancelled. It is wait_next()'s first round, word for word; wait_next()
    // does the rest (a start, a cancelled caller, the end, a cancelled wait, a
    // wake without a result) as it would have. (A wait_next() frame per wave
    // on top of this one and Asio's for the wait is one more than Asio's
    // frame cache, two blocks, recycles: a heap allocation per wave.)
    if (c->started_ && !c->consumer_ && !c->finished()) {
      const auto state = co_await asio::this_coro::cancellation_state;
      if (state.cancelled() == asio::cancellation_type::none) {
        co_await c->async_wait(false);
        const bool aborted = std::exchange(c->consumer_aborted_, false);
        if (std::optional<T> out; !aborted && c->try_take(out)) co_return out;
        // Asio would throw at this co_await if the caller's cancellation was
        // requested meanwhile: off until wait_next() puts it back.
        const bool was = co_await asio::this_coro::throw_if_cancelled();
        co_await asio::this_coro::throw_if_cancelled(false);
        co_return co_await wait_next_from(c.operator->(), true, was, aborted);
      }
    }
    co_return co_await wait_next_from(c.operator->());
  }

  // wait_next(), called out of line: its shared_ptr is not a temporary in
  // next()'s frame.
  template <class... A>
  [[gnu::noinline]] static asio::awaitable<std::optional<T>, Executor> wait_next_from(
      stream_core* c, A... a) {
    return wait_next(c->shared_from_this(), a...);
  }

  // next() when no result waits: starts the stream, waits, ends or reports.
  // From a wait in next() (waited): `was` is the caller's throw_if_cancelled
  // to put back; `aborted`: that wait completed with operation_aborted.
  static asio::awaitable<std::optional<T>, Executor> wait_next(std::shared_ptr<stream_core> c,
                                                               bool waited = false, bool was = true,
                                                               bool aborted = false) {
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
          throw system_error(asio::error::operation_aborted, "sluice::stream::next");
        }
        c->ex_.emplace(co_await asio::this_coro::executor);
        c->post_ex_.emplace(post_executor_for(*c->ex_));
        c->started_ = true;
        c->spawn();
      }
    }
    error_code ec;
    if (aborted) ec = asio::error::operation_aborted;
    while (!ec) {
      // Read: its slot goes to the next input at once.
      if (std::optional<T> out; c->try_take(out)) co_return out;
      if (c->finished()) break;
      co_await c->async_wait(cancelled);
      if (std::exchange(c->consumer_aborted_, false)) ec = asio::error::operation_aborted;
    }
    // Stopped (a failure, a cancelled consumer): an owned upstream stage may
    // still run ahead of us; stop it and wait for it before reporting, even
    // if this coroutine was cancelled already.
    if (c->stopping_ && !c->input_shut_) {
      const bool was = co_await asio::this_coro::throw_if_cancelled();
      co_await asio::this_coro::throw_if_cancelled(false);
      co_await shut_input(c);
      co_await asio::this_coro::throw_if_cancelled(was);
    }
    if (ec) throw system_error(ec, "sluice::stream::next");
    if (auto e = std::exchange(c->error_, nullptr)) std::rethrow_exception(e);
    co_return std::nullopt;
  }

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

  // The stream has already been stopped (abandon()) by stream::close(). The
  // join and the close of the input run with throw_if_cancelled off, so a
  // caller whose cancellation was already requested still waits for every
  // task and closes the upstream. Only a cancellation that arrives while it
  // waits is reported (operation_aborted, after the wait).
  static asio::awaitable<void, Executor> close(std::shared_ptr<stream_core> c) {
    c->abandon();
    auto ex = co_await asio::this_coro::executor;
    const bool was = co_await asio::this_coro::throw_if_cancelled();
    co_await asio::this_coro::throw_if_cancelled(false);
    error_code ec;
    auto join_token = asio::redirect_error(asio::use_awaitable_t<Executor>(), ec);
    co_await c->children_->async_join(ex, join_token);
    if (!c->input_shut_) co_await shut_input(c);
    co_await asio::this_coro::throw_if_cancelled(was);
    if (ec) throw system_error(ec, "sluice::stream::close");
  }

  // Stops without waiting: no more input, running tasks cancelled, unread
  // results dropped (and a failure not yet reported too, unless keep_error:
  // a cancelled consumer still gets it from a later next()). The destructor
  // of a stream and close() call it.
  void abandon(bool keep_error = false) {
    stop();
    buffer_.clear();
    if (!keep_error) error_ = nullptr;
  }

 protected:
  // Starts one more worker on ex_ (it must call worker_started() first).
  virtual void spawn_worker() = 0;
  // Closes an owned async source that has close(); nothing otherwise.
  virtual asio::awaitable<void, Executor> close_input() { co_return; }

  // ---- worker side ---------------------------------------------------------

  void worker_started() { --waking_; }

  // True if this worker may take a slot and pull now; otherwise it parks.
  [[nodiscard]] bool may_pull() const noexcept { return has_free_slot() && !pulling_; }
  [[nodiscard]] bool has_free_slot() const noexcept { return used_ < limit_; }
  [[nodiscard]] bool ending() const noexcept { return ending_; }

  // Waits until kick() or a stop wakes this worker. No cancellation handler:
  // every stop wakes all parked workers itself.
  auto park() {
    return asio::async_initiate<const asio::use_awaitable_t<Executor>&, void()>(
        [this](auto handler) { parked_.emplace_back(std::move(handler), *ex_); },
        asio::use_awaitable_t<Executor>{});
  }
  void unparked() { --waking_; }

  void take_slot() { ++used_; }
  // kick = false when the caller is about to stop or end the stream anyway.
  [[gnu::always_inline]] void give_back_slot(bool kick_next = true) {
    --used_;
    if (kick_next) kick();
  }
  void begin_pull() { pulling_ = true; }
  void end_pull() { pulling_ = false; }
  void input_exhausted() {
    exhausted_ = true;
    ending_ = true;
    kick();
  }
  void task_started() { ++running_; }
  void task_ended() { --running_; }

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

  // Sends one worker to a free slot if nobody is on the way to it already.
  // Called once per task by a worker and once per result by the consumer:
  // the common case (someone is on the way, or no slot is free) returns
  // inline.
  [[gnu::always_inline]] void kick() {
    if (!ending() && (waking_ != 0 || !may_pull() || !started_)) return;
    kick_slow();
  }
  [[gnu::noinline]] void kick_slow() {
    if (ending()) {
      wake_all();
      return;
    }
    if (!started_ || !may_pull() || waking_ != 0) return;
    if (!parked_.empty()) {
      if (deferring_kicks_) {
        ++waking_;  // on the way: resume_consumer() wakes it, without a post
        kick_deferred_ = true;
        return;
      }
      wake_one();
    } else if (spawned_ < limit_) {
      spawn();
    }
  }

  void worker_left() {
    --live_;
    notify_consumer();
  }
  // True for the one worker still in its loop (about to leave).
  [[nodiscard]] bool last_worker() const noexcept { return live_ == 1; }
  // An error of the stream's own machinery (a progress report that threw):
  // next() rethrows it at the end unless a failure came first.
  void report_error(std::exception_ptr e) {
    if (!error_) error_ = std::move(e);
  }

  std::shared_ptr<child_set>& children() noexcept { return children_; }
  const Executor& executor() const noexcept { return *ex_; }

 private:
  void spawn() {
    ++spawned_;
    ++waking_;
    ++live_;
    spawn_worker();
  }

  bool finished() const noexcept { return ending() && live_ == 0; }

  // Closes the owned input once (close_input: cancels an upstream stage and
  // waits for it). The callers turn throw_if_cancelled off around it: a
  // cancelled consumer must not leave the upstream running either. An error
  // of the close itself (only its own cancellation) is not the stream's.
  static asio::awaitable<void, Executor> shut_input(std::shared_ptr<stream_core> c) {
    c->input_shut_ = true;
    try {
      auto closing = c->close_input();
      co_await std::move(closing);
    } catch (...) {
    }
  }

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
    post([self = this->shared_from_this()] { self->release_taken(); });
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

  // What asio::post(*ex_, f) does, with the executor it makes for every post
  // (never blocking, a fork, the default allocator) made once, at the start:
  // one post per wave of results (or per wake) without a require and a
  // prefer of a type-erased executor each time. An executor of the older
  // Networking TS model goes through asio::post.
  static auto post_executor_for(const Executor& ex) {
    if constexpr (asio::execution::is_executor<Executor>::value) {
      return asio::prefer(asio::require(ex, asio::execution::blocking.never),
                          asio::execution::relationship.fork,
                          asio::execution::allocator(std::allocator<void>()));
    } else {
      return ex;
    }
  }
  template <class F>
  void post(F&& f) {
    if constexpr (asio::execution::is_executor<Executor>::value) {
      post_ex_->execute(std::forward<F>(f));
    } else {
      asio::post(*ex_, std::forward<F>(f));
    }
  }

  // Wakes the first parked worker through a post that looks again when it
  // runs: if no slot is free by then (the worker that kicked has filled them
  // all itself, as one running short tasks inline does), the worker stays
  // parked and is not resumed (no new park for it); otherwise it resumes
  // there, the post having been the hop to its executor.
  void wake_one() {
    ++waking_;
    auto h = std::move(parked_.front());
    parked_.pop_front();
    // `this` outlives the post: the handler owns the worker, which holds the core.
    post([this, h = std::move(h)]() mutable {
      if (!ending() && !may_pull()) {
        --waking_;
        parked_.push_front(std::move(h));
        return;
      }
      h.complete_here();
    });
  }

  void wake_all() {
    while (!parked_.empty()) {
      ++waking_;
      auto h = std::move(parked_.front());
      parked_.pop_front();
      h.complete();
    }
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
  auto async_wait(bool cancel_now) {
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
          // The sink (if any) takes results while this consumer waits: it
          // runs on the workers' executor, the buffer is empty (next() found
          // nothing), nothing stopped. Every way the wait ends clears it.
          if (consumer_on_ex_ && !stopping_ && !cancel_now) sink_ = wanted_sink_;
          if (cancel_now) cancel_consumer();
        },
        asio::use_awaitable_t<Executor>{});
  }

  void cancel_consumer() {
    if (consumer_cancelled_) return;
    consumer_cancelled_ = true;
    abandon(true);
    // Never complete from inside the slot's own handler (or the initiation).
    asio::post(*ex_, [self = this->shared_from_this()] { self->notify_consumer(); });
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
    post([self = this->shared_from_this(), h = consumer_.release()]() mutable {
      if (self->run_deferring_kicks(h)) self->resume_parked();
    });
  }

  // Runs `h` here with the kicks deferred; true if one was. Nests: a run
  // inside another (a worker resumed by release_taken() inside
  // resume_parked()) leaves the outer run deferring.
  template <class Handler, class... A>
  bool run_deferring_kicks(Handler& h, A... a) {
    const bool outer = std::exchange(deferring_kicks_, true);
    try {
      h.complete_here(a...);
    } catch (...) {
      // A handler that throws out of the loop: the deferred wake goes by a
      // post of its own, so the stream does not stall if the loop runs on.
      deferring_kicks_ = outer;
      if (!outer && std::exchange(kick_deferred_, false)) {
        --waking_;
        kick();
      }
      throw;
    }
    deferring_kicks_ = outer;
    return std::exchange(kick_deferred_, false);
  }

  // The deferred kick (counted in waking_): resumes parked workers here, one
  // after the other, for as long as slots are free, each running until it
  // suspends (its task does) or parks. Their own kicks are deferred to this
  // loop, so a wave of freed slots costs the one post that resumed the
  // consumer instead of one post per worker.
  void resume_parked() {
    for (;;) {
      if (ending() || !may_pull() || parked_.empty()) {
        --waking_;
        kick();
        return;
      }
      auto h = std::move(parked_.front());
      parked_.pop_front();
      if (!run_deferring_kicks(h)) return;  // it took the wake (unparked())
    }
  }

  const std::size_t limit_;
  std::shared_ptr<child_set> children_;
  std::optional<Executor> ex_;
  std::optional<decltype(post_executor_for(std::declval<const Executor&>()))> post_ex_;  // post()'s
  result_ring<T> buffer_;
  std::deque<erased_handler<>> parked_;
  loop_held_handler<> consumer_;  // let go if its loop dies first
  std::exception_ptr error_;
  sink* wanted_sink_ = nullptr;        // for_each's body, set around its next()
  sink* sink_ = nullptr;               // the same while that next() waits (see async_wait)
  std::size_t taken_ = 0;              // slots of results the sink took, not yet given back
  std::shared_ptr<stream_core> self_;  // see next_ref
  std::size_t next_refs_ = 0;
  std::size_t used_ = 0;
  std::size_t running_ = 0;
  std::size_t spawned_ = 0;
  std::size_t live_ = 0;
  std::size_t waking_ = 0;
  bool started_ = false;
  bool pulling_ = false;
  bool exhausted_ = false;
  bool stopping_ = false;
  bool ending_ = false;  // exhausted_ || stopping_: no input will be pulled any more
  bool consumer_cancelled_ = false;
  bool consumer_aborted_ = false;  // the consumer's wait completes with operation_aborted
  bool consumer_on_ex_ = true;     // the waiting consumer runs on ex_
  bool deferring_kicks_ = false;   // inside resume_consumer()'s post
  bool kick_deferred_ = false;     // a kick deferred until it returns
  bool input_shut_ = false;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STREAM_CORE_HPP
