// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_DETAIL_WAITER_QUEUE_HPP
#define SLUICE_DETAIL_WAITER_QUEUE_HPP

// The intrusive FIFO of waiting operations (waiter_list) and the watch that
// takes a dying loop's waiters out of it (loop_watch). The operations
// themselves are in waiter_list.hpp.

#include <sluice/config.hpp>
#include <sluice/detail/loop_service.hpp>

#include <sluice/detail/asio.hpp>

#include <cstddef>
#include <memory>
#include <utility>

namespace sluice::detail {

class waiter_list;
struct loop_watch;

// A pending wait, embedded in its operation object. Invariant: `owner` is the
// list the node is linked into, or null when it is not linked.
struct waiter_node {
  waiter_node* prev = nullptr;
  waiter_node* next = nullptr;
  waiter_list* owner = nullptr;
  // The context the waiter resumes on, while a watch of its list covers it
  // (see loop_watch); null otherwise.
  asio::execution_context* loop = nullptr;
  // Destroys the pending operation without running its handler.
  void (*discard_fn)(waiter_node*) noexcept = nullptr;
};

// Intrusive FIFO of waiter nodes: O(1) push_back, pop_front and erase; no
// allocation (but one loop_watch per context its waiters resume on).
// Tracks its high-water mark for diagnostics.
//
// Loops that come and go: a waiter's io_context may be destroyed while the
// waiter is queued here (a loop per batch, per test, per worker thread; the
// primitive outlives it). The list then keeps one loop_watch, a hook on that
// context's loop_service, for every context its waiters resume on: at the
// context's shutdown the watch takes that context's waiters out (as if
// cancelled: notify_cancelled runs, so a rate limiter re-arms for the next
// head) and, once every primitive's dying waiters are out, destroys them with
// their frames. A release, put or refill then goes to the next live waiter or
// stays available; nothing is ever posted into the dead context. The watch
// runs on the thread that destroys the context: for a loop-affine primitive
// that must be the thread that uses it (as it is when a thread runs and then
// destroys its own loop).
class waiter_list {
 public:
  // `watch_loops` false: a list whose waiters never wait (a queue's items
  // handed to getters whose completion is already posted, a scratch list).
  explicit waiter_list(bool watch_loops = true) noexcept : watch_loops_(watch_loops) {}
  waiter_list(const waiter_list&) = delete;
  waiter_list& operator=(const waiter_list&) = delete;
  inline ~waiter_list();

  // Before a waiter resuming on `ctx` (null: none to watch) is linked: makes
  // sure a watch covers `ctx`; returns the context to record in the node's
  // `loop` (null if not watched: an ending context, or watching is off).
  // May throw (bad_alloc) the first time a context is seen.
  inline asio::execution_context* watch(asio::execution_context* ctx);

