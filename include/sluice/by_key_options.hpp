// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_BY_KEY_OPTIONS_HPP
#define SLUICE_BY_KEY_OPTIONS_HPP

#include <cstddef>

namespace sluice {

/// Which input a free slot goes to, among those whose key has room
/// (`by_key_options::order`). Within a key the order is always input order.
enum class key_order {
  /// The oldest input (input order across keys). The input is pulled only
  /// when no buffered input may start. The default.
  oldest,
  /// An input of the key with the most inputs buffered, the oldest key
  /// first among equals: the key with the most work left is kept busy, so it
  /// does not end the run alone (a crawl's largest host). The input is pulled
  /// ahead as far as `buffer` (or as far as an async source has items at
  /// once) before each choice, so the buffer shows which keys are long (a
  /// `keyed_task_group` sees every child spawned and waiting). A key
  /// with few inputs may wait while longer keys have room: throughput over
  /// latency.
  most_waiting,
};

/// Options of `sluice::by_key` and `sluice::keyed_task_group::run`.
struct by_key_options {
  /// The most inputs pulled and waiting for their key's room at once; past
  /// it the input is not pulled (backpressure). For a `keyed_task_group`:
  /// the most children waiting for their key, past which `spawn_when_ready`
  /// waits. At least 1.
  std::size_t buffer = 1024;
  /// Which input whose key has room gets a free slot.
  key_order order = key_order::oldest;
};

}  // namespace sluice

#endif  // SLUICE_BY_KEY_OPTIONS_HPP
