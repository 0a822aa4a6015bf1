// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_BY_KEY_HPP
#define SLUICE_BY_KEY_HPP

#include <sluice/by_key_options.hpp>
#include <sluice/concepts.hpp>
#include <sluice/config.hpp>
#include <sluice/detail/keyed_gather.hpp>
#include <sluice/detail/keyed_limit.hpp>
#include <sluice/detail/keyed_source.hpp>
#include <sluice/detail/ranges.hpp>
#include <sluice/map_unordered.hpp>
#include <sluice/outcome.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace sluice {

/// What `sluice::by_key` returns: a key function, a per-key limit and the
/// options, passed to `map_unordered` after its limit.
template <class KeyFn>
struct by_key_t {
  KeyFn key;            ///< `key(const input&)`: the input's key
  std::size_t per_key;  ///< the most tasks of one key at once
  std::size_t buffer;   ///< the most inputs waiting for their key's room
  key_order order;      ///< which ready input gets a free slot
};

/// A key for each input of a fan-out, and at most `per_key` tasks per key at
/// once (hosts of a crawl, tenants, accounts): for `map_unordered(fn, inputs,
/// limit, sluice::by_key(key, per_key, {.buffer = n}))`.
///
/// - A slot goes to the oldest input whose key has room (or, with
///   `.order = key_order::most_waiting`, to the oldest input of the key with
///   the most inputs buffered), never to a task that would then wait for its
///   key: inputs of a full key wait outside the slots, in a FIFO queue per key
///   (order within a key is input order), until a task of their key ends. The
///   limit is never idle while an input could start.
/// - The input is pulled ahead of the slots only as far as `buffer` inputs
///   (those waiting for their key); then it is not pulled until one of them
///   starts: memory stays bounded however the keys are skewed. With an async
///   source, one `next()` at a time still, and a key that frees while a
///   `next()` is pending is served at once.
/// - `key(const input&)` returns a hashable key (`std::hash`); it is called
///   once per input, when the input is pulled. An exception it throws is an
///   exception of the input (see `map_unordered`).
/// - Everything else is `map_unordered`'s: fail fast (or `return_exceptions`),
///   cancellation, backpressure of unread results, lifetimes.
///
/// Throws `std::invalid_argument` (nothing starts) if `per_key == 0` or
/// `buffer == 0`.
///
/// @code
/// auto host_of = [](const std::string& url) { return url.substr(0, url.find('/', 8)); };
/// co_await sluice::for_each(
///     sluice::map_unordered(fetch, urls, 8, sluice::by_key(host_of, 2, {.buffer = 256})),
///     [&](page p) { store(p); });   // 8 at once, at most 2 per host, no slot idle for a host
/// @endcode
template <class KeyFn>
[[nodiscard]] by_key_t<KeyFn> by_key(KeyFn key, std::size_t per_key, by_key_options o = {}) {
  if (per_key == 0) throw std::invalid_argument("sluice::by_key: per_key must be at least 1");
  if (o.buffer == 0) throw std::invalid_argument("sluice::by_key: buffer must be at least 1");
  return by_key_t<KeyFn>{std::move(key), per_key, o.buffer, o.order};
}

/// A keyed limit the user owns that `sluice::by_key(key, limit)` can take:
/// a `keyed_semaphore<K>` or a `keyed_rate_limiter<K>` (any hash and equality).
template <class L>
concept keyed_limit = detail::keyed_limit_traits<L>::valid;

/// What `sluice::by_key(key, limit)` returns: a key function, the user's
/// keyed limit and the options, passed to `map_unordered` after its limit.
template <class KeyFn, keyed_limit Limit>
struct by_key_limit_t {
  KeyFn key;           ///< `key(const input&)`: the input's key (`Limit`'s key type)
  Limit* limit;        ///< the keyed limit, which must outlive the fan-out
  std::size_t buffer;  ///< the most inputs waiting for their key's grant
  key_order order;     ///< which input gets a free slot, among the keys granted
};

