// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTING_SLOW_SERVICE_HPP
#define SLUICE_TESTING_SLOW_SERVICE_HPP

#include <sluice/config.hpp>
#include <sluice/detail/lazy.hpp>
#include <sluice/retry.hpp>
#include <sluice/testing/call_models.hpp>
#include <sluice/testing/quota.hpp>
#include <sluice/time.hpp>

#include <sluice/detail/asio.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace sluice::testing {

/// An injected failure of a `slow_service` call.
class service_error : public std::runtime_error {
 public:
  /// A failure of call number `index` (0-based) for `key`.
  service_error(const std::string& what, std::size_t index, std::string key)
      : std::runtime_error(what), index_(index), key_(std::move(key)) {}
  /// The failed call's 0-based index, in order of arrival.
  [[nodiscard]] std::size_t index() const noexcept { return index_; }
  /// The failed call's key ("" if none).
  [[nodiscard]] const std::string& key() const noexcept { return key_; }

 private:
  std::size_t index_;
  std::string key_;
};

/// A call refused by the provider's quota (HTTP 429). It carries the
/// provider's `Retry-After` hint as a `sluice::retry_after`: the time until
/// the quota would admit the same call if nothing else started meanwhile (the
/// oldest start or the tokens leaving the window, the first call in flight
/// ending), so `sluice::retryable` retries it and `sluice::retry` waits exactly
/// that long.
class throttled_error : public service_error, public sluice::retry_after {
 public:
  /// Same constructor as `service_error`, with no hint (zero).
  using service_error::service_error;
  /// A throttle of call `index` for `key` with the hint `after`.
  throttled_error(const std::string& what, std::size_t index, std::string key,
                  clock::duration after)
      : service_error(what, index, std::move(key)), sluice::retry_after{after} {}
};

/// How one call ended.
enum class call_result { running, ok, failed, throttled, cancelled };

/// One row of the timeline: times are relative to the service's origin (0 in
/// virtual time; the first call in real time).
struct call_record {
  std::size_t index;               ///< 0-based, in order of arrival
  std::string key;                 ///< the caller's key ("" if none)
  std::string op;                  ///< the caller's operation name ("" if none)
  std::chrono::nanoseconds start;  ///< when the call started
  std::chrono::nanoseconds end;    ///< when it ended (== start while running)
  call_result result;              ///< how it ended
  std::size_t tokens = 1;          ///< its weight (`call`'s third argument)
};

/// A simulated slow external provider (HTTP API, object store, LLM endpoint).
///
/// `call(key, op)` waits for the latency the model gives the call, on the
/// clock of the awaiting coroutine's executor: virtual under
/// `virtual_loop` (exact, instant), real otherwise (`time_scale` shrinks it for
/// demos). It may then fail (`service_error`), or be refused at once by the
/// global `quota`, the `capacity` schedule or the per-key `key_quota`
/// (`throttled_error`; a refused call is not in flight and takes no place in
/// a window; the error carries a `sluice::retry_after` hint). With
/// `load_latency`, latency grows with the calls already in flight, as a loaded
/// provider slows down. Cancellation ends
/// the wait with `operation_aborted` and is recorded. Statistics: calls, in
/// flight (now and maximum, overall and per key), collisions per key (a call
/// for a key while another for it is in flight), failures, throttles (overall
/// and per key), and a timeline.
///
/// Loop-affine: use it from the thread running its callers' loop.
///
/// @code
/// sluice::testing::slow_service places({.latency = sluice::testing::latency::uniform(1s, 5s,
/// 42)}); loop.run(sluice::gather_with_concurrency(5, make_calls(places, 14)));
/// assert(places.max_in_flight() == 5);
/// @endcode
class slow_service {
 public:
  /// How the service behaves; designated initializers: `{.latency = ..., .quota = {...}}`.
  struct options {
    latency_model latency = latency::fixed(std::chrono::seconds(1));  ///< per-call latency
    failure_model failure = {};  ///< which calls throw `service_error` (empty: none)
    struct quota quota = {};     ///< the provider's limit (`throttled_error` over it)
    /// The same limits for each key on its own (N in flight per key, M starts
    /// per window per key), beside the global `quota`; calls without a key are
    /// not subject to it. A call over either is throttled.
    struct quota key_quota = {};
    /// A capacity that changes over time (steps in increasing `at`; before the
    /// first step, and when empty, no such limit), beside `quota`: a call over
    /// the capacity now is throttled.
    std::vector<capacity_step> capacity = {};
    /// Latency that grows with load: a call's latency is multiplied by
    /// `1 + load_latency × (calls already in flight) / capacity`, where the
    /// capacity is the scheduled one now, else `quota.max_in_flight`, else 1.
    /// At capacity a call takes about `1 + load_latency` times its idle latency.
    double load_latency = 0.0;
    double time_scale = 1.0;      ///< multiplies every latency (real-time demos)
    bool record_timeline = true;  ///< off for million-call benchmarks
  };

