// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_SUPPORT_STDERR_CAPTURE_HPP
#define SLUICE_TESTS_SUPPORT_STDERR_CAPTURE_HPP

// Captures what the process writes to stderr (file descriptor 2) while the
// object lives: text() returns it and puts stderr back.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace sluice_test {

class stderr_capture {
 public:
  stderr_capture() : file_(std::tmpfile()), saved_(::dup(2)) {
    if (!file_ || saved_ < 0) std::abort();
    std::fflush(stderr);
    ::dup2(::fileno(file_), 2);
  }
  stderr_capture(const stderr_capture&) = delete;
  stderr_capture& operator=(const stderr_capture&) = delete;
  ~stderr_capture() {
    restore();
    std::fclose(file_);
  }

  // Everything written so far; stops capturing.
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[512];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
  }

  std::FILE* file_;
  int saved_;
};

}  // namespace sluice_test

#endif  // SLUICE_TESTS_SUPPORT_STDERR_CAPTURE_HPP
