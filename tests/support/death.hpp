// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_DEATH_HPP
#define SLUICE_TESTS_SUPPORT_DEATH_HPP

// A minimal death test: runs `body` in a forked child and reports whether it
// died of SIGABRT, with what it wrote to stderr.

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace sluice_test {

struct death_result {
  bool aborted = false;
  std::string stderr_text;
};

template <class F>
death_result run_in_child(F body) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], 2);
    // The test framework's own SIGABRT handler must not report the child.
    std::signal(SIGABRT, SIG_DFL);
    std::signal(SIGSEGV, SIG_DFL);
    if (std::FILE* devnull = std::fopen("/dev/null", "w")) ::dup2(::fileno(devnull), 1);
    body();
    std::_Exit(0);
  }
  ::close(fds[1]);
  death_result r;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.stderr_text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  return r;
}

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_DEATH_HPP