  [[nodiscard]] bool empty() const noexcept { return head_ == nullptr; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t max_size() const noexcept { return max_size_; }
  [[nodiscard]] waiter_node* front() const noexcept { return head_; }
  [[nodiscard]] waiter_node* back() const noexcept { return tail_; }

  // Optional hook, run after a waiter was unlinked by its cancellation (its
  // abort is already posted). A primitive whose head waiter can hold back the
  // others (a rate limiter: a large request at the head) re-examines its queue
  // there. Null for the others.
  void on_cancel(void (*fn)(void*), void* context) noexcept {
    on_cancel_ = fn;
    on_cancel_context_ = context;
  }
  void notify_cancelled() {
    if (on_cancel_ != nullptr) on_cancel_(on_cancel_context_);
  }

  void push_back(waiter_node* n) noexcept {
    n->owner = this;
    n->next = nullptr;
    n->prev = tail_;
    if (tail_ != nullptr) {
      tail_->next = n;
    } else {
      head_ = n;
    }
    tail_ = n;
    if (++size_ > max_size_) max_size_ = size_;
  }

  waiter_node* pop_front() noexcept {
    waiter_node* n = head_;
    if (n != nullptr) erase(n);
    return n;
  }

  // Precondition: n->owner == this.
  void erase(waiter_node* n) noexcept {
    if (n->prev != nullptr) {
      n->prev->next = n->next;
    } else {
      head_ = n->next;
    }
    if (n->next != nullptr) {
      n->next->prev = n->prev;
    } else {
      tail_ = n->prev;
    }
    n->prev = n->next = nullptr;
    n->owner = nullptr;
    --size_;
  }

 private:
  waiter_node* head_ = nullptr;
  waiter_node* tail_ = nullptr;
  std::size_t size_ = 0;
  std::size_t max_size_ = 0;
  void (*on_cancel_)(void*) = nullptr;
  void* on_cancel_context_ = nullptr;
  friend struct loop_watch;
  loop_watch* watches_ = nullptr;                 // one per context watched
  asio::execution_context* last_loop_ = nullptr;  // a watched context (a cache)
  bool watch_loops_ = true;
};

// One context whose waiters one waiter_list watches. Its on_end runs in two
// rounds of loop_life::end(): first (take_out) the context's waiters leave the
// list, then (bury) they are destroyed, so that a frame destroyed in the
// second round, releasing what it held, finds no dying waiter anywhere.
struct loop_watch : loop_hook {
  loop_watch(waiter_list& l, asio::execution_context& c, std::shared_ptr<loop_life> lf) noexcept
      : list(&l), ctx(&c), life(std::move(lf)) {
    on_end = &take_out;
  }
  waiter_list* list;
  asio::execution_context* ctx;
  std::shared_ptr<loop_life> life;
  loop_watch* next_watch = nullptr;
  waiter_node* dead = nullptr;  // taken out, not yet destroyed (linked by `next`)
  bool* gone = nullptr;         // while burying: set if the list is destroyed

  static void destroy_dead(waiter_node*& dead) noexcept {
    while (waiter_node* n = dead) {
      dead = n->next;
      n->next = nullptr;
      n->discard_fn(n);
    }
  }

  static void take_out(loop_hook* h) noexcept {
    auto* w = static_cast<loop_watch*>(h);
    waiter_list& l = *w->list;
    if (l.last_loop_ == w->ctx) l.last_loop_ = nullptr;
    std::size_t n_out = 0;
    for (waiter_node* n = l.head_; n != nullptr;) {
      waiter_node* next = n->next;
      if (n->loop == w->ctx) {
        l.erase(n);
        n->next = w->dead;
        w->dead = n;
        ++n_out;
      }
      n = next;
    }
    w->on_end = &bury;
    w->life->relink(*w);
    try {
      while (n_out-- > 0) l.notify_cancelled();
    } catch (...) {  // out of memory re-arming a rate limiter: it re-arms on its next use
    }
  }

  static void bury(loop_hook* h) noexcept {
    auto* w = static_cast<loop_watch*>(h);
    bool gone = false;
    w->gone = &gone;
    destroy_dead(w->dead);  // a frame destroyed here may destroy the list too
    if (!gone) {
      waiter_list& l = *w->list;
      loop_watch** p = &l.watches_;
      while (*p != w) p = &(*p)->next_watch;
      *p = w->next_watch;
    }
    delete w;
  }
};

inline asio::execution_context* waiter_list::watch(asio::execution_context* ctx) {
  if (!watch_loops_ || ctx == nullptr) return nullptr;
  if (ctx == last_loop_) return ctx;
  loop_watch* w = watches_;
  while (w != nullptr && w->ctx != ctx) w = w->next_watch;
  if (w == nullptr) {
    auto life = loop_service::life_of(*ctx);
    auto fresh = std::make_unique<loop_watch>(*this, *ctx, life);
    if (!life->attach_first(*fresh)) return nullptr;  // the context is going away
    fresh->next_watch = watches_;
    w = watches_ = fresh.release();
  } else if (w->life->ended()) {
    return nullptr;
  }
  last_loop_ = ctx;
  return ctx;
}

inline waiter_list::~waiter_list() {
  while (loop_watch* w = watches_) {
    watches_ = w->next_watch;
    const std::shared_ptr<loop_life> life = w->life;
    const auto lock = life->lock();
    life->detach(*w);
    if (w->gone != nullptr) {  // being buried: bury() finishes and deletes it
      *w->gone = true;
      continue;
    }
    loop_watch::destroy_dead(w->dead);
    delete w;
  }
}

}  // namespace sluice::detail

#endif  // SLUICE_DETAIL_WAITER_QUEUE_HPP
