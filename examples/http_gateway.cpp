// SPDX-License-Identifier: BSL-1.0
// An HTTP/1.1 gateway (Boost.Beast; support/http_server.hpp: N threads, a strand per
// session): GET /item/<key>?user=<u> calls the slow TCP provider (examples/slow_server)
// under a per-user limit and single-flight per key (strand_bound), through ONE
// sluice::policy that every session shares, outermost first: a breaker (503 +
// Retry-After while the provider fails), a deadline (504), the cap at the provider
// with a shed past --queue waiting (429 + Retry-After; a slot the deadline abandoned
// stays taken --linger-ms more), retries of throttles, a global rate. Provider error: 502.
// GET /metrics: every layer of the policy and the cap (sluice::prometheus_text).
//   http_gateway --provider-port P [--port 0] [--threads 4] [--rate 5000] [--per-user 2] [--cap 8]
//     [--queue 16] [--timeout-ms 2000] [--linger-ms 50] [--open-ms 2000] [--breaker-calls 10]
//     serves until SIGINT/SIGTERM; --virtual: an in-process provider, 96 requests, checked
// Under load: tests/load/http_gateway_load.py (CTest `http_gateway_load`).
#include <sluice/sluice.hpp>

#include "support/http_server.hpp"
#include "support/slow_server.hpp"

namespace {

using namespace std::chrono_literals;
using namespace sluice_examples;
using ms = std::chrono::milliseconds;

struct options {
  long port = 0, provider_port = 0, threads = 4, rate = 5000, per_user = 2, cap = 8, queue = 16,
       timeout_ms = 2000, linger_ms = 50, open_ms = 2000, breaker_calls = 10;
};

class gateway {
  using flights = sluice::strand_bound<sluice::single_flight<std::string, std::string>>;

 public:
  gateway(asio::io_context& ctx, const options& o)
      : o_(o),
        rps_(asio::make_strand(ctx), o.rate, 1s),
        per_user_(asio::make_strand(ctx), std::size_t(o.per_user)),
        cap_(std::size_t(o.cap)),
        provider_(
            sluice::breaker({.window = 20,
                             .minimum_calls = std::size_t(o.breaker_calls),
                             .open_for = ms(o.open_ms),
                             .on_state_change =
                                 [](auto f, auto t) {
                                   std::printf("breaker: %s -> %s\n", to_string(f), to_string(t));
                                 }}),
            sluice::timeout(ms(o.timeout_ms)),
            sluice::shed(cap_, {.max_waiting = std::size_t(o.queue), .linger = ms(o.linger_ms)}),
            sluice::retry_layer({.first = 20ms, .max = 200ms, .attempts = 3}),
            sluice::limits(rps_)) {
    for (long i = 0; i < o.threads; ++i) shards_.emplace_back(asio::make_strand(ctx));
  }

  asio::awaitable<http_response> operator()(const http_request& req) {
    http_response res{http::status::ok, 11};
    const std::string_view t = req.target();
    const auto q = t.find("?user=");
    if (t == "/metrics")
      res.body() = metrics();
    else if (!t.starts_with("/item/") || q == t.npos)
      res.result(http::status::not_found);
    else
      try {
        const std::string key(t.substr(6, q - 6)), user(t.substr(q + 6));
        auto permit = co_await per_user_.scoped_acquire(user);
        auto& shard = shards_[std::hash<std::string>{}(key) % shards_.size()];
        auto work = std::bind_front(&gateway::fetch, this, key);  // named: g++ 12 frees
        res.body() = co_await shard.run(key, work) + "\n";        // a co_await's temporaries twice
      } catch (...) {
        const sluice::http_refusal r = sluice::http_refusal_for(std::current_exception());
        res.result(r.status);
        if (r.retry_after.count() > 0) res.set(http::field::retry_after, r.retry_after_text());
      }
    co_return res;
  }
  std::string metrics() {
    return sluice::prometheus_text().add("provider", provider_).add("cap", cap_.stats()).str();
  }

