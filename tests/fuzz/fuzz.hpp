// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_TESTS_FUZZ_FUZZ_HPP
#define SLUICE_TESTS_FUZZ_FUZZ_HPP

// Shared pieces of the fuzz targets in tests/fuzz/. Each target reads its
// input as a script of steps, drives a primitive on a virtual_loop, runs the
// same script through a small reference model written plainly in the target,
// and aborts at the first difference. The same source builds as a libFuzzer
// target (clang, SLUICE_BUILD_FUZZERS) and as a replay executable for the seed
// corpus (replay_main.cpp, every compiler, in ctest).

#include <sluice/testing/virtual_time.hpp>

#include <support/asio.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

// Aborts with the failed condition: libFuzzer keeps the input as a crash.
#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "%s:%d: model mismatch: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (false)

namespace sluice_fuzz {

// SLUICE_FUZZ_TRACE=1 in the environment: targets print their model on a check.
inline bool trace() {
  static const bool on = std::getenv("SLUICE_FUZZ_TRACE") != nullptr;
  return on;
}

// The fuzzer's bytes, read one at a time; 0 once exhausted.
class script {
 public:
  script(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  [[nodiscard]] bool done() const noexcept { return pos_ >= size_; }
  std::uint8_t next() noexcept { return pos_ < size_ ? data_[pos_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

// The model's picture of the loop's ready queue: every post the real code
// makes is mirrored by one model_loop::post, in the same order, and
// model_loop::run() plays them as loop.poll() runs the real ones.
class model_loop {
 public:
  void post(std::function<void()> f) { ready_.push_back(std::move(f)); }
  void run() {
    while (!ready_.empty()) {
      auto f = std::move(ready_.front());
      ready_.pop_front();
      f();
    }
  }
  [[nodiscard]] bool idle() const noexcept { return ready_.empty(); }

 private:
  std::deque<std::function<void()>> ready_;
};

// One waiting operation of the real primitive: how it completed, and how often.
struct probe {
  bool coro = false;  // a coroutine (co_spawn) or a callback token
  asio::cancellation_signal signal;
  int completions = 0;
  sluice::error_code ec;     // callback: the completion's error
  std::exception_ptr error;  // coroutine: how it ended
  bool done() const noexcept { return completions > 0; }
  bool ok() const noexcept { return done() && !ec && !error; }

  void complete() {
    ++completions;
    FUZZ_CHECK(completions == 1);  // every waiter completes exactly once
  }
};

// True if `e` is a system_error with code `code`.
inline bool is_error(const std::exception_ptr& e, sluice::error_code code) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (const sluice::system_error& s) {
    return s.code() == code;
  } catch (...) {
    return false;
  }
}

// Starts `body` as a coroutine whose cancellation slot is p's signal. From
// outside the loop co_spawn only posts its start: emit on p.signal only once
// the body has begun (cancel_step's `started`). On Boost.Asio 1.81 (Asio
// 1.26) a coroutine cancelled before its first step, which therefore ends
// without a context switch, is not completed but thrown out of the loop:
// co_spawn_entry_point (boost/asio/impl/co_spawn.hpp:161) co_awaits a post
// outside its try, and the cancelled state makes that co_await throw
// (impl/awaitable.hpp:175). Asio 1.22 posts the handler instead; later Asio
// turns throw_if_cancelled off before that post (the 1.30.2 change log: "Fixed
// co_spawn to correctly propagate exceptions resulting from cancellation").
template <class Executor>
void spawn(Executor ex, probe& p, asio::awaitable<void> body) {
  p.coro = true;
  asio::co_spawn(ex, std::move(body),
                 sluice_test::bind_slot(p.signal.slot(), [pp = &p](std::exception_ptr e) {
                   pp->error = e;
                   pp->complete();
                 }));
}

struct ignore_value {
  template <class... A>
  void operator()(sluice::error_code, A&&...) const noexcept {}
};

// A callback completion token bound to p's signal; the values after the error
// code go to `on_value(ec, values...)`.
template <class OnValue = ignore_value>
auto callback(probe& p, OnValue on_value = {}) {
  return sluice_test::bind_slot(p.signal.slot(),
                                [pp = &p, on_value](sluice::error_code ec, auto&&... v) mutable {
                                  pp->ec = ec;
                                  on_value(ec, v...);
                                  pp->complete();
                                });
}

inline asio::cancellation_type cancellation_of(std::uint8_t b) {
  return (b & 1) != 0 ? asio::cancellation_type::total : asio::cancellation_type::terminal;
}

// The step "cancel waiter k": reads k, and (for a waiter that has started and
// not finished) the kind, and emits it. Returns the waiter and whether the
// cancellation was terminal, or nothing when the step did nothing.
template <class Probes, class Started>
std::optional<std::pair<std::size_t, bool>> cancel_step(script& in, const Probes& probes,
                                                        Started started) {
  if (probes.empty()) return std::nullopt;
  const std::size_t id = in.next() % probes.size();
  if (!started(id) || probes[id]->done()) return std::nullopt;
  const asio::cancellation_type type = cancellation_of(in.next());
  probes[id]->signal.emit(type);
  return std::pair<std::size_t, bool>(id, type == asio::cancellation_type::terminal);
}

}  // namespace sluice_fuzz

#endif  // SLUICE_TESTS_FUZZ_FUZZ_HPP