  /// Every call takes 1 s, none fails, no quota.
  slow_service() : slow_service(options{}) {}
  /// Throws `std::invalid_argument` for an empty latency model or a time_scale <= 0.
  explicit slow_service(options o) : opt_(std::move(o)) {
    if (!opt_.latency)
      throw std::invalid_argument("sluice::testing::slow_service: no latency model");
    if (!(opt_.time_scale > 0.0))
      throw std::invalid_argument("sluice::testing::slow_service: time_scale must be > 0");
    if (!(opt_.load_latency >= 0.0))
      throw std::invalid_argument("sluice::testing::slow_service: load_latency must be >= 0");
    for (std::size_t i = 0; i < opt_.capacity.size(); ++i) {
      if (opt_.capacity[i].max_in_flight == 0 ||
          (i > 0 && opt_.capacity[i].at <= opt_.capacity[i - 1].at))
        throw std::invalid_argument(
            "sluice::testing::slow_service: capacity steps need max_in_flight >= 1 and "
            "increasing times");
    }
  }
  slow_service(const slow_service&) = delete;
  slow_service& operator=(const slow_service&) = delete;

  /// One call: waits for its latency, then returns or throws. `tokens` is its
  /// weight against `quota::tokens_per_window` (an LLM request's tokens).
  template <class Lazy = void>  // compiled only in the TUs that call it (detail/lazy.hpp)
  [[nodiscard]] asio::awaitable<void> call(std::string key = {}, std::string op = {},
                                           std::size_t tokens = 1) {
    auto ex = co_await asio::this_coro::executor;
    auto* vclock = sluice::detail::find_virtual_clock(ex);
    const auto t0 = vclock ? vclock->now() : clock::now();
    if (!origin_set_) {
      origin_ = vclock ? clock::time_point{} : t0;
      origin_set_ = true;
    }
    const std::size_t index = calls_++;
    const call_info info{index, key, op, tokens};
    if (opt_.record_timeline)
      timeline_.push_back(
          {index, key, op, t0 - origin_, t0 - origin_, call_result::running, tokens});

    key_stats* ks = key.empty() ? nullptr : &keys_[key];
    if (ks) ++ks->calls;
    if (window_state::too_heavy(opt_.quota, tokens) ||
        (ks && window_state::too_heavy(opt_.key_quota, tokens))) {
      ++failures_;
      finish(index, t0, call_result::failed);
      throw service_error("slow_service: call #" + std::to_string(index) + describe(key) +
                              " weighs more tokens than the quota's whole window",
                          index, key);
    }
    const std::size_t capacity = capacity_at(t0 - origin_);
    const bool over_capacity = capacity != 0 && global_.in_flight >= capacity;
    auto over_global = global_.throttled(opt_.quota, t0, tokens, scaled_window(opt_.quota));
    if (over_capacity)  // hint: when the first call in flight ends
      over_global =
          std::max(over_global.value_or(clock::duration::zero()), *global_.ends.begin() - t0);
    const auto over_key =
        ks ? ks->throttled(opt_.key_quota, t0, tokens, scaled_window(opt_.key_quota))
           : std::nullopt;
    if (over_global || over_key) {
      ++throttles_;
      if (ks) ++ks->throttles;
      finish(index, t0, call_result::throttled);
      throw throttled_error("slow_service: call #" + std::to_string(index) + describe(key) +
                                " throttled by the provider's " +
                                (over_capacity ? "capacity"
                                 : over_global ? "quota"
                                               : "per-key quota"),
                            index, key,
                            std::max(over_global.value_or(clock::duration::zero()),
                                     over_key.value_or(clock::duration::zero())));
    }
    clock::duration scaled{};
    try {  // a latency model that throws leaves no call in flight
      double factor = opt_.time_scale;
      if (opt_.load_latency > 0.0) {
        const std::size_t c =
            capacity ? capacity : std::max<std::size_t>(opt_.quota.max_in_flight, 1);
        factor *= 1.0 + opt_.load_latency * static_cast<double>(global_.in_flight) /
                            static_cast<double>(c);
      }
      scaled = sluice::detail::saturate(opt_.latency(info) * factor);
    } catch (...) {
      finish(index, t0, call_result::failed);
      throw;
    }
    const auto until = sluice::detail::add_saturating(t0, scaled);  // max(): never answers
    const auto end = global_.admit(opt_.quota, t0, until, tokens);
    const auto key_end = ks ? ks->admit(opt_.key_quota, t0, until, tokens) : decltype(end){};
    enter(key);
    struct ended {  // the call leaves the in-flight ends on every way out
      window_state& g;
      window_state* k;
      std::multiset<clock::time_point>::iterator e, ke;
      ~ended() {
        g.ends.erase(e);
        if (k) k->ends.erase(ke);
      }
    } on_exit{global_, ks, end, key_end};
    try {
      co_await sluice::detail::wait_until(sluice::detail::lazy<Lazy>(ex), vclock, until);
    } catch (...) {
      leave(key);
      ++cancellations_;
      finish(index, vclock ? vclock->now() : clock::now(), call_result::cancelled);
      throw;
    }
    leave(key);
    const auto t1 = vclock ? vclock->now() : clock::now();
    if (opt_.failure && opt_.failure(info)) {
      ++failures_;
      finish(index, t1, call_result::failed);
      throw service_error(
          "slow_service: call #" + std::to_string(index) + describe(key) + " failed", index, key);
    }
    ++completed_;
    finish(index, t1, call_result::ok);
  }

