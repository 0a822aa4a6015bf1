// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_WAIT_BOUND_HPP
#define SLUICE_DETAIL_WAIT_BOUND_HPP

// The shedding bound of one limit's FIFO of waiters (shed_options given to a
// limit): refuses a waiter past max_waiting, and takes out the waiters whose
// wait reached max_wait. Used by permit_core and rate_core, inside their wait
// path; a limit without shed_options has none (a null pointer: no cost on
// the grant paths).

#include <sluice/config.hpp>
#include <sluice/overloaded_error.hpp>

#include <sluice/detail/virtual_clock.hpp>
#include <sluice/detail/waiter_list.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace sluice::detail {

// The exception of a coroutine whose wait a bound refused (the completion
// was overloaded_code()). Out of line: the wait paths stay small.
[[noreturn, gnu::noinline]] inline void throw_overloaded(clock::duration after) {
  throw overloaded_error(after, "shed_options refused the wait");
}

// Invariants: every waiter of the list it bounds waits since an instant no
// later than the one behind it (FIFO), so the head's deadline is the
// earliest; the timer is armed (for the head's deadline or an earlier one)
// while the list has a waiter and max_wait is bounded, and disarmed when the
// list empties (idle()): it holds nothing of a loop between waits.
//
// The timer's side (queued, idle, the re-arm) is virtual, implemented by
// wait_bound_timer (impl/wait_bound.ipp), which only make() names: a limit built without
// shed_options never calls make(), so a TU that only uses such limits does
// not compile the timer (rate_timer, a steady timer's wait: some 170
// functions of a -O0 object; issue 32).
class wait_bound {
 public:
  virtual ~wait_bound() = default;

  // Throws std::invalid_argument for options no limit takes.
  static void check(const shed_options& o, const char* who) {
    if (o.linger != clock::duration::zero())
      throw std::invalid_argument(std::string(who) +
                                  ": shed_options.linger is an option of the sluice::shed "
                                  "policy layer, not of a limit");
    if (o.max_wait <= clock::duration::zero())
      throw std::invalid_argument(std::string(who) +
                                  ": shed_options.max_wait must be positive (max_waiting = 0 "
                                  "sheds every call that would wait)");
  }

  // Null when `o` bounds nothing (the default shed_options). `expire(context)`
  // runs when the timer fires: the limit takes out the waiters whose deadline
  // passed (take_expired) and re-arms.
  template <class Lazy = void>  // compiled only where a limit is given shed_options
  static std::unique_ptr<wait_bound> make(const shed_options& o, const char* who,
                                          void (*expire)(void*), void* context);

  // True when a new waiter behind `waiting` others must be shed.
  [[nodiscard]] bool full(std::size_t waiting) const noexcept { return waiting >= max_waiting_; }
  [[nodiscard]] bool timed() const noexcept { return max_wait_ != clock::duration::max(); }
  [[nodiscard]] clock::duration max_wait() const noexcept { return max_wait_; }
  [[nodiscard]] clock::duration retry_after() const noexcept { return retry_after_; }
  [[nodiscard]] clock::time_point deadline(clock::time_point since) const noexcept {
    return since > clock::time_point::max() - max_wait_ ? clock::time_point::max()
                                                        : since + max_wait_;
  }

  // A waiter that began at `since` on `ex` was queued; `alone`: it is the
  // only one (the timer is not armed). `ex` empty (a use_future waiter on a
  // limit without an executor) on the steady clock: nothing to run a timer
  // on, so max_wait is not enforced until a waiter with one arrives alone.
  virtual void queued(bool alone, clock::time_point since, virtual_clock_service* v,
                      const asio::any_io_executor& ex) = 0;

  // Takes the waiters of `list` whose deadline is past `now` out, from the
  // head, each through `shed(node)` (which completes it with
  // overloaded_code()); re-arms for the first that remains.
  template <class SinceOf, class Shed>
  void take_expired(waiter_list& list, clock::time_point now, SinceOf since_of, Shed shed) {
    while (waiter_node* head = list.front()) {
      const clock::time_point d = deadline(since_of(head));
      if (d > now) {
        rearm(d);
        return;
      }
      list.erase(head);
      shed(head);
    }
    idle();
  }

  // The list emptied: let the timer go.
  virtual void idle() noexcept = 0;

 protected:
  explicit wait_bound(const shed_options& o) noexcept
      : max_waiting_(o.max_waiting), max_wait_(o.max_wait), retry_after_(o.retry_after) {}
  virtual void rearm(clock::time_point deadline) = 0;

 private:
  std::size_t max_waiting_;
  clock::duration max_wait_;
  clock::duration retry_after_;
};

#if defined(SLUICE_SEPARATE_COMPILATION)
extern template std::unique_ptr<wait_bound> wait_bound::make<void>(const shed_options&, const char*,
                                                                   void (*)(void*), void*);
#endif

}  // namespace sluice::detail

#if SLUICE_HEADER_DEFS
#include <sluice/impl/wait_bound.ipp>
#endif

#endif  // SLUICE_DETAIL_WAIT_BOUND_HPP