/// A key for each input of a fan-out, each key limited by a `keyed_semaphore`
/// or `keyed_rate_limiter` the caller owns and may share with other code (the
/// rest of the service calling the same hosts): for `map_unordered(fn,
/// inputs, limit, sluice::by_key(key, ks, {.buffer = n}))`, or
/// `gather_with_concurrency`'s keyed form.
///
/// - A slot is given to an input only once its key's grant is in hand: a
///   permit of a `keyed_semaphore`, held for exactly the task's run and
///   released when it ends (result, exception, cancellation, fail fast); or a
///   start of a `keyed_rate_limiter`, taken the instant the task starts.
///   Never to a task that would then wait for its key.
/// - Inputs wait outside the slots, per key in input order, at most `buffer`
///   of them (then the input is not pulled), as with a number per key.
/// - The limit is asked only while a slot is free, for the head input of each
///   key that has inputs waiting: free keys first (`try_acquire`, in
///   `.order`'s order), else one wait per such key, and the first grant takes
///   the slot. When the slot is taken, the other waits are withdrawn and any
///   grant that came with them is given back at once (a permit to the key's
///   next waiter, a rate start forgotten); they are asked again at the next
///   free slot, behind the limit's other waiters. So no grant is ever kept
///   without its running task, at the price of a place in the limit's queue.
///   Order between keys is `.order`'s among the keys the limit lets start.
/// - An error of the limit's wait (a `sluice::overloaded_error` of its shed
///   bound) is a failure of the input (see `map_unordered`).
/// - A `keyed_rate_limiter` built without an executor is bound to the clock
///   of the fan-out's executor (virtual under `testing::virtual_loop`) before
///   the fan-out's first `try_acquire`, as by a waiter. One already bound to
///   another clock (the steady clock, a virtual loop that ended) fails the
///   fan-out with its `std::logic_error` at its first input.
///
/// Per-Operation Cancellation: cancelling the fan-out (its consumer, fail
/// fast) withdraws every wait on the limit and awaits it: no permit, start or
/// waiter is left behind, including for a caller cancelled before it called.
/// The fan-out runs on `any_io_executor` coroutines (as the limits do), on
/// the limit's loop. Lifetimes: `limit` is used by reference and must outlive
/// the fan-out. Throws `std::invalid_argument` (nothing starts) if
/// `buffer == 0`.
///
/// @code
/// sluice::keyed_semaphore<std::string> per_host{2};   // also used elsewhere in the service
/// co_await sluice::for_each(
///     sluice::map_unordered(fetch, urls, 8, sluice::by_key(host_of, per_host)),
///     [&](page p) { store(p); });   // 8 at once; a slot only for a host with a free permit
/// @endcode
template <class KeyFn, keyed_limit Limit>
[[nodiscard]] by_key_limit_t<KeyFn, Limit> by_key(KeyFn key, Limit& limit, by_key_options o = {}) {
  if (o.buffer == 0) throw std::invalid_argument("sluice::by_key: buffer must be at least 1");
  return by_key_limit_t<KeyFn, Limit>{std::move(key), &limit, o.buffer, o.order};
}

/// A key function for the inputs of `In`: `key(const input&)` returns a key
/// that `std::hash` and `==` accept.
template <class KeyFn, class In>
concept key_function = fan_out_input<In> && std::invocable < KeyFn&,
        const fan_out_input_t<In>
& > &&requires(std::remove_cvref_t<std::invoke_result_t<KeyFn&, const fan_out_input_t<In>&>> k) {
  { std::hash<decltype(k)>{}(k) } -> std::convertible_to<std::size_t>;
  { k == k } -> std::convertible_to<bool>;
};

namespace detail {

template <bool Settle, class F, class In, class KeyFn>
auto make_keyed_stream(F fn, In&& inputs, std::size_t limit, by_key_t<KeyFn> keys) {
  using executor = task_executor_t<std::invoke_result_t<F&, fan_out_input_t<In>>>;
  using source = keyed_source<In, KeyFn, executor>;
  if (limit == 0)
    throw std::invalid_argument("sluice::map_unordered: limit must be at least 1 (got 0)");
  return make_map_stream<Settle>(keyed_call<F>{std::move(fn)},
                                 source(std::forward<In>(inputs), std::move(keys.key), keys.per_key,
                                        keys.buffer, keys.order == key_order::most_waiting),
                                 limit);
}

template <bool Settle, class F, class In, class KeyFn, class Limit>
auto make_keyed_stream(F fn, In&& inputs, std::size_t limit, by_key_limit_t<KeyFn, Limit> keys) {
  using executor = task_executor_t<std::invoke_result_t<F&, fan_out_input_t<In>>>;
  static_assert(std::is_same_v<executor, asio::any_io_executor>,
                "sluice::by_key(key, keyed_limit): the tasks must be asio::awaitable<T> on the "
                "default any_io_executor, as the keyed limits' waits are");
  using source = keyed_source<In, KeyFn, executor, Limit>;
  if (limit == 0)
    throw std::invalid_argument("sluice::map_unordered: limit must be at least 1 (got 0)");
  return make_map_stream<Settle>(keyed_call<F>{std::move(fn)},
                                 source(std::forward<In>(inputs), std::move(keys.key), *keys.limit,
                                        keys.buffer, keys.order == key_order::most_waiting),
                                 limit);
}

}  // namespace detail

