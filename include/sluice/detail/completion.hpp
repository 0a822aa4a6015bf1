// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_COMPLETION_HPP
#define SLUICE_DETAIL_COMPLETION_HPP

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <memory>
#include <tuple>
#include <utility>

namespace sluice::detail {

// Completes `handler` with `args` through its associated executor (falling back
// to `fallback`), never inline: the caller may be inside release()/notify().
// The handler's cancellation slot is cleared first, as Asio requires of an
// operation that completes.
template <class Handler, class Executor, class... Args>
void post_completion(Handler&& handler, const Executor& fallback, Args&&... args) {
  auto slot = asio::get_associated_cancellation_slot(handler);
  if (slot.is_connected()) slot.clear();
  auto ex = asio::get_associated_executor(handler, fallback);
  asio::post(ex, [h = std::forward<Handler>(handler),
                  a = std::make_tuple(std::forward<Args>(args)...)]() mutable {
    std::apply(std::move(h), std::move(a));
  });
}

// A type-erased, move-only completion handler for signature void(Args...).
// Invariant: holds at most one handler; complete() consumes it.
template <class... Args>
class erased_handler {
  struct base {
    virtual ~base() = default;
    virtual void post(Args... args) = 0;
  };
  template <class Handler, class Executor>
  struct impl final : base {
    impl(Handler&& h, const Executor& ex) : handler(std::move(h)), fallback(ex) {}
    void post(Args... args) override {
      post_completion(std::move(handler), fallback, std::move(args)...);
    }
    Handler handler;
    Executor fallback;
  };

 public:
  erased_handler() = default;
  template <class Handler, class Executor>
  erased_handler(Handler&& h, const Executor& fallback)
      : impl_(std::make_unique<impl<std::decay_t<Handler>, Executor>>(std::forward<Handler>(h),
                                                                      fallback)) {}

  explicit operator bool() const noexcept { return impl_ != nullptr; }

  // Posts the completion; the handler is released.
  void complete(Args... args) {
    auto p = std::move(impl_);
    p->post(std::move(args)...);
  }

 private:
  std::unique_ptr<base> impl_;
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_COMPLETION_HPP
