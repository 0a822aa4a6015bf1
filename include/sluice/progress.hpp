// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_PROGRESS_HPP
#define SLUICE_PROGRESS_HPP

// A vocabulary header: below the machinery (it includes detail/ and the
// standard library only, never time.hpp; tests/cmake/layers.cmake checks).

#include <sluice/config.hpp>
#include <sluice/detail/ranges.hpp>
#include <sluice/detail/virtual_clock.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <exception>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace sluice {

/// The clock of every sluice wait on time (the same alias as in
/// `<sluice/time.hpp>`): `std::chrono::steady_clock`, carrying virtual time
/// under `sluice::testing::virtual_loop`.
using clock = detail::clock;

namespace detail {
template <class F>
class progress_tracker;
}  // namespace detail

/// What a progress report says about a running fan-out (`gather`,
/// `gather_with_concurrency`, `map_unordered`, `task_group::run`).
///
/// `started == done + failed + in_flight` at every report, and `in_flight ==
/// running() + waiting_on_limits`.
///
/// "In flight" is the fan-out's view: a task it started that has not
/// finished. A task that waits inside for a limit (`co_await
/// sem.scoped_acquire()` before its call) is in flight but not at the
/// provider: an unbounded `gather` of 500 such tasks behind a `semaphore{8}`
/// has 500 in flight and 8 running. Name the limits the tasks wait on with
/// `progress::waiting_on` and the report splits them: `waiting_on_limits`
/// and `running()`. (Or bound the fan-out itself,
/// `gather_with_concurrency(8, ...)`: then nothing waits inside and
/// `in_flight` is what runs.)
struct progress_info {
  /// How many tasks there are: the input's size when it is a sized range
  /// (a container, `std::views::iota(0, n)`); empty for a lazy range of
  /// unknown length, an asynchronous source and a `task_group`.
  std::optional<std::size_t> total;
  std::size_t started = 0;    ///< tasks started so far
  std::size_t done = 0;       ///< tasks that finished with a value
  std::size_t failed = 0;     ///< tasks that finished with an exception (cancelled ones too)
  std::size_t in_flight = 0;  ///< started and not finished (running or waiting on a limit)
  /// Of `in_flight`: tasks waiting for a limit named with
  /// `progress::waiting_on`, read from the limits' `waiters()` at the report
  /// (at most `in_flight`: waiters of other callers are not told apart). 0
  /// when no limit is named.
  std::size_t waiting_on_limits = 0;
  /// `task_group` only: children accepted by `spawn` and waiting for a slot.
  /// (A fan-out over a range pulls lazily: nothing waits; `*total - started`
  /// is what is left.)
  std::size_t waiting = 0;
  clock::duration elapsed{};  ///< since the fan-out started, on the executor's clock

  /// Tasks that finished either way: `done + failed`.
  [[nodiscard]] std::size_t finished() const noexcept { return done + failed; }
  /// Tasks in flight and not waiting on a named limit: `in_flight -
  /// waiting_on_limits` (the calls at the provider, when the tasks wait on
  /// nothing else). A report made as a task starts counts that task here:
  /// it has not reached its limit yet.
  [[nodiscard]] std::size_t running() const noexcept { return in_flight - waiting_on_limits; }
};

/// Progress reporting for a fan-out: pass `sluice::progress(report)` (last) to
/// `gather`, `gather_with_concurrency`, `map_unordered`, `as_completed` or
/// `task_group::run`.
///
/// `report(const sluice::progress_info&)` is called
/// - when a task starts or finishes and at least `every` has passed on the
///   executor's clock since the previous report (the first: since the start),
///   so at most once per `every`;
/// - and once at the end, with the final counts, when every task has finished
///   (also when the fan-out fails or is cancelled; not when it throws before
///   starting anything: `limit == 0`, a caller cancelled before the call),
///   unless the last periodic report, made at that same instant, already had
///   the final counts (no line printed twice). The last report is the end
///   state; the awaited call returns right after it.
///
/// Why no timer of its own: the counts change only when a task starts or
/// finishes, so a report between two such events would say nothing new. A
/// report is a side effect of an event: nothing runs while nothing changes,
/// nothing has to be stopped at the end, and under
/// `sluice::testing::virtual_loop` the report instants are exact and a
/// deadlock is still reported as one (a ticking timer would keep the virtual
/// clock jumping forever). The price: during a quiet stretch (every task in a
/// long call) no report comes; `elapsed` in the next one says how long it was.
///
/// What runs where: `report` runs inline on the fan-out's executor, inside
/// the worker whose task started or finished (the end report: inside the
/// awaited call, or the stream's last worker), so it must be quick and must
/// not wait. Loop-affine as the fan-out.
///
/// Throws: an exception thrown by `report` stops further reports; the fan-out
/// runs on and the call rethrows it at the end (`stream::next()` for a
/// stream), unless the fan-out failed with an error of its own first.
/// `every < 0`: `std::invalid_argument`. `every == 0` reports every change.
///
/// Lifetimes: `report` is moved into the fan-out and called until it
/// completes; what it references must outlive the awaited call (for a
/// stream: every task of the stream, as for its function).
///
/// Cost: nothing when not passed (the fan-outs' code without it is unchanged);
/// with it, a clock read per started and per finished task.
///
/// @code
/// auto bar = [](const sluice::progress_info& p) {
///   std::printf("\r%zu/%zu done, %zu failed, %zu in flight", p.finished(), *p.total, p.failed,
///               p.in_flight);
/// };
/// auto pages = co_await sluice::gather_with_concurrency(8, std::move(fetches),
///                                                       sluice::progress(bar, 500ms));
/// @endcode
template <class F>
requires std::invocable<F&, const progress_info&>
class progress {
 public:
  /// Reports through `report` at most once per `every` (default 1 s).
  explicit progress(F report) : progress(std::move(report), std::chrono::seconds(1)) {}

