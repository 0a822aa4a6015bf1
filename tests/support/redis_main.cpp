// SPDX-License-Identifier: BSL-1.0
// The main of the Redis tests: Catch2, or, with `--child <name> args...`, one
// of the child roles registered by the test file (a process of a multi-process
// test; see redis_server.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <support/redis_server.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--child") == 0) {
    auto& roles = sluice_test::child_roles();
    auto it = roles.find(argv[2]);
    if (it == roles.end()) {
      std::fprintf(stderr, "unknown child role %s\n", argv[2]);
      return 2;
    }
    ::alarm(60);  // a child that hangs dies: the test fails, CI does not stall
    return it->second(std::vector<std::string>(argv + 3, argv + argc));
  }
  return Catch::Session().run(argc, argv);
}
