// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_DURATION_RECORDER_HPP
#define SLUICE_DETAIL_DURATION_RECORDER_HPP

// Durations in fixed log buckets (duration_recorder), and the counters it and
// the limits' stats sinks keep: plain integers for loop-affine limits, relaxed
// atomics for shared_semaphore (sluice/detail/stats_recorder.hpp).

#include <sluice/stats.hpp>

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace sluice::detail {
// Bucket i < 8 holds exactly i ns; above, the octave [2^e, 2^(e+1)) (e = 3..47)
// is split into 8 buckets of width 2^(e-3); durations of 2^48 ns and more
// count in the last bucket.
inline constexpr std::size_t stats_buckets = 8 * 46;

constexpr std::size_t stats_bucket(std::uint64_t ns) noexcept {
  if (ns < 8) return static_cast<std::size_t>(ns);
  const auto e = static_cast<unsigned>(std::bit_width(ns)) - 1;  // >= 3
  if (e > 47) return stats_buckets - 1;
  return 8 * (e - 2) + static_cast<std::size_t>((ns >> (e - 3)) & 7);
}

constexpr std::uint64_t stats_bucket_low(std::size_t i) noexcept {
  if (i < 8) return i;
  const auto e = static_cast<unsigned>(i / 8 + 2);
  return static_cast<std::uint64_t>(8 + i % 8) << (e - 3);
}

// The largest duration bucket i holds.
constexpr std::uint64_t stats_bucket_high(std::size_t i) noexcept {
  return i + 1 < stats_buckets ? stats_bucket_low(i + 1) - 1
                               : std::numeric_limits<std::uint64_t>::max();
}

static_assert(stats_bucket(7) == 7 && stats_bucket(8) == 8 && stats_bucket(15) == 15 &&
              stats_bucket(16) == 16 && stats_bucket(17) == 16 && stats_bucket(18) == 17);
static_assert(stats_bucket_low(stats_bucket(1'000'000'000)) <= 1'000'000'000 &&
              stats_bucket_high(stats_bucket(1'000'000'000)) >= 1'000'000'000);
static_assert(stats_bucket(std::uint64_t{1} << 48) == stats_buckets - 1 &&
              stats_bucket((std::uint64_t{1} << 48) - 1) == stats_buckets - 1);

// A counter that is a plain integer (loop-affine limits) or a relaxed atomic
// (shared_semaphore, whose permits are released on any thread).
inline void stats_add(std::uint64_t& c, std::uint64_t v) noexcept {
  c += v;
}
inline void stats_add(std::atomic<std::uint64_t>& c, std::uint64_t v) noexcept {
  c.fetch_add(v, std::memory_order_relaxed);
}
inline std::uint64_t stats_load(const std::uint64_t& c) noexcept {
  return c;
}
inline std::uint64_t stats_load(const std::atomic<std::uint64_t>& c) noexcept {
  return c.load(std::memory_order_relaxed);
}
inline void stats_lower(std::uint64_t& c, std::uint64_t v) noexcept {
  if (v < c) c = v;
}
inline void stats_lower(std::atomic<std::uint64_t>& c, std::uint64_t v) noexcept {
  auto cur = c.load(std::memory_order_relaxed);
  while (v < cur && !c.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}
inline void stats_raise(std::uint64_t& c, std::uint64_t v) noexcept {
  if (v > c) c = v;
}
inline void stats_raise(std::atomic<std::uint64_t>& c, std::uint64_t v) noexcept {
  auto cur = c.load(std::memory_order_relaxed);
  while (v > cur && !c.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// Durations in fixed log buckets: record() is O(1), read() O(buckets); neither
// allocates.
template <bool Atomic>
class duration_recorder {
  using counter = std::conditional_t<Atomic, std::atomic<std::uint64_t>, std::uint64_t>;

 public:
  void record(std::chrono::steady_clock::duration d) noexcept {
    const auto ns = d.count() > 0 ? static_cast<std::uint64_t>(d.count()) : std::uint64_t{0};
    stats_add(buckets_[stats_bucket(ns)], 1);
    stats_add(total_, ns);
    stats_lower(min_, ns);
    stats_raise(max_, ns);
    stats_add(count_, 1);
  }

  [[nodiscard]] std::uint64_t count() const noexcept { return stats_load(count_); }

  // `zeros` more durations of 0 that were not recorded one by one (the grants
  // that did not wait).
  [[nodiscard]] duration_stats read(std::uint64_t zeros = 0) const noexcept {
    duration_stats s;
    const std::uint64_t recorded = stats_load(count_);
    s.count = recorded + zeros;
    if (s.count == 0) return s;
    const std::uint64_t lo = zeros > 0 || recorded == 0 ? 0 : stats_load(min_);
    const std::uint64_t hi = recorded == 0 ? 0 : stats_load(max_);
    s.total = std::chrono::nanoseconds(static_cast<std::int64_t>(stats_load(total_)));
    s.min = std::chrono::nanoseconds(static_cast<std::int64_t>(lo));
    s.max = std::chrono::nanoseconds(static_cast<std::int64_t>(hi));
    auto quantile = [&](std::uint64_t percent) {
      const std::uint64_t ceil = (s.count * percent + 99) / 100;
      const std::uint64_t rank = ceil == 0 ? 1 : ceil;
      std::uint64_t seen = zeros;
      std::uint64_t v = hi;  // if a concurrent record() left the buckets short
      for (std::size_t i = 0; i < stats_buckets; ++i) {
        seen += stats_load(buckets_[i]);
        if (seen >= rank) {
          v = stats_bucket_high(i);
          break;
        }
      }
      v = v < lo ? lo : (v > hi ? hi : v);  // clamp (lo <= hi)
      return std::chrono::nanoseconds(static_cast<std::int64_t>(v));
    };
    s.p50 = quantile(50);
    s.p99 = quantile(99);
    return s;
  }

 private:
  counter count_{0};
  counter total_{0};
  counter min_{std::numeric_limits<std::uint64_t>::max()};
  counter max_{0};
  std::array<counter, stats_buckets> buckets_{};
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_DURATION_RECORDER_HPP