/// A key function for the inputs of `In` whose key is `Limit`'s: `key(const
/// input&)` returns something convertible to `Limit`'s key type.
template <class KeyFn, class In, class Limit>
concept limit_key_function = fan_out_input<In> && keyed_limit<Limit> && std::invocable < KeyFn&,
        const fan_out_input_t<In>
& > &&std::convertible_to<std::invoke_result_t<KeyFn&, const fan_out_input_t<In>&>,
                          typename detail::keyed_limit_traits<Limit>::key_type>;

/// `map_unordered` with a key per input and the user's keyed limit per key
/// (see `sluice::by_key(key, limit)`): at most `limit` tasks at once, a slot
/// only for an input whose key's grant is in hand.
template <class F, class In, class KeyFn, class Limit>
requires fan_out_function<F, In> && limit_key_function<KeyFn, In, Limit>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit,
                                 by_key_limit_t<KeyFn, Limit> keys) {
  return detail::make_keyed_stream<false>(std::move(fn), std::forward<In>(inputs), limit,
                                          std::move(keys));
}

/// Settling `map_unordered` with the user's keyed limit: every input runs;
/// results are `outcome<T>`.
template <class F, class In, class KeyFn, class Limit>
requires fan_out_function<F, In> && limit_key_function<KeyFn, In, Limit>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit,
                                 by_key_limit_t<KeyFn, Limit> keys, return_exceptions_t) {
  return detail::make_keyed_stream<true>(std::move(fn), std::forward<In>(inputs), limit,
                                         std::move(keys));
}

/// `map_unordered` with a key per input and a limit per key (see
/// `sluice::by_key`): at most `limit` tasks at once, at most `per_key` of
/// one key, a slot always to the oldest input whose key has room.
template <class F, class In, class KeyFn>
requires fan_out_function<F, In> && key_function<KeyFn, In>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit, by_key_t<KeyFn> keys) {
  return detail::make_keyed_stream<false>(std::move(fn), std::forward<In>(inputs), limit,
                                          std::move(keys));
}

/// Settling `map_unordered` by key: every input runs; results are
/// `outcome<T>`.
template <class F, class In, class KeyFn>
requires fan_out_function<F, In> && key_function<KeyFn, In>
[[nodiscard]] auto map_unordered(F fn, In&& inputs, std::size_t limit, by_key_t<KeyFn> keys,
                                 return_exceptions_t) {
  return detail::make_keyed_stream<true>(std::move(fn), std::forward<In>(inputs), limit,
                                         std::move(keys));
}

/// A key function for `gather_with_concurrency(limit, tasks, by_key(...))`:
/// `key(std::size_t index)`, the index of the task in `tasks`, returns a key
/// that `std::hash` and `==` accept.
template <class KeyFn>
concept index_key_function = std::invocable<KeyFn&, std::size_t> &&
    requires(std::remove_cvref_t<std::invoke_result_t<KeyFn&, std::size_t>> k) {
  { std::hash<decltype(k)>{}(k) } -> std::convertible_to<std::size_t>;
  { k == k } -> std::convertible_to<bool>;
};