  /// As above, at most once per `every` (any `std::chrono::duration`,
  /// saturated instead of overflowing).
  template <class Rep, class Period>
  progress(F report, std::chrono::duration<Rep, Period> every)
      : report_(std::move(report)), every_(detail::saturate(every)) {
    if (every_ < clock::duration::zero())
      throw std::invalid_argument("sluice::progress: `every` must not be negative");
  }

  /// The minimal distance between two reports (the end report excepted).
  [[nodiscard]] clock::duration every() const noexcept { return every_; }

  /// Names a limit the fan-out's tasks wait on (anything with `waiters()`:
  /// `semaphore`, `rate_limiter`, `adaptive_limit`, ...): each report counts
  /// its waiters in `progress_info::waiting_on_limits`. Call it once per
  /// limit. The limit must outlive the fan-out; it is read on the fan-out's
  /// executor, at each report (loop-affine limits: the fan-out's loop).
  ///
  /// @code
  /// sluice::semaphore provider{8};
  /// auto bar = sluice::progress(draw, 500ms).waiting_on(provider);  // running() <= 8
  /// @endcode
  template <class Limit>
  requires requires(const Limit& l) {
    { l.waiters() } -> std::convertible_to<std::size_t>;
  }
  progress& waiting_on(const Limit& limit) & {
    limits_.push_back({&limit, [](const void* l) -> std::size_t {
                         return static_cast<const Limit*>(l)->waiters();
                       }});
    return *this;
  }
  /// As above, on a temporary: `sluice::progress(report).waiting_on(sem)`.
  template <class Limit>
  requires requires(const Limit& l) {
    { l.waiters() } -> std::convertible_to<std::size_t>;
  }
  progress&& waiting_on(const Limit& limit) && { return std::move(waiting_on(limit)); }

 private:
  template <class>
  friend class detail::progress_tracker;
  struct named_limit {
    const void* limit;
    std::size_t (*waiters)(const void*);
  };
  F report_;
  clock::duration every_;
  std::vector<named_limit> limits_;
};

/// True for the `sluice::progress<F>` types.
template <class P>
inline constexpr bool is_progress_v = false;
template <class F>
inline constexpr bool is_progress_v<progress<F>> = true;

namespace detail {

// The counters and report schedule of one fan-out that has a progress<F>.
// Invariant: started_ == done + failed + in flight; next_ is the earliest
// instant of the next periodic report.
template <class F>
class progress_tracker {
 public:
  static constexpr bool enabled = true;

  explicit progress_tracker(progress<F>&& p)
      : report_(std::move(p.report_)), every_(p.every_), limits_(std::move(p.limits_)) {}

  // The fan-out starts on `ex` (before its first task).
  template <class Executor>
  void begin(const Executor& ex, std::optional<std::size_t> total) {
    vclock_ = find_virtual_clock(ex);
    begun_ = true;
    t0_ = read_clock();
    next_ = add_saturating(t0_, every_);
    info_.total = total;
  }

  void started(std::size_t waiting = 0) {
    ++info_.started;
    ++info_.in_flight;
    info_.waiting = waiting;
    tick();
  }
  // report = false: the caller reports after it has started the task that
  // takes the slot (tick() or started()), so a report never shows a slot
  // that is only changing hands.
  void ended(bool failed, std::size_t waiting = 0, bool report = true) {
    --info_.in_flight;
    ++(failed ? info_.failed : info_.done);
    info_.waiting = waiting;
    if (report) tick();
  }
  // The waiting count changed without a start or an end (a task_group spawn).
  void waiting(std::size_t n) { info_.waiting = n; }

