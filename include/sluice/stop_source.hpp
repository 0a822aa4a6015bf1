// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_STOP_SOURCE_HPP
#define SLUICE_STOP_SOURCE_HPP

#include <sluice/config.hpp>
#include <sluice/time.hpp>

#include <chrono>
#include <optional>
#include <stdexcept>

namespace sluice {

class stop_source;

namespace detail {

// Something a stop_source stops (a running task_group): an intrusive list
// node. Invariant: source != nullptr exactly while linked into its list.
class stop_listener {
 public:
  stop_listener() = default;
  stop_listener(const stop_listener&) = delete;
  stop_listener& operator=(const stop_listener&) = delete;

  // Called inline by stop_source::request (every request, so a later one may
  // shorten the grace).
  virtual void on_stop_requested(clock::duration grace) = 0;

  inline void attach(stop_source& s);
  inline void detach() noexcept;

 protected:
  ~stop_listener() { detach(); }

 private:
  friend class sluice::stop_source;
  stop_source* source_ = nullptr;
  stop_listener* prev_ = nullptr;
  stop_listener* next_ = nullptr;
};

}  // namespace detail

/// A request to shut down, from outside: a signal handler, an admin endpoint,
/// a deadline. Pass it to `sluice::task_group::run(limit, body, stop)`;
/// `request(grace)` then stops the group gracefully: it stops accepting
/// children, lets the running ones finish for `grace` on the group's clock,
/// cancels what still runs after that, and `run` returns (see
/// `sluice::task_group`).
///
/// One stop source may stop several groups (each running `run` registered
/// with it). A request made before a group's `run` starts makes that `run`
/// return at once without calling its body. A later `request` may shorten
/// the grace (the earliest deadline wins), never lengthen it.
///
/// Loop-affine: call `request` from the loop that runs the groups it stops
/// (an `asio::signal_set` handler on that loop is the usual caller); nothing
/// is resumed inline: the children's cancellations are delivered the Asio
/// way. Not copyable or movable; it must outlive the `run` calls given it.
///
/// @code
/// sluice::stop_source stop;
/// asio::signal_set signals(ex, SIGINT, SIGTERM);
/// signals.async_wait([&](auto, int) { stop.request(std::chrono::seconds(5)); });
/// co_await sluice::task_group::run(16, [&](sluice::task_group& g) -> asio::awaitable<void> {
///   for (;;) {
///     job j = co_await jobs.get();                               // a sluice::queue<job>
///     if (!co_await g.spawn_when_ready(run_job(j))) co_return;  // false once stopping
///   }
/// }, stop);
/// signals.cancel();
/// @endcode
class stop_source {
 public:
  /// Not requested yet.
  stop_source() = default;
  stop_source(const stop_source&) = delete;
  stop_source& operator=(const stop_source&) = delete;
  /// Forgets the groups still registered (they are not stopped).
  ~stop_source() {
    while (head_ != nullptr) head_->detach();
  }

  /// Requests the stop: every group registered now is stopped gracefully,
  /// with `grace` to let its running children finish (zero: they are
  /// cancelled at once). `grace` is any `std::chrono::duration`, saturated
  /// instead of overflowing: `max()` lets them run until they finish (under
  /// `sluice::testing::virtual_loop` that grace never ends on its own).
  /// Throws `std::invalid_argument` for a negative grace.
  template <class Rep, class Period>
  void request(std::chrono::duration<Rep, Period> grace_in) {
    const clock::duration grace = detail::saturate(grace_in);
    if (grace < clock::duration::zero())
      throw std::invalid_argument("sluice::stop_source::request: negative grace");
    if (!grace_ || grace < *grace_) grace_ = grace;
    for (detail::stop_listener* l = head_; l != nullptr;) {
      detail::stop_listener* next = l->next_;
      l->on_stop_requested(grace);
      l = next;
    }
  }

  /// As `request(grace)` with no grace: the running children are cancelled
  /// at once.
  void request() { request(clock::duration::zero()); }

  /// True once `request` was called.
  [[nodiscard]] bool stop_requested() const noexcept { return grace_.has_value(); }

  /// The shortest grace requested so far (empty before any request).
  [[nodiscard]] std::optional<clock::duration> grace() const noexcept { return grace_; }

 private:
  friend class detail::stop_listener;
  detail::stop_listener* head_ = nullptr;
  std::optional<clock::duration> grace_;
};

namespace detail {

inline void stop_listener::attach(stop_source& s) {
  detach();
  source_ = &s;
  next_ = s.head_;
  if (next_ != nullptr) next_->prev_ = this;
  s.head_ = this;
}

inline void stop_listener::detach() noexcept {
  if (source_ == nullptr) return;
  if (prev_ != nullptr) {
    prev_->next_ = next_;
  } else {
    source_->head_ = next_;
  }
  if (next_ != nullptr) next_->prev_ = prev_;
  source_ = nullptr;
  prev_ = next_ = nullptr;
}

}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_STOP_SOURCE_HPP
