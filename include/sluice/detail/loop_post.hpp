// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_LOOP_POST_HPP
#define SLUICE_DETAIL_LOOP_POST_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <optional>
#include <type_traits>
#include <typeinfo>
#include <utility>

namespace sluice::detail {

// How sluice posts a completion (a waiter's, a join's, a stream's wake): as
// asio::post(ex, f) does, never inline, but at the cost of Asio's own floor
// where the completion goes to an io_context's loop:
// - `ex` an any_io_executor holding an io_context's executor (what coroutines
//   spawned on an io_context carry): straight to that executor, without the
//   type-erased require and prefer of every asio::post and the second
//   allocation of a type-erased execute (post_io);
// - a waiter's completion posted from inside that io_context's run() on this
//   thread: as a continuation (asio::defer), onto the thread's private queue
//   without the scheduler's lock (defer_io). From any other thread it stays a
//   post: a continuation would wait for the poster's current handler and wake
//   no other thread.
// Order: on an io_context with concurrency hint 1 (the virtual loop, one
// thread) post and defer both use that private queue: nothing changes. On
// one with the default hint, a deferred completion runs after what the same
// handler posted with asio::post (as Asio's own continuations do). A stream's
// wakes stay posts (loop_poster): deferred behind the posts of the tasks its
// workers just started, they broke its waves up (callgrind, tasks that
// suspend once, default hint: 1.64x the lazy floor per result instead of 1.07x).
using io_executor = asio::io_context::executor_type;

// The io_context executor inside `ex`, or null.
template <class Executor>
const io_executor* io_target(const Executor& ex) noexcept {
  if constexpr (std::is_same_v<Executor, io_executor>) {
    return &ex;
  } else if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
#if !defined(SLUICE_USE_BOOST_ASIO) && !defined(ASIO_NO_TYPEID) || \
    defined(SLUICE_USE_BOOST_ASIO) && !defined(BOOST_ASIO_NO_TYPEID)
    // (Asio 1.22's target<>() does not check the type itself.)
    if (ex && ex.target_type() == typeid(io_executor)) return ex.template target<io_executor>();
#endif
    return nullptr;
  } else {
    return nullptr;
  }
}

// ex.execute(f): a public member of Asio 1.26's executors, reached through
// asio::execution::execute in Asio 1.22 (which Asio 1.26 drops with
// ASIO_NO_DEPRECATED).
template <class Executor, class F>
void execute_on(const Executor& ex, F&& f) {
  if constexpr (requires { ex.execute(std::forward<F>(f)); }) {
    ex.execute(std::forward<F>(f));
  } else {
#if SLUICE_ASIO_VERSION < 102600
    asio::execution::execute(ex, std::forward<F>(f));
#else
    static_assert(sizeof(F) == 0, "sluice: this Asio's executor has no public execute()");
#endif
  }
}

// `f` to an io_context's loop, never blocking.
template <class F>
void post_io(const io_executor& ex, F&& f) {
  execute_on(asio::require(ex, asio::execution::blocking.never), std::forward<F>(f));
}

// The same as a continuation (defer) from that loop's own thread.
template <class F>
void defer_io(const io_executor& ex, F&& f) {
  if (ex.running_in_this_thread()) {
    execute_on(asio::require(ex, asio::execution::blocking.never,
                             asio::execution::relationship.continuation),
               std::forward<F>(f));
  } else {
    post_io(ex, std::forward<F>(f));
  }
}

// Runs a waiter's completion `f` on `ex` later, never inline (see above).
template <class Executor, class F>
void post_to(const Executor& ex, F&& f) {
  if (const io_executor* io = io_target(ex)) {
    defer_io(*io, std::forward<F>(f));
  } else {
    asio::post(ex, std::forward<F>(f));
  }
}

// The executor asio::post makes of `ex` for every post (never blocking, a
// fork, the default allocator). An executor of the older Networking TS model
// goes through asio::post.
template <class Executor>
auto post_executor_for(const Executor& ex) {
  if constexpr (asio::execution::is_executor<Executor>::value) {
    return asio::prefer(asio::require(ex, asio::execution::blocking.never),
                        asio::execution::relationship.fork,
                        asio::execution::allocator(std::allocator<void>()));
  } else {
    return ex;
  }
}

// post_executor_for()'s type. For Asio's default executor, named: prefer and
// require keep an any_io_executor what it is, and a class that holds one
// (loop_poster, stream_workers) is then instantiated without instantiating
// Asio's property machinery for it.
template <class Executor>
struct post_executor {
  using type = decltype(post_executor_for(std::declval<const Executor&>()));
};
template <>
struct post_executor<asio::any_io_executor> {
  using type = asio::any_io_executor;
};

// Many posts to one executor (a stream's), never deferred (see above): what
// post_to() finds out about it, and post_executor_for(), made once.
template <class Executor>
class loop_poster {
 public:
  explicit loop_poster(const Executor& ex) : ex_(post_executor_for(ex)) {
    if (const io_executor* io = io_target(ex)) io_.emplace(*io);
  }

  template <class F>
  void operator()(F&& f) const {
    if (io_) {
      post_io(*io_, std::forward<F>(f));
    } else if constexpr (asio::execution::is_executor<Executor>::value) {
      ex_.execute(std::forward<F>(f));
    } else {
      asio::post(ex_, std::forward<F>(f));
    }
  }

 private:
  std::optional<io_executor> io_;
  typename post_executor<Executor>::type ex_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_LOOP_POST_HPP
