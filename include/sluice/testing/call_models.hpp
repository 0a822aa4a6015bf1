// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTING_CALL_MODELS_HPP
#define SLUICE_TESTING_CALL_MODELS_HPP

#include <sluice/config.hpp>
#include <sluice/retry.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

namespace sluice::testing {

/// What a latency or failure model sees of one call. `key` and `op` are
/// `std::string_view`s of the caller's arguments, valid while the model runs:
/// copy them (`std::string(info.key)`) to keep them.
struct call_info {
  std::size_t index;       ///< 0-based, in order of arrival
  std::string_view key;    ///< the caller's key ("" if none); a view, see above
  std::string_view op;     ///< the caller's operation name ("" if none); a view
  std::size_t tokens = 1;  ///< the call's weight against `quota::tokens_per_window`
};

/// Per-call latency: any function of the call, returning a
/// `std::chrono::nanoseconds`, which is `sluice::clock::duration` (any
/// `std::chrono` duration that converts exactly, `1s` or `120ms`, will do).
using latency_model = std::function<std::chrono::nanoseconds(const call_info&)>;
/// Per-call failure: true makes the call throw `service_error` after its latency.
using failure_model = std::function<bool(const call_info&)>;

/// Latency models.
namespace latency {
/// Every call takes `d`.
inline latency_model fixed(sluice::saturating_duration d) {  // any duration, saturated
  return [d](const call_info&) {
    return d;
  };
}
/// Uniform in [lo, hi] in whole milliseconds, drawn from (seed, call index).
/// `lo` and `hi` take any duration, saturated.
inline latency_model uniform(sluice::saturating_duration lo, sluice::saturating_duration hi,
                             std::uint64_t seed = 1) {
  if (hi < lo) throw std::invalid_argument("sluice::testing::latency::uniform: hi < lo");
  const auto lo_ms = std::chrono::ceil<std::chrono::milliseconds>(lo).count();
  const auto span = std::chrono::floor<std::chrono::milliseconds>(hi).count() - lo_ms + 1;
  return [=](const call_info& c) -> std::chrono::nanoseconds {
    const auto r =
        sluice::detail::mix(seed * 0x100000001b3ULL ^ c.index) % static_cast<std::uint64_t>(span);
    return std::chrono::milliseconds(lo_ms + static_cast<std::int64_t>(r));
  };
}
/// Call i takes `list[i % list.size()]`.
inline latency_model sequence(std::vector<std::chrono::nanoseconds> list) {
  if (list.empty()) throw std::invalid_argument("sluice::testing::latency::sequence: empty list");
  return [l = std::move(list)](const call_info& c) {
    return l[c.index % l.size()];
  };
}
/// Any function of the call (key, op, index).
inline latency_model from(latency_model f) {
  return f;
}
}  // namespace latency

/// Failure models.
namespace failures {
/// No call fails.
inline failure_model none() {
  return {};
}
/// The calls with these 0-based indices fail.
inline failure_model at_calls(std::vector<std::size_t> indices) {
  return [s = std::unordered_set<std::size_t>(indices.begin(), indices.end())](const call_info& c) {
    return s.count(c.index) != 0;
  };
}
/// Every call for one of these keys fails.
inline failure_model for_keys(std::vector<std::string> keys) {
  return [s = std::unordered_set<std::string>(keys.begin(), keys.end())](const call_info& c) {
    return s.count(std::string(c.key)) != 0;
  };
}
/// Each call fails with probability `p`, drawn from (seed, call index).
inline failure_model probability(double p, std::uint64_t seed = 1) {
  if (!(p >= 0.0 && p <= 1.0))
    throw std::invalid_argument("sluice::testing::failures::probability: p must be in [0, 1]");
  return [=](const call_info& c) {
    return static_cast<double>(sluice::detail::mix(seed ^ (c.index * 0x9e3779b97f4a7c15ULL)) >>
                               11) *
               0x1.0p-53 <
           p;
  };
}
}  // namespace failures

}  // namespace sluice::testing

#endif  // SLUICE_TESTING_CALL_MODELS_HPP
