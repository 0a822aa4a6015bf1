// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STREAM_WORKERS_HPP
#define SLUICE_DETAIL_STREAM_WORKERS_HPP

#include <sluice/config.hpp>
#include <sluice/detail/child_set.hpp>
#include <sluice/detail/completion.hpp>
#include <sluice/detail/loop_post.hpp>
#include <sluice/detail/loop_service.hpp>
#include <sluice/detail/throw_error.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

namespace sluice::detail {

// The worker side of one sluice::stream: its slots, and the workers (see
// map_unordered.hpp) that fill them, park and are woken. stream_consumer
// (next()'s wait, the failure, the stop), stream_delivery (the results and
// the sink) and stream_core (next(), close()) derive from it, in that order;
// they share one object and one loop.
//
// Slots: used_ counts inputs taken and not yet given back: tasks being pulled
// or running, and finished results in the buffer (unread). next() gives a slot
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
// (stream_consumer::resume_consumer()) also serves the slots it frees: kicks are
// deferred while the consumer runs there (run_deferring_kicks()), and parked
// workers resume in that post right after it suspends (resume_parked()), so a
// burst of results costs one post, not one per worker.
template <class Executor>
class stream_workers : public std::enable_shared_from_this<stream_workers<Executor>> {
 public:
  [[nodiscard]] std::size_t running() const noexcept { return running_; }
  // True while a task runs or an input is being pulled: what may still touch
  // the consumer's state (a parked worker touches nothing when it wakes).
  [[nodiscard]] bool busy() const noexcept { return running_ != 0 || pulling_; }

 protected:
  explicit stream_workers(std::size_t limit);
  stream_workers(const stream_workers&) = delete;
  stream_workers& operator=(const stream_workers&) = delete;
  ~stream_workers();

  // Starts one more worker on ex_ (it must call worker_started() first).
  virtual void spawn_worker() = 0;

  // ---- worker side ---------------------------------------------------------

  void worker_started() { --waking_; }

  // True if this worker may take a slot and pull now; otherwise it parks.
  [[nodiscard]] bool may_pull() const noexcept { return has_free_slot() && !pulling_; }
  [[nodiscard]] bool has_free_slot() const noexcept { return used_ < limit_; }
  [[nodiscard]] bool ending() const noexcept { return ending_; }

  // Waits until kick() or a stop wakes this worker. No cancellation handler:
  // every stop wakes all parked workers itself.
  asio::awaitable<void, Executor> park();
  // A post to the workers' executor, awaited: where a new worker starts.
  asio::awaitable<void, Executor> hop();
  // The first next(): the workers run on `ex` from now on; spawns the first.
  void start(const Executor& ex);
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

  // Sends one worker to a free slot if nobody is on the way to it already.
  // Called once per task by a worker and once per result by the consumer:
  // the common case (someone is on the way, or no slot is free) returns
  // inline.
  [[gnu::always_inline]] void kick() {
    if (!ending() && (waking_ != 0 || !may_pull() || !started_)) return;
    kick_slow();
  }
  [[gnu::noinline]] void kick_slow();

  // True for the one worker still in its loop (about to leave).
  [[nodiscard]] bool last_worker() const noexcept { return live_ == 1; }

  std::shared_ptr<child_set>& children() noexcept { return children_; }
  const Executor& executor() const noexcept { return *ex_; }

  // ---- for the consumer side -----------------------------------------------

  // Stops without waiting (stream_delivery's, which see).
  virtual void abandon(bool keep_error = false) = 0;

  // The stream's close() (stream_core's, which see): stops it, waits for
  // every worker, closes an owned input. Null: returns at once.
  static asio::awaitable<void, Executor> close_stream(std::shared_ptr<stream_workers> c);
  // The way out of a consumer that closes the stream (sluice::for_each):
  // close_stream(c), then the caller's throw_if_cancelled back to `was` (the
  // caller turned it off before awaiting this, so that a cancelled consumer
  // still waits for every task), then `error` if any, else the close's own.
  // One coroutine per executor, not a try/catch and three co_awaits in every
  // for_each body's frame (issue 32).
  static asio::awaitable<void, Executor> close_then_rethrow(std::shared_ptr<stream_workers> c,
                                                            std::exception_ptr error, bool was);
  // Closes the owned input once (close_input: cancels an upstream stage and
  // waits for it). The callers turn throw_if_cancelled off around it: a
  // cancelled consumer must not leave the upstream running either. An error
  // of the close itself (only its own cancellation) is not the stream's.
  // `c` is kept alive by the caller.
  static asio::awaitable<void, Executor> shut_input(stream_workers* c);
  // Closes an owned async source that has close(); nothing otherwise.
  virtual asio::awaitable<void, Executor> close_input();

  void spawn() {
    ++spawned_;
    ++waking_;
    ++live_;
    spawn_worker();
  }

  bool finished() const noexcept { return ending() && live_ == 0; }

  // What asio::post(*ex_, f) does (see loop_post.hpp), with what it finds
  // out about ex_ found out once, at the start.
  template <class F>
  void post(F&& f) {
    (*poster_)(std::forward<F>(f));
  }

