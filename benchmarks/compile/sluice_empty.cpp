// SPDX-License-Identifier: BSL-1.0
// make compile-bench: the umbrella header and an empty io_context, against asio_empty.cpp.
#include <sluice/sluice.hpp>

int main() {
  sluice::asio::io_context ctx;
  ctx.run();
}