  // The end report (once).
  // The end report (once): skipped only when the last report, made at the
  // same instant, already said the same.
  void finish() {
    if (finished_) return;
    finished_ = true;
    const auto t = read_clock();
    if (reported_ && t - t0_ == info_.elapsed && last_ == counts()) return;
    call(t);
  }

  // An exception thrown by report (the first), for the call to rethrow.
  [[nodiscard]] std::exception_ptr error() const noexcept { return error_; }
  [[nodiscard]] bool begun() const noexcept { return begun_; }

  // A report if one is due.
  void tick() {
    if (error_) return;
    const auto t = read_clock();
    if (t < next_) return;
    next_ = add_saturating(t, every_);
    call(t);
  }

 private:
  clock::time_point read_clock() const { return vclock_ ? vclock_->now() : clock::now(); }

  struct counts_t {
    std::size_t started, done, failed, waiting;
    bool operator==(const counts_t&) const = default;
  };
  counts_t counts() const noexcept {
    return {info_.started, info_.done, info_.failed, info_.waiting};
  }

  void call(clock::time_point t) {
    if (error_) return;
    info_.elapsed = t - t0_;
    std::size_t waiting = 0;
    for (const auto& l : limits_) waiting += l.waiters(l.limit);
    info_.waiting_on_limits = waiting < info_.in_flight ? waiting : info_.in_flight;
    reported_ = true;
    last_ = counts();
    try {
      report_(std::as_const(info_));
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  F report_;
  clock::duration every_;
  std::vector<typename progress<F>::named_limit> limits_;
  virtual_clock_service* vclock_ = nullptr;
  clock::time_point t0_{}, next_{};
  progress_info info_;
  std::exception_ptr error_;
  counts_t last_{};
  bool begun_ = false;
  bool reported_ = false;
  bool finished_ = false;
};

// No progress: every hook is empty and inlines to nothing.
struct no_progress {
  static constexpr bool enabled = false;
  template <class Executor>
  void begin(const Executor&, std::optional<std::size_t>) noexcept {}
  void started(std::size_t = 0) noexcept {}
  void ended(bool, std::size_t = 0, bool = true) noexcept {}
  void tick() noexcept {}
  void waiting(std::size_t) noexcept {}
  void finish() noexcept {}
  [[nodiscard]] std::exception_ptr error() const noexcept { return nullptr; }
  [[nodiscard]] static constexpr bool begun() noexcept { return false; }
};

// The tracker for a progress<F> argument (no_progress for none).
template <class... P>
struct tracker_for {
  using type = no_progress;
};
template <class F>
struct tracker_for<progress<F>> {
  using type = progress_tracker<F>;
};

// A progress tracker behind a virtual interface, for task_group (not a
// template): a null pointer when no progress was passed.
class progress_hooks {
 public:
  virtual ~progress_hooks() = default;
  virtual void begin(const asio::any_io_executor& ex) = 0;
  virtual void started(std::size_t waiting) = 0;
  virtual void ended(bool failed, std::size_t waiting, bool report) = 0;
  virtual void tick() = 0;
  virtual void waiting(std::size_t n) = 0;
  virtual void finish() = 0;
  [[nodiscard]] virtual std::exception_ptr error() const noexcept = 0;
};

template <class F>
class progress_hooks_for final : public progress_hooks {
 public:
  explicit progress_hooks_for(progress<F>&& p) : t_(std::move(p)) {}
  void begin(const asio::any_io_executor& ex) override { t_.begin(ex, std::nullopt); }
  void started(std::size_t waiting) override { t_.started(waiting); }
  void ended(bool failed, std::size_t waiting, bool report) override {
    t_.ended(failed, waiting, report);
  }
  void tick() override { t_.tick(); }
  void waiting(std::size_t n) override { t_.waiting(n); }
  void finish() override { t_.finish(); }
  [[nodiscard]] std::exception_ptr error() const noexcept override { return t_.error(); }

 private:
  progress_tracker<F> t_;
};

// The input's size, when it has one.
template <class R>
std::optional<std::size_t> size_if_known(R& r) {
  if constexpr (std::ranges::sized_range<R>) {
    return static_cast<std::size_t>(std::ranges::size(r));
  } else {
    return std::nullopt;
  }
}

}  // namespace detail

}  // namespace sluice

#endif  // SLUICE_PROGRESS_HPP
