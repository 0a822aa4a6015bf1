// SPDX-License-Identifier: BSL-1.0
// prometheus_text's rendering, compiled once (see SLUICE_SEPARATE_COMPILATION in
// config.hpp): included by prometheus.hpp, or only by <sluice/src.hpp>.
#ifndef SLUICE_IMPL_PROMETHEUS_IPP
#define SLUICE_IMPL_PROMETHEUS_IPP

#include <cstdio>

namespace sluice {

prometheus_text& prometheus_text::add(std::string_view name, const stats& s) {
  const std::string l = label(name);
  counter("sluice_limit_acquired_total", "Grants so far.", l, s.acquired);
  counter("sluice_limit_cancelled_total", "Waits that ended cancelled.", l, s.cancelled);
  counter("sluice_limit_throttled_total", "Requests a limiter delayed or refused.", l, s.throttled);
  counter("sluice_limit_shed_total", "Calls the limit's shed_options refused.", l, s.shed);
  gauge("sluice_limit_waiting", "Operations waiting now.", l, s.waiting);
  gauge("sluice_limit_in_use", "Permits (units) held now.", l, s.in_use);
  gauge("sluice_limit_limit", "The cap now.", l, s.limit);
  summary("sluice_limit_wait_seconds", "From a request to its grant.", l, s.wait);
  summary("sluice_limit_hold_seconds", "From a grant to its release.", l, s.hold);
  return *this;
}

std::string prometheus_text::str() const {
  std::string out;
  for (const auto& [metric, f] : families_) {
    out += "# HELP " + metric + " " + f.help + "\n# TYPE " + metric + " " + f.type + "\n";
    out += f.samples;
  }
  return out;
}

void prometheus_text::sample(const char* metric, const char* type, const char* help,
                             const std::string& labels, const std::string& value,
                             const char* suffix) {
  family& f = families_[metric];
  f.type = type;
  f.help = help;
  f.samples += std::string(metric) + suffix + "{" + labels + "} " + value + "\n";
}

void prometheus_text::summary(const char* m, const char* help, const std::string& l,
                              const duration_stats& d) {
  sample(m, "summary", help, l + ",quantile=\"0.5\"", seconds(d.p50));
  sample(m, "summary", help, l + ",quantile=\"0.99\"", seconds(d.p99));
  sample(m, "summary", help, l, seconds(d.total), "_sum");
  sample(m, "summary", help, l, std::to_string(d.count), "_count");
}

std::string prometheus_text::seconds(std::chrono::nanoseconds d) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace sluice

#endif  // SLUICE_IMPL_PROMETHEUS_IPP
