// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_SLUICE_HPP
#define SLUICE_SLUICE_HPP

/// @file
/// The whole of sluice. Each header can also be included on its own.

#include <sluice/config.hpp>

// Results and constraints
#include <sluice/concepts.hpp>
#include <sluice/outcome.hpp>

// Fan-out
#include <sluice/gather.hpp>

// Time
#include <sluice/time.hpp>

#endif  // SLUICE_SLUICE_HPP