  /// Calls started (throttled ones included).
  [[nodiscard]] std::size_t calls() const noexcept { return calls_; }
  /// Calls that returned normally.
  [[nodiscard]] std::size_t completed() const noexcept { return completed_; }
  /// Calls that threw `service_error` (the failure model's choice).
  [[nodiscard]] std::size_t failures() const noexcept { return failures_; }
  /// Calls refused by the quota (`throttled_error`).
  [[nodiscard]] std::size_t throttles() const noexcept { return throttles_; }
  /// Calls cancelled while waiting.
  [[nodiscard]] std::size_t cancellations() const noexcept { return cancellations_; }
  /// Calls in flight now.
  [[nodiscard]] std::size_t in_flight() const noexcept { return global_.in_flight; }
  /// The most calls ever in flight at once.
  [[nodiscard]] std::size_t max_in_flight() const noexcept { return max_in_flight_; }
  /// Calls for `key` in flight now.
  [[nodiscard]] std::size_t in_flight(const std::string& key) const {
    return per_key(key).in_flight;
  }
  /// The most calls for `key` ever in flight at once.
  [[nodiscard]] std::size_t max_in_flight(const std::string& key) const {
    return per_key(key).max_in_flight;
  }
  /// Calls made for `key` (throttled ones included).
  [[nodiscard]] std::size_t calls(const std::string& key) const { return per_key(key).calls; }
  /// Calls for `key` refused by either quota.
  [[nodiscard]] std::size_t throttles(const std::string& key) const {
    return per_key(key).throttles;
  }
  /// Calls for `key` that started while another call for it was in flight.
  [[nodiscard]] std::size_t collisions(const std::string& key) const {
    return per_key(key).collisions;
  }
  /// Collisions summed over all keys.
  [[nodiscard]] std::size_t collisions() const noexcept { return collisions_; }
  /// One record per call, in order of arrival (empty if record_timeline is off).
  [[nodiscard]] const std::vector<call_record>& timeline() const noexcept { return timeline_; }
  /// The scheduled capacity at `t` since the origin (0: no schedule there);
  /// the steps' times are scaled by `time_scale` as latencies are.
  [[nodiscard]] std::size_t capacity_at(std::chrono::nanoseconds t) const noexcept {
    std::size_t c = 0;
    for (const auto& step : opt_.capacity) {
      if (sluice::detail::saturate(step.at * opt_.time_scale) > t) break;
      c = step.max_in_flight;
    }
    return c;
  }
  /// The options' time_scale.
  [[nodiscard]] double time_scale() const noexcept { return opt_.time_scale; }

 private:
  // What a quota counts, with a key's statistics beside it.
  using window_state = sluice::detail::quota_window;
  struct key_stats : window_state {
    std::size_t calls = 0, throttles = 0, max_in_flight = 0, collisions = 0;
  };

  static std::string describe(const std::string& key) {
    return key.empty() ? "" : " (key " + key + ")";
  }

  const key_stats& per_key(const std::string& key) const {
    static const key_stats empty;
    auto it = keys_.find(key);
    return it == keys_.end() ? empty : it->second;
  }

  [[nodiscard]] clock::duration scaled_window(const quota& q) const {
    return sluice::detail::saturate(q.window * opt_.time_scale);
  }

  void enter(const std::string& key) {
    max_in_flight_ = std::max(max_in_flight_, ++global_.in_flight);
    if (key.empty()) return;
    auto& k = keys_[key];
    if (k.in_flight > 0) {
      ++k.collisions;
      ++collisions_;
    }
    k.max_in_flight = std::max(k.max_in_flight, ++k.in_flight);
  }

  void leave(const std::string& key) {
    --global_.in_flight;
    if (!key.empty()) --keys_[key].in_flight;
  }

  void finish(std::size_t index, clock::time_point t, call_result r) {
    if (!opt_.record_timeline) return;
    timeline_[index].end = t - origin_;
    timeline_[index].result = r;
  }

  options opt_;
  bool origin_set_ = false;
  clock::time_point origin_{};
  std::size_t calls_ = 0, completed_ = 0, failures_ = 0, throttles_ = 0, cancellations_ = 0;
  std::size_t max_in_flight_ = 0, collisions_ = 0;
  std::unordered_map<std::string, key_stats> keys_;
  window_state global_;
  std::vector<call_record> timeline_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTING_SLOW_SERVICE_HPP
