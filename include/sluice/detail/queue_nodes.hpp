// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_QUEUE_NODES_HPP
#define SLUICE_DETAIL_QUEUE_NODES_HPP

// The waiting operations of sluice::queue (queue.hpp): a getter's and a
// putter's node, and how a getter's item is delivered.

#include <sluice/config.hpp>
#include <sluice/detail/waiter_list.hpp>
#include <sluice/queue_error.hpp>

#include <optional>
#include <tuple>
#include <utility>

namespace sluice::detail {

template <class T>
struct get_node : wait_op {
  std::optional<T> item;
  get_node() = default;
  explicit get_node(T&& v) : item(std::move(v)) {}
};

template <class T>
struct put_node : wait_op {
  std::optional<T> item;
  explicit put_node(T&& v) : item(std::move(v)) {}
};

// A getter that completes without an error has an item, unless an immediate
// shutdown dropped the item handed to it before it resumed: it then fails
// with shut_down, as a Python getter that wakes to a shut-down, empty queue.
template <class T>
void check_not_dropped(const get_node<T>& n, error_code& ec) {
  if (!ec && !n.item) ec = queue_errc::shut_down;
}

// Delivers the item as T (value-initialized on error).
template <class T>
struct deliver_item {
  std::tuple<T> operator()(get_node<T>& n, error_code& ec) const {
    check_not_dropped(n, ec);
    if (n.item) return std::tuple<T>(std::move(*n.item));
    return std::tuple<T>(T{});
  }
};

// Delivers the item as std::optional<T> (no default constructor needed).
template <class T>
struct deliver_optional {
  std::tuple<std::optional<T>> operator()(get_node<T>& n, error_code& ec) const {
    check_not_dropped(n, ec);
    return std::tuple<std::optional<T>>(std::move(n.item));
  }
};

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_QUEUE_NODES_HPP
