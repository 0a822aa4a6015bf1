// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_REDIS_SERVER_HPP
#define SLUICE_TESTS_SUPPORT_REDIS_SERVER_HPP

// A private redis-server for one test: the server and the child processes
// are examples/support/redis_server.hpp's (shared with examples/fleet.cpp);
// here, what only the suite needs: a server or a skip, one server per binary.

#include <examples/support/redis_server.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace sluice_test {

using sluice_examples::child_main;
using sluice_examples::child_roles;
using sluice_examples::find_program;
using sluice_examples::free_port;
using sluice_examples::ping;
using sluice_examples::redis_server;
using sluice_examples::register_child;
using sluice_examples::skip_exit_code;
using sluice_examples::spawn_child;
using sluice_examples::spawn_process;
using sluice_examples::wait_process;

// Starts a server, or ends the test binary with skip_exit_code and a message
// (ctest then reports the test as skipped, never as passed).
inline redis_server server_or_skip(std::string unix_socket = {},
                                   std::vector<std::string> extra = {}) {
  auto s = redis_server::start(std::move(unix_socket), std::move(extra));
  if (!s) {
    std::fprintf(stderr, "SKIPPED: could not start a redis-server (Debian: redis-server)\n");
    std::fflush(stderr);
    std::_Exit(skip_exit_code);
  }
  return std::move(*s);
}

// One server shared by the test cases of a binary (started on first use).
inline redis_server& shared_redis_server() {
  static redis_server s = server_or_skip();
  return s;
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_REDIS_SERVER_HPP
