// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_STRAND_PERMIT_HPP
#define SLUICE_DETAIL_STRAND_PERMIT_HPP

// sluice::strand_permit, the permit strand_bound's scoped_acquire returns
// (public; included by strand_bound.hpp), and the guard that releases it on
// the strand only while its limit lives.

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <concepts>
#include <memory>
#include <new>
#include <utility>

namespace sluice {
namespace detail {

// A permit in flight to its strand: dropped there by drop(f) (f(P&) first),
// or, if the post is destroyed unrun (the loop's end), on destruction. Either
// way P is destroyed (released) only while its limit lives: when `alive` has
// expired (a strand_bound destroyed first), P is abandoned, its destructor
// never run, so nothing touches the dead limit.
template <class P>
class guarded_permit {
 public:
  guarded_permit(P&& p, std::weak_ptr<void> alive, bool guarded) noexcept
      : alive_(std::move(alive)), guarded_(guarded), live_(true) {
    ::new (static_cast<void*>(&p_)) P(std::move(p));
  }
  guarded_permit(guarded_permit&& o) noexcept
      : alive_(std::move(o.alive_)), guarded_(o.guarded_), live_(o.live_) {
    if (!live_) return;
    ::new (static_cast<void*>(&p_)) P(std::move(o.p_));
    o.p_.~P();  // moved from: releases nothing
    o.live_ = false;
  }
  guarded_permit& operator=(guarded_permit&&) = delete;
  ~guarded_permit() {
    drop([](P&) {});
  }

  template <class F>
  void drop(F& f) {
    if (!live_) return;
    const auto keep = alive_.lock();
    live_ = false;
    if (guarded_ && !keep) return;  // abandoned: the limit is gone
    struct destroy {
      P& p;
      ~destroy() { p.~P(); }
    } d{p_};
    f(p_);
  }
  template <class F>
  void drop(F&& f) {
    drop(f);
  }

 private:
  std::weak_ptr<void> alive_;
  bool guarded_;
  bool live_;
  union {
    P p_;
  };
};

}  // namespace detail

/// A permit of a limit that lives on a strand (`strand_bound<L>::scoped_acquire`):
/// move-only; its release is posted to the limit's strand, so it may be
/// dropped on any thread.
///
/// `P` is the limit's own permit (`semaphore::permit`, `lock::guard`,
/// `keyed_semaphore<K>::permit`, `adaptive_limit::permit`, ...). `get()` gives
/// read access to it for members that only read the permit itself (`key()` of
/// a keyed permit); a member that touches the limit (`adaptive_limit`'s
/// outcome reports) goes through `release_with(f)`, or `succeeded()`,
/// `throttled()`, `dropped()` where `P` has them.
///
/// Lifetimes: the `strand_bound` should outlive its permits, and the strand's
/// loop should still run when the last one is dropped (a release posted to a
/// loop that never runs it again is destroyed with the loop, where it releases
/// as the loop shuts down). A permit of a `strand_bound` destroyed first is
/// abandoned when dropped: nothing is released (the limit is gone), nothing
/// dangles; its own storage (a key) is not freed.
template <class P>
class strand_permit {
 public:
  /// An empty permit that owns nothing.
  strand_permit() noexcept = default;
  /// Takes over `inner`, a permit of the limit that lives on `strand`. Called
  /// on the strand.
  strand_permit(asio::any_io_executor strand, P inner) noexcept
      : strand_(std::move(strand)), inner_(std::move(inner)) {}
  /// As above, for a limit that lives while `alive` does (`strand_bound`'s):
  /// the permit is released only while it lives, else abandoned.
  strand_permit(asio::any_io_executor strand, P inner, std::weak_ptr<void> alive) noexcept
      : strand_(std::move(strand)),
        inner_(std::move(inner)),
        alive_(std::move(alive)),
        guarded_(true) {}
  /// Takes over `other`'s ownership; `other` is left empty.
  strand_permit(strand_permit&& other) noexcept
      : strand_(other.strand_),
        inner_(std::move(other.inner_)),
        alive_(other.alive_),
        guarded_(other.guarded_) {}
  /// Releases what this owns (posted), then takes over `other`'s ownership.
  strand_permit& operator=(strand_permit&& other) noexcept {
    if (this != &other) {
      reset();
      strand_ = other.strand_;
      inner_ = std::move(other.inner_);
      alive_ = other.alive_;
      guarded_ = other.guarded_;
    }
    return *this;
  }
  ~strand_permit() { reset(); }

  /// True while it owns a permit.
  explicit operator bool() const noexcept { return static_cast<bool>(inner_); }

  /// Releases the permit now, from any thread: the release is posted to the
  /// limit's strand (no-op when empty).
  void reset() noexcept {
    if (!inner_) return;
    asio::post(strand_, [p = detail::guarded_permit<P>(std::move(inner_), alive_,
                                                       guarded_)]() mutable { p.drop([](P&) {}); });
  }

  /// Runs `f(P&)` on the limit's strand with the permit, then releases it
  /// there: for the members of `P` that touch the limit. Posted; returns at
  /// once (no-op when empty). What `f` throws is thrown on the strand, out of
  /// the `run()` of the thread that runs it.
  template <class F>
  requires std::invocable<F&, P&>
  void release_with(F f) {
    if (!inner_) return;
    asio::post(strand_, [p = detail::guarded_permit<P>(std::move(inner_), alive_, guarded_),
                         f = std::move(f)]() mutable { p.drop(f); });
  }

  /// `adaptive_limit::permit`: reports the call's outcome on the limit's
  /// strand and releases (the latency it feeds the algorithm runs from the
  /// grant on the strand to this report there, so it includes the hop).
  void succeeded() requires requires(P& p) { p.succeeded(); }
  {
    release_with([](P& p) { p.succeeded(); });
  }
  /// As `succeeded()`, for a throttle.
  void throttled() requires requires(P& p) { p.throttled(); }
  {
    release_with([](P& p) { p.throttled(); });
  }
  /// As `succeeded()`, for a timeout or a drop.
  void dropped() requires requires(P& p) { p.dropped(); }
  {
    release_with([](P& p) { p.dropped(); });
  }

  /// The limit's own permit, for reading it (see the class comment).
  [[nodiscard]] const P& get() const noexcept { return inner_; }

 private:
  asio::any_io_executor strand_;
  P inner_;
  std::weak_ptr<void> alive_;
  bool guarded_ = false;
};

}  // namespace sluice

#endif  // SLUICE_DETAIL_STRAND_PERMIT_HPP
