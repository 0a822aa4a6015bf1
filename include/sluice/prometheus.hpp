// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_PROMETHEUS_HPP
#define SLUICE_PROMETHEUS_HPP

#include <sluice/config.hpp>
#include <sluice/stats.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

namespace sluice {

/// Renders the stats of limits and call policies in the Prometheus text
/// exposition format (version 0.0.4), so a `/metrics` handler is one call:
///
/// @code
/// sluice::prometheus_text m;
/// m.add("backend", backend_cap.stats());     // any limit's sluice::stats
/// m.add("provider", provider);               // every layer of a call policy
/// reply(200, "text/plain; version=0.0.4", m.str());
/// @endcode
///
/// - Names: `sluice_limit_*` for a limit (`acquired_total`, `cancelled_total`,
///   `throttled_total`, `shed_total`, `waiting`, `in_use`, `limit`, and the wait and hold
///   summaries in seconds: `wait_seconds{quantile="0.5"|"0.99"}`, `_sum`,
///   `_count`); `sluice_shed_*`, `sluice_breaker_*` (the state as
///   `sluice_breaker_state{state="open"} 1`), `sluice_hedge_*`,
///   `sluice_retry_*` and `sluice_timeout_*` for the layers of a policy,
///   labelled `name="<the name given>"` and, for a layer, `layer="<index>"`.
/// - Samples of one metric are grouped under one `# HELP` / `# TYPE`, as the
///   format requires, whatever the order of `add` calls.
/// - Reads each `stats()` once per `add`; thread safety is that of the
///   stats read (the layers' are thread-safe; a loop-affine limit's must be
///   read on its loop). Names are used as given: pass label-safe text.
class prometheus_text {
 public:
  /// A limit's `sluice::stats` under `name`.
  SLUICE_DECL prometheus_text& add(std::string_view name, const stats& s);

  /// Every layer of a `sluice::call_policy` that has stats, under `name`.
  template <class Policy>
  requires requires { Policy::layer_count; }
  prometheus_text& add(std::string_view name, Policy& p) {
    add_layers<0>(name, p);
    return *this;
  }

  /// The exposition text of everything added so far.
  [[nodiscard]] SLUICE_DECL std::string str() const;

 private:
  struct family {
    std::string type, help, samples;
  };

  template <std::size_t I, class Policy>
  void add_layers(std::string_view name, Policy& p) {
    if constexpr (I < Policy::layer_count) {
      add_layer(label(name) + ",layer=\"" + std::to_string(I) + "\"", p.template get<I>());
      add_layers<I + 1>(name, p);
    }
  }

  template <class Layer>
  void add_layer(const std::string& l, Layer& layer) {
    if constexpr (requires { layer.stats().not_permitted; }) {
      const auto s = layer.stats();
      for (const char* st : {"closed", "open", "half_open"})
        gauge("sluice_breaker_state", "1 for the breaker's state now.", l + ",state=\"" + st + "\"",
              std::string_view(to_string(s.state)) == st);
      counter("sluice_breaker_calls_total", "Calls that ran and ended.", l, s.calls);
      counter("sluice_breaker_failures_total", "Calls that failed.", l, s.failures);
      counter("sluice_breaker_slow_total", "Calls slower than slow_call.", l, s.slow);
      counter("sluice_breaker_not_permitted_total", "Calls refused while open.", l,
              s.not_permitted);
      counter("sluice_breaker_opened_total", "Transitions to open.", l, s.opened);
    } else if constexpr (requires { layer.stats().shed_waiting; }) {
      const auto s = layer.stats();
      counter("sluice_shed_admitted_total", "Calls that got the limit.", l, s.admitted);
      counter("sluice_shed_shed_total", "Calls shed past max_waiting.", l, s.shed);
      counter("sluice_shed_shed_waiting_total", "Calls shed after max_wait.", l, s.shed_waiting);
      gauge("sluice_shed_waiting", "Callers waiting for the limit now.", l, s.waiting);
    } else if constexpr (requires { layer.stats().hedged; }) {
      const auto s = layer.stats();
      counter("sluice_hedge_calls_total", "Calls through the hedge layer.", l, s.calls);
      counter("sluice_hedge_hedged_total", "Second attempts started.", l, s.hedged);
      counter("sluice_hedge_won_total", "Calls the second attempt won.", l, s.hedge_won);
      counter("sluice_hedge_over_budget_total", "Hedges refused by the budget.", l, s.over_budget);
    } else if constexpr (requires { layer.retries(); }) {
      counter("sluice_retry_retries_total", "Attempts after the first.", l, layer.retries());
    } else if constexpr (requires { layer.timeouts(); }) {
      counter("sluice_timeout_timeouts_total", "Calls that timed out.", l, layer.timeouts());
    }
  }

  static std::string label(std::string_view name) { return "name=\"" + std::string(name) + "\""; }
  SLUICE_DECL void sample(const char* metric, const char* type, const char* help,
                          const std::string& labels, const std::string& value,
                          const char* suffix = "");
  void counter(const char* m, const char* help, const std::string& l, std::uint64_t v) {
    sample(m, "counter", help, l, std::to_string(v));
  }
  void gauge(const char* m, const char* help, const std::string& l, std::uint64_t v) {
    sample(m, "gauge", help, l, std::to_string(v));
  }
  SLUICE_DECL void summary(const char* m, const char* help, const std::string& l,
                           const duration_stats& d);
  SLUICE_DECL static std::string seconds(std::chrono::nanoseconds d);

  std::map<std::string, family> families_;
};

}  // namespace sluice

#if SLUICE_HEADER_DEFS
#include <sluice/impl/prometheus.ipp>
#endif

#endif  // SLUICE_PROMETHEUS_HPP
