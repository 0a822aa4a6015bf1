// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SLUICE_HPP
#define SLUICE_SLUICE_HPP

/// @file
/// The whole of sluice. Each header can also be included on its own.

#include <sluice/config.hpp>

// Results and constraints
#include <sluice/concepts.hpp>
#include <sluice/outcome.hpp>

// Fan-out: gather, gather_with_concurrency, map_unordered, as_completed, for_each
#include <sluice/for_each.hpp>
#include <sluice/gather.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/stream.hpp>

// Synchronization primitives (loop-affine, FIFO, cancellation-safe)
#include <sluice/condition.hpp>
#include <sluice/event.hpp>
#include <sluice/lock.hpp>
#include <sluice/queue.hpp>
#include <sluice/semaphore.hpp>

// Time
#include <sluice/time.hpp>

#endif  // SLUICE_SLUICE_HPP
