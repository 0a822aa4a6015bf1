// SPDX-License-Identifier: BSL-1.0
// make compile-bench: the Asio-only baseline of sluice_empty.cpp (an empty io_context).
#include <asio.hpp>

int main() {
  asio::io_context ctx;
  ctx.run();
}
