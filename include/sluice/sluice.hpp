// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SLUICE_HPP
#define SLUICE_SLUICE_HPP

/// @file
/// The whole of sluice. Each header can also be included on its own.

#include <sluice/config.hpp>

// Results and constraints
#include <sluice/concepts.hpp>
#include <sluice/outcome.hpp>

// Fan-out: gather, gather_with_concurrency, map_unordered (also by key), as_completed, filter,
// for_each, and progress reports on them
#include <sluice/by_key.hpp>
#include <sluice/by_key_options.hpp>
#include <sluice/filter.hpp>
#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/progress.hpp>
#include <sluice/stream.hpp>

// Synchronization primitives (loop-affine, FIFO, cancellation-safe)
#include <sluice/condition.hpp>
#include <sluice/event.hpp>
#include <sluice/lock.hpp>
#include <sluice/queue.hpp>
#include <sluice/queue_error.hpp>
#include <sluice/semaphore.hpp>

// Structured concurrency and threads (shared_semaphore is the one thread-safe primitive;
// strand_bound puts any limit on a strand of its own, callable from any thread)
#include <sluice/keyed_task_group.hpp>
#include <sluice/shared_semaphore.hpp>
#include <sluice/stop_source.hpp>
#include <sluice/strand_bound.hpp>
#include <sluice/task_group.hpp>
#include <sluice/to_thread.hpp>

// Limits that protect a provider: per key, fair shares between keys, per time window,
// deduplication, retries, adaptive, several budgets at once
#include <sluice/acquire_all.hpp>
#include <sluice/adaptive_algorithms.hpp>
#include <sluice/adaptive_limit.hpp>
#include <sluice/fair_limit.hpp>
#include <sluice/fair_limit_key.hpp>
#include <sluice/fair_semaphore.hpp>
#include <sluice/fair_share.hpp>
#include <sluice/keyed_rate_limiter.hpp>
#include <sluice/keyed_semaphore.hpp>
#include <sluice/rate_limiter.hpp>
#include <sluice/retry.hpp>
#include <sluice/retry_after.hpp>
#include <sluice/retry_budget.hpp>
#include <sluice/retryable.hpp>
#include <sluice/single_flight.hpp>
#include <sluice/token_bucket.hpp>

// Call policies: the layers around a provider call, composed in one value
#include <sluice/breaker.hpp>
#include <sluice/hedge.hpp>
#include <sluice/http_status.hpp>
#include <sluice/limits.hpp>
#include <sluice/linger.hpp>
#include <sluice/overloaded_error.hpp>
#include <sluice/policy.hpp>
#include <sluice/retry_layer.hpp>
#include <sluice/shed.hpp>
#include <sluice/timeout_layer.hpp>

// Operating it: what every limit has done and is doing, and its Prometheus text
#include <sluice/prometheus.hpp>
#include <sluice/stats.hpp>

// Time, timeouts and deadlines
#include <sluice/time.hpp>
#include <sluice/timeout.hpp>

#endif  // SLUICE_SLUICE_HPP