namespace detail {

// The same keys for the index source: key(index).
template <class KeyFn>
by_key_t<index_key<KeyFn>> index_keys(by_key_t<KeyFn> k) {
  return {{std::move(k.key)}, k.per_key, k.buffer, k.order};
}
template <class KeyFn, class Limit>
by_key_limit_t<index_key<KeyFn>, Limit> index_keys(by_key_limit_t<KeyFn, Limit> k) {
  return {{std::move(k.key)}, k.limit, k.buffer, k.order};
}

template <bool Settle, class R, class Keys>
auto start_keyed_gather(std::size_t limit, R&& tasks, Keys keys) {
  static_assert(!lends_stored_tasks<R>,
                "sluice::gather_with_concurrency: `tasks` holds stored asio::awaitable<T>s and is "
                "passed as an lvalue, but an awaitable runs only once and would be moved out of "
                "it: pass std::move(tasks) (or a lazy range that makes each task when it is "
                "dereferenced).");
  if (limit == 0)
    throw std::invalid_argument(
        "sluice::gather_with_concurrency: limit must be at least 1 (got 0)");
  using task_type = std::ranges::range_value_t<R>;
  auto s = make_keyed_stream<false>(run_indexed<Settle, task_type>{},
                                    indexed_tasks<R>(std::forward<R>(tasks)), limit,
                                    index_keys(std::move(keys)));
  return keyed_gather<Settle, task_type>(std::move(s));
}

}  // namespace detail

/// `gather_with_concurrency` with a key per task and a limit per key: at most
/// `limit` tasks at once, at most `per_key` of one key, a slot always to the
/// oldest task whose key has room (or as `by_key_options::order` says);
/// results in input order, as `gather_with_concurrency`'s.
///
/// The key is a function of the task's index in `tasks`, `key(std::size_t)`
/// (an awaitable cannot be looked into): index the data the tasks were made
/// from. It is called once per task, when the task is pulled; an exception
/// it throws fails the call as a task's would (also with
/// `return_exceptions`: a key is not a result). Tasks of a full key wait
/// unstarted outside the slots (at most `buffer`, then the range is not
/// pulled). Fail fast, cancellation, the join before returning, lazy input
/// and the exceptions are `gather_with_concurrency`'s; `limit`, `per_key` or
/// `buffer` 0 throws `std::invalid_argument` before anything starts.
///
/// @code
/// auto tasks = urls | std::views::transform(fetch);             // lazy: made as slots free
/// std::vector<page> pages = co_await sluice::gather_with_concurrency(
///     8, tasks, sluice::by_key([&](std::size_t i) { return host_of(urls[i]); }, 2));
/// @endcode
template <task_range R, index_key_function KeyFn>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks, by_key_t<KeyFn> keys) {
  return detail::start_keyed_gather<false>(limit, std::forward<R>(tasks), std::move(keys));
}

/// Settling `gather_with_concurrency` by key: every task runs; results are
/// `outcome<T>`, in input order.
template <task_range R, index_key_function KeyFn>
[[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks, by_key_t<KeyFn> keys,
                                           return_exceptions_t) {
  return detail::start_keyed_gather<true>(limit, std::forward<R>(tasks), std::move(keys));
}

/// `gather_with_concurrency` with a key per task (`key(std::size_t index)`)
/// and the user's keyed limit per key (see `sluice::by_key(key, limit)`): a
/// slot only for a task whose key's grant is in hand; results in input
/// order. Everything else as the keyed form with a number.
template <task_range R, class KeyFn, keyed_limit Limit>
requires std::convertible_to < std::invoke_result_t<KeyFn&, std::size_t>,
typename detail::keyed_limit_traits<Limit>::key_type >
    [[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks,
                                               by_key_limit_t<KeyFn, Limit> keys) {
  return detail::start_keyed_gather<false>(limit, std::forward<R>(tasks), std::move(keys));
}

/// Settling `gather_with_concurrency` with the user's keyed limit: every
/// task runs; results are `outcome<T>`, in input order.
template <task_range R, class KeyFn, keyed_limit Limit>
requires std::convertible_to < std::invoke_result_t<KeyFn&, std::size_t>,
typename detail::keyed_limit_traits<Limit>::key_type >
    [[nodiscard]] auto gather_with_concurrency(std::size_t limit, R&& tasks,
                                               by_key_limit_t<KeyFn, Limit> keys,
                                               return_exceptions_t) {
  return detail::start_keyed_gather<true>(limit, std::forward<R>(tasks), std::move(keys));
}

}  // namespace sluice

#endif  // SLUICE_BY_KEY_HPP