 private:
  // The shared work of one key, on its shard's strand. A call the deadline
  // abandoned keeps its key busy --linger-ms more, as the shed keeps its slot.
  asio::awaitable<std::string> fetch(std::string key) {
    std::exception_ptr abandoned;
    try {
      co_return co_await provider_([this, &key]() -> asio::awaitable<std::string> {
        std::string r = co_await request(std::uint16_t(o_.provider_port), "GET " + key);
        if (r.starts_with("THROTTLED")) throw sluice::throttled_error("provider: " + r);
        if (!r.starts_with("OK")) throw std::runtime_error("provider: " + r);
        co_return r;
      });
    } catch (const sluice::timeout_error&) {
      abandoned = std::current_exception();
    }
    co_await sluice::sleep(ms(o_.linger_ms));
    std::rethrow_exception(abandoned);
  }

  options o_;
  sluice::strand_bound<sluice::rate_limiter> rps_;
  sluice::strand_bound<sluice::keyed_semaphore<std::string>> per_user_;
  sluice::shared_semaphore cap_;
  sluice::call_policy<sluice::circuit_breaker, sluice::timeout_layer,
                      sluice::shed_layer<sluice::shared_semaphore>, sluice::retry_layer,
                      sluice::limits_layer<sluice::strand_bound<sluice::rate_limiter>>>
      provider_;
  std::deque<flights> shards_;  // one flight table per strand
};

// --virtual: 96 requests; the provider's line client speaks enough HTTP/1.0.
asio::awaitable<void> self_check(unsigned short port, std::size_t& ok) {
  std::vector<asio::awaitable<std::string>> calls;
  for (int i = 0; i < 96; ++i)
    calls.push_back(request(port, "GET /item/k" + std::to_string(i % 12) + "?user=u" +
                                      std::to_string(i % 6) + " HTTP/1.0\r\n\r"));
  for (const std::string& status : co_await sluice::gather_with_concurrency(32, std::move(calls)))
    ok += status.starts_with("HTTP/1.0 200");
}

}  // namespace

int main(int argc, char** argv) try {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the load test reads the breaker's changes live
  options o;
  // clang-format off
  const std::map<std::string_view, long*> flags = {{"--port", &o.port},
      {"--provider-port", &o.provider_port}, {"--threads", &o.threads}, {"--rate", &o.rate},
      {"--per-user", &o.per_user}, {"--cap", &o.cap}, {"--queue", &o.queue},
      {"--timeout-ms", &o.timeout_ms}, {"--linger-ms", &o.linger_ms}, {"--open-ms", &o.open_ms},
      {"--breaker-calls", &o.breaker_calls}};
  // clang-format on
  for (int i = 1; i + 1 < argc; i += 2)
    if (auto f = flags.find(argv[i]); f != flags.end()) *f->second = std::atol(argv[i + 1]);
  const bool check = argc > 1 && argv[1] == std::string_view("--virtual");
  asio::io_context provider_ctx;  // --virtual: the provider, on a thread of its own
  slow_server provider(provider_ctx, {.throttle_above = 4, .throttle_per_key = 1});
  if (check) o = {.provider_port = provider.port(), .cap = 4}, provider.start();
  std::jthread provider_thread([&] { provider_ctx.run(); });
  asio::io_context ctx(static_cast<int>(o.threads));
  gateway g(ctx, o);
  http_server srv(ctx, std::uint16_t(o.port), std::ref(g));
  srv.stop_on_signals();
  std::size_t ok = 0;
  if (check) co_spawn(make_strand(ctx), self_check(srv.port(), ok), [&](auto) { srv.stop(); });
  std::printf("listening on 127.0.0.1:%u\n", srv.port());
  srv.run(o.threads);
  if (!check) return 0;
  provider_ctx.stop();
  provider_thread.join();
  std::printf("provider: %s; HTTP 200: %zu of 96\n", provider.stats_line().c_str(), ok);
  const server_stats& s = provider.stats();
  return ok == 96 && s.throttled == 0 && s.max_concurrent <= 4 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "http_gateway: %s\n", e.what());
  return 1;
}