  // Posts `fn(*this, h)` to ex_, the state kept alive by `self` until it
  // runs (or is dropped with its loop: `h` is then destroyed unrun). One
  // posted function type for every wake of every stream on an executor: each
  // type posted costs an object some 100 functions of Asio's (issue 32).
  using posted_fn = void (*)(stream_workers&, erased_handler<>&);
  void post_call(std::shared_ptr<stream_workers> self, posted_fn fn, erased_handler<> h = {});
  struct posted_call {
    std::shared_ptr<stream_workers> self;
    posted_fn fn;
    erased_handler<> h;
    void operator()() { fn(*self, h); }
  };
  // post_call()'s: resumes the consumer's handler `h` with the kicks
  // deferred, then the parked workers (see stream_consumer::resume_consumer).
  static void resume_with_parked(stream_workers& self, erased_handler<>& h) {
    if (self.run_deferring_kicks(h)) self.resume_parked();
  }

  // Wakes the first parked worker through a post that looks again when it
  // runs: if no slot is free by then (the worker that kicked has filled them
  // all itself, as one running short tasks inline does), the worker stays
  // parked and is not resumed (no new park for it); otherwise it resumes
  // there, the post having been the hop to its executor.
  void wake_one();
  void wake_all();

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
  void resume_parked();

  const std::size_t limit_;
  std::shared_ptr<child_set> children_;
  std::optional<Executor> ex_;
  std::optional<loop_poster<Executor>> poster_;  // post()'s
  std::deque<erased_handler<>> parked_;
  loop_held_handler<> consumer_;   // next()'s wait; let go if its loop dies first
  bool consumer_aborted_ = false;  // the consumer's wait completes with operation_aborted
  bool consumer_on_ex_ = true;     // the waiting consumer runs on ex_
  bool input_shut_ = false;        // shut_input() ran
  std::size_t used_ = 0;
  std::size_t running_ = 0;
  std::size_t spawned_ = 0;
  std::size_t live_ = 0;
  std::size_t waking_ = 0;
  bool started_ = false;
  bool pulling_ = false;
  bool exhausted_ = false;
  bool stopping_ = false;
  bool ending_ = false;           // exhausted_ || stopping_: no input will be pulled any more
  bool deferring_kicks_ = false;  // inside resume_consumer()'s post
  bool kick_deferred_ = false;    // a kick deferred until it returns
};

// The members that reach Asio, out of the class (not inline): compiled once
// for Asio's default executor with SLUICE_SEPARATE_COMPILATION.

template <class Executor>
stream_workers<Executor>::stream_workers(std::size_t limit)
    : limit_(limit), children_(child_set::make()) {}

template <class Executor>
stream_workers<Executor>::~stream_workers() = default;

template <class Executor>
asio::awaitable<void, Executor> stream_workers<Executor>::park() {
  return asio::async_initiate<const asio::use_awaitable_t<Executor>&, void()>(
      [this](auto handler) { parked_.emplace_back(std::move(handler), *ex_); },
      asio::use_awaitable_t<Executor>{});
}

template <class Executor>
asio::awaitable<void, Executor> stream_workers<Executor>::hop() {
  return asio::post(*ex_, asio::use_awaitable_t<Executor>{});
}

template <class Executor>
void stream_workers<Executor>::start(const Executor& ex) {
  ex_.emplace(ex);
  poster_.emplace(ex);
  started_ = true;
  spawn();
}

template <class Executor>
asio::awaitable<void, Executor> stream_workers<Executor>::close_stream(
    std::shared_ptr<stream_workers> c) {
  if (!c) co_return;
  c->abandon();
  auto ex = co_await asio::this_coro::executor;
  const bool was = co_await asio::this_coro::throw_if_cancelled();
  co_await asio::this_coro::throw_if_cancelled(false);
  error_code ec;
  co_await c->children_->join(ex, ec);
  if (!c->input_shut_) co_await shut_input(c.get());
  co_await asio::this_coro::throw_if_cancelled(was);
  if (ec) throw_system_error(ec, "sluice::stream::close");
}

template <class Executor>
asio::awaitable<void, Executor> stream_workers<Executor>::close_then_rethrow(
    std::shared_ptr<stream_workers> c, std::exception_ptr error, bool was) {
  try {
    co_await close_stream(std::move(c));
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  co_await asio::this_coro::throw_if_cancelled(was);
  if (error) std::rethrow_exception(error);
}

template <class Executor>
asio::awaitable<void, Executor> stream_workers<Executor>::shut_input(stream_workers* c) {
  c->input_shut_ = true;
  try {
    auto closing = c->close_input();
    co_await std::move(closing);
  } catch (...) {
  }
}

template <class Executor>
asio::awaitable<void, Executor> stream_workers<Executor>::close_input() {
  co_return;
}

template <class Executor>
void stream_workers<Executor>::kick_slow() {
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

template <class Executor>
void stream_workers<Executor>::wake_one() {
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

template <class Executor>
void stream_workers<Executor>::post_call(std::shared_ptr<stream_workers> self, posted_fn fn,
                                         erased_handler<> h) {
  post(posted_call{std::move(self), fn, std::move(h)});
}

template <class Executor>
void stream_workers<Executor>::wake_all() {
  while (!parked_.empty()) {
    ++waking_;
    auto h = std::move(parked_.front());
    parked_.pop_front();
    h.complete();
  }
}

template <class Executor>
void stream_workers<Executor>::resume_parked() {
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

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template class stream_workers<asio::any_io_executor>;
#endif

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_STREAM_WORKERS_HPP
