// SPDX-License-Identifier: BSL-1.0
// clang only, compiled without the sluice::sluice target's definitions.
// expect: Asio was included before sluice
#include <asio.hpp>
#include <sluice/gather.hpp>
