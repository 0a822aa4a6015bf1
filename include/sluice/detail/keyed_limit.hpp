// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_KEYED_LIMIT_HPP
#define SLUICE_DETAIL_KEYED_LIMIT_HPP

// What sluice::by_key(key, limit) needs of a keyed limit the user owns
// (keyed_semaphore, keyed_rate_limiter), without including either: the
// specializations name their members only when instantiated, where the user
// has the limit's header.
//
// keyed_limit_traits<L>:
// - grant: what a key's head input holds once the limit let it start, before
//   its task runs; destroying it gives it back to the limit (a permit to the
//   key's next waiter, a rate start forgotten, as if never taken).
// - bind(l, ex): before the first try_take, the fan-out's executor (its
//   clock: a keyed_rate_limiter built without an executor binds to it, as to
//   a waiter's, instead of to the steady clock at try_take).
// - try_take(l, key): a grant if the key is free now and nobody waits for it.
// - wait(l, key): waits for a grant of key; a cancelled wait takes nothing
//   (the limits hand a grant racing the cancellation on).
// The grant is the task's ticket: a permit is released when the task ends; a
// rate start has spend(), called as the task starts (keyed_call).

#include <sluice/config.hpp>

#include <sluice/detail/asio.hpp>

#include <chrono>
#include <concepts>
#include <optional>
#include <utility>

namespace sluice {
template <class Key, class Hash, class KeyEqual>
class keyed_semaphore;
template <class Key, class Hash, class KeyEqual>
class keyed_rate_limiter;
}  // namespace sluice

namespace sluice::detail {

// keyed_rate_limiter's private hooks for by_key (friend of it).
struct keyed_limit_access {
  template <class L, class K>
  static auto acquire_start(L& l, K key) {
    return l.acquire_start(std::move(key));
  }
  template <class L>
  static void bind_clock(L& l, const asio::any_io_executor& ex) {
    l.bind_clock(ex);
  }
  template <class L, class K>
  static auto try_start(L& l, const K& key) {
    return l.try_start(key);
  }
  template <class L, class K, class T>
  static void give_back_start(L& l, const K& key, T at) {
    l.give_back_start(key, at);
  }
};

template <class L>
struct keyed_limit_traits {
  static constexpr bool valid = false;
};

template <class K, class H, class E>
struct keyed_limit_traits<keyed_semaphore<K, H, E>> {
  static constexpr bool valid = true;
  using limit = keyed_semaphore<K, H, E>;
  using key_type = K;
  using grant = typename limit::permit;

  static void bind(limit&, const asio::any_io_executor&) noexcept {}
  static std::optional<grant> try_take(limit& l, const K& key) { return l.try_acquire(key); }
  static asio::awaitable<grant> wait(limit& l, K key) { return l.scoped_acquire(std::move(key)); }
};

template <class K, class H, class E>
struct keyed_limit_traits<keyed_rate_limiter<K, H, E>> {
  static constexpr bool valid = true;
  using limit = keyed_rate_limiter<K, H, E>;
  using key_type = K;
  // A start of key granted at `at`; forgotten by the limiter unless spend()
  // was called (as its task started).
  class grant {
   public:
    grant() = default;
    grant(limit& l, K key, std::chrono::steady_clock::time_point at)
        : l_(&l), key_(std::move(key)), at_(at) {}
    grant(grant&& o) noexcept
        : l_(std::exchange(o.l_, nullptr)), key_(std::move(o.key_)), at_(o.at_) {}
    grant& operator=(grant&& o) noexcept {
      if (this != &o) {
        reset();
        l_ = std::exchange(o.l_, nullptr);
        key_ = std::move(o.key_);
        at_ = o.at_;
      }
      return *this;
    }
    ~grant() { reset(); }
    void spend() noexcept { l_ = nullptr; }

   private:
    void reset() noexcept {
      if (auto* l = std::exchange(l_, nullptr)) keyed_limit_access::give_back_start(*l, *key_, at_);
    }
    limit* l_ = nullptr;
    std::optional<K> key_;
    std::chrono::steady_clock::time_point at_{};
  };

  static void bind(limit& l, const asio::any_io_executor& ex) {
    keyed_limit_access::bind_clock(l, ex);
  }
  static std::optional<grant> try_take(limit& l, const K& key) {
    if (auto at = keyed_limit_access::try_start(l, key)) return grant(l, key, *at);
    return std::nullopt;
  }
  static asio::awaitable<grant> wait(limit& l, K key) {
    const std::chrono::steady_clock::time_point at =
        co_await keyed_limit_access::acquire_start(l, key);
    co_return grant(l, std::move(key), at);
  }
};

// A keyed limit whose key type is K (keyed_task_group<K>::run's).
template <class L, class K>
concept keyed_limit_of =
    keyed_limit_traits<L>::valid && std::same_as<typename keyed_limit_traits<L>::key_type, K>;

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_KEYED_LIMIT_HPP
