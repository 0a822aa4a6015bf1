// SPDX-License-Identifier: BSL-1.0
#ifndef SLUICE_REDIS_DETAIL_RESP_HPP
#define SLUICE_REDIS_DETAIL_RESP_HPP

// RESP, the Redis protocol, through hiredis: formatting commands (and the
// AUTH/SELECT of a new socket), and parsing replies into redis::reply.

#include <sluice/config.hpp>
#include <sluice/redis/options.hpp>
#include <sluice/redis/reply.hpp>

#include <hiredis/hiredis.h>

#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace sluice::detail {

// One command in RESP, formatted by hiredis. Throws std::invalid_argument for
// an empty command.
inline std::string redis_format(const std::vector<std::string>& args) {
  if (args.empty()) throw std::invalid_argument("sluice::redis: a command needs at least its name");
  std::vector<const char*> argv;
  std::vector<std::size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  char* out = nullptr;
  const int n =
      redisFormatCommandArgv(&out, static_cast<int>(args.size()), argv.data(), lens.data());
  if (n < 0 || out == nullptr) throw std::bad_alloc();
  std::string s(out, static_cast<std::size_t>(n));
  redisFreeCommand(out);
  return s;
}

// Copies hiredis's reply tree into a redis::reply.
inline redis::reply redis_convert(const redisReply* r) {
  redis::reply out;
  switch (r->type) {
    case REDIS_REPLY_NIL:
      out.kind = redis::reply_kind::nil;
      break;
    case REDIS_REPLY_INTEGER:
      out.kind = redis::reply_kind::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.kind = redis::reply_kind::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i)
        out.elements.push_back(redis_convert(r->element[i]));
      break;
    case REDIS_REPLY_STATUS:
      out.kind = redis::reply_kind::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.kind = redis::reply_kind::error;
      out.str.assign(r->str, r->len);
      break;
    default:  // string, and RESP3 kinds of newer hiredis
      out.kind = redis::reply_kind::string;
      if (r->str != nullptr) out.str.assign(r->str, r->len);
      break;
  }
  return out;
}

// A pub/sub message ("message"/"pmessage" array) on a subscribed connection.
inline bool redis_is_push(const redis::reply& r) {
  return r.kind == redis::reply_kind::array && r.elements.size() >= 3 &&
         (r.elements[0].str == "message" || r.elements[0].str == "pmessage");
}

// The AUTH and SELECT that `o` asks for on every new socket, formatted, and
// how many commands that is.
inline std::pair<std::string, std::size_t> redis_handshake(const redis::options& o) {
  std::pair<std::string, std::size_t> out;
  if (!o.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!o.user.empty()) auth.push_back(o.user);
    auth.push_back(o.password);
    out.first += redis_format(auth);
    ++out.second;
  }
  if (o.db != 0) {
    out.first += redis_format({"SELECT", std::to_string(o.db)});
    ++out.second;
  }
  return out;
}

// hiredis's incremental reply parser, one per socket (reset() for a new one).
class redis_resp_reader {
 public:
  redis_resp_reader() { reset(); }
  redis_resp_reader(const redis_resp_reader&) = delete;
  redis_resp_reader& operator=(const redis_resp_reader&) = delete;
  ~redis_resp_reader() { redisReaderFree(r_); }

  // Starts over (a new socket): bytes of the old one are dropped.
  void reset() {
    if (r_ != nullptr) redisReaderFree(r_);
    r_ = redisReaderCreate();
    if (r_ == nullptr) throw std::bad_alloc();
  }
  // Appends bytes read; false on a protocol error.
  bool feed(const char* data, std::size_t n) { return redisReaderFeed(r_, data, n) == REDIS_OK; }
  // The next complete reply into `out`: 1, or 0 when none is complete yet,
  // -1 on a protocol error.
  int next(redis::reply& out) {
    void* raw = nullptr;
    if (redisReaderGetReply(r_, &raw) != REDIS_OK) return -1;
    if (raw == nullptr) return 0;
    out = redis_convert(static_cast<const redisReply*>(raw));
    freeReplyObject(raw);
    return 1;
  }

 private:
  redisReader* r_ = nullptr;
};

}  // namespace sluice::detail

#endif  // SLUICE_REDIS_DETAIL_RESP_HPP
