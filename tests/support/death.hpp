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

// Forking a process that has run other threads is unsafe under the
// sanitizers: a child can inherit the sanitizer allocator's lock held and hang
// (seen with g++ 12's ASan). Death tests run in the plain builds only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SLUICE_TEST_CAN_FORK 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SLUICE_TEST_CAN_FORK 0
#endif
#endif
#ifndef SLUICE_TEST_CAN_FORK
#define SLUICE_TEST_CAN_FORK 1
#endif

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
    ::alarm(30);  // a child that hangs dies of SIGALRM: the test fails, CI does not stall
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
