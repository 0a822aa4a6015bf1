// SPDX-License-Identifier: BSL-1.0
// sluice::redis::connection against a real redis-server on loopback.
#include <sluice/redis/connection.hpp>

#include <support/asio.hpp>
#include <support/redis_run.hpp>
#include <support/redis_server.hpp>

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

using namespace std::chrono_literals;
using sluice::redis::errc;
using sluice::redis::make_error_code;
using sluice::redis::reply;
using sluice_test::connect_to;
using sluice_test::run_for;
using sluice_test::sleep_ms;

TEST_CASE("many coroutines sharing one connection each get their own reply", "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  int mismatches = 0;
  int done = 0;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(server.port());
    auto one = [&](int i) -> asio::awaitable<void> {
      const std::string k = std::string("k:") + std::to_string(i);
      co_await conn->execute("SET", k, std::to_string(i * 7));
      reply r = co_await conn->execute("GET", k);
      reply e = co_await conn->execute("ECHO", std::string("echo-") + std::to_string(i));
      if (r.str != std::to_string(i * 7) || e.str != std::string("echo-") + std::to_string(i))
        ++mismatches;
      ++done;
    };
    auto ex = co_await asio::this_coro::executor;
    for (int i = 0; i < 500; ++i) asio::co_spawn(ex, one(i), asio::detached);
    while (done < 500) co_await sleep_ms(5);
    CHECK(conn->pending() == 0);
    co_await conn->close();
  }());
  CHECK(done == 500);
  CHECK(mismatches == 0);
}

TEST_CASE("a cancelled call still consumes its reply, so later calls stay matched", "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(server.port());
    auto ex = co_await asio::this_coro::executor;
    // BLPOP on an empty list answers nil after 0.3 s; cancel the caller first.
    asio::cancellation_signal sig;
    bool blpop_done = false;
    sluice::error_code blpop_ec;
    std::vector<std::string> blpop{"BLPOP", "nothing", "0.3"};
    conn->async_execute(std::move(blpop),
                        asio::bind_cancellation_slot(sig.slot(), [&](sluice::error_code ec, reply) {
                          blpop_done = true;
                          blpop_ec = ec;
                        }));
    // Queued behind it on the same connection: must get its own reply.
    std::string behind;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> { behind = (co_await conn->execute("ECHO", "behind")).str; },
        asio::detached);
    co_await sleep_ms(50);
    sig.emit(asio::cancellation_type::terminal);
    co_await sleep_ms(10);
    CHECK(blpop_done);
    CHECK(blpop_ec == asio::error::operation_aborted);
    CHECK(conn->pending() == 2);  // the dropped BLPOP reply and ECHO are still to come
    reply after = co_await conn->execute("ECHO", "after");
    CHECK(after.str == "after");
    CHECK(behind == "behind");
    CHECK(conn->pending() == 0);
    co_await conn->close();
  }());
}

TEST_CASE("an error reply is a server_error and the connection stays usable", "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(server.port());
    co_await conn->execute("SET", "s", "text");
    std::string what;
    try {
      co_await conn->execute("INCR", "s");
    } catch (const sluice::redis::server_error& e) {
      what = e.what();
    }
    CHECK(what.find("ERR") != std::string::npos);
    // async_execute delivers it as a reply.
    auto token = asio::use_awaitable;
    std::vector<std::string> lpush{"LPUSH", "s", "x"};
    reply r = co_await conn->async_execute(std::move(lpush), token);
    CHECK(r.is_error());
    CHECK(r.str.rfind("WRONGTYPE", 0) == 0);
    CHECK((co_await conn->execute("GET", "s")).str == "text");
    co_await conn->close();
  }());
}

TEST_CASE("replies of every kind are converted, and any completion token works", "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  std::shared_ptr<sluice::redis::connection> conn;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    conn = co_await connect_to(server.port());
    co_await conn->execute("RPUSH", "l", "a", "b");
  }());
  // A plain callback, run by the connection's executor.
  reply got;
  conn->async_execute({"LRANGE", "l", "0", "-1"}, [&](sluice::error_code ec, reply r) {
    CHECK(!ec);
    got = std::move(r);
  });
  reply nil, integer, status;
  conn->async_execute({"GET", "missing"}, [&](sluice::error_code, reply r) { nil = r; });
  conn->async_execute({"INCRBY", "n", "41"}, [&](sluice::error_code, reply r) { integer = r; });
  conn->async_execute({"PING"}, [&](sluice::error_code, reply r) { status = r; });
  ctx.restart();
  while (status.kind == sluice::redis::reply_kind::nil) ctx.run_one_for(std::chrono::seconds(5));
  REQUIRE(got.kind == sluice::redis::reply_kind::array);
  REQUIRE(got.elements.size() == 2);
  CHECK(got.elements[1].str == "b");
  CHECK(nil.is_nil());
  CHECK(integer.kind == sluice::redis::reply_kind::integer);
  CHECK(integer.integer == 41);
  CHECK(status.kind == sluice::redis::reply_kind::status);
  CHECK(status.str == "PONG");
  run_for(ctx, conn->close());
  CHECK_THROWS_AS(conn->async_execute({}, [](sluice::error_code, reply) {}), std::invalid_argument);
}

TEST_CASE("a lost connection fails every pending call; the next call reconnects", "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(server.port());
    auto ex = co_await asio::this_coro::executor;
    std::vector<sluice::error_code> errors;
    for (int i = 0; i < 3; ++i) {
      asio::co_spawn(
          ex,
          [&]() -> asio::awaitable<void> {
            errors.push_back(co_await sluice_test::error_of(conn->execute("BLPOP", "q", "10")));
          },
          asio::detached);
    }
    co_await sleep_ms(50);
    server.stop();
    for (int i = 0; i < 100 && errors.size() < 3; ++i) co_await sleep_ms(10);
    REQUIRE(errors.size() == 3);
    for (auto& ec : errors) CHECK(ec == make_error_code(errc::connection_lost));
    CHECK(!conn->is_open());
    // The next call tries to reconnect once, and fails clearly while the server is down.
    auto down = co_await sluice_test::error_of(conn->execute("PING"));
    CHECK(down == asio::error::connection_refused);
    REQUIRE(server.restart());
    CHECK((co_await conn->execute("PING")).str == "PONG");
    CHECK(conn->is_open());
    co_await conn->close();
  }());
}

TEST_CASE("close fails pending calls, waits for the I/O, and refuses later calls", "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await connect_to(server.port());
    auto ex = co_await asio::this_coro::executor;
    sluice::error_code pending_ec;
    bool finished = false;
    asio::co_spawn(
        ex,
        [&]() -> asio::awaitable<void> {
          pending_ec = co_await sluice_test::error_of(conn->execute("BLPOP", "q", "10"));
          finished = true;
        },
        asio::detached);
    co_await sleep_ms(20);
    co_await conn->close();
    co_await sleep_ms(1);
    CHECK(finished);
    CHECK(pending_ec == make_error_code(errc::closed));
    CHECK(co_await sluice_test::error_of(conn->execute("PING")) == make_error_code(errc::closed));
    CHECK(co_await sluice_test::error_of(conn->reconnect()) == make_error_code(errc::closed));
  }());
}

TEST_CASE("a connection over a unix domain socket", "[redis]") {
  const std::string path = "/tmp/sluice-redis-test-" + std::to_string(::getpid()) + ".sock";
  auto server = sluice_test::server_or_skip(path);
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto conn = co_await sluice::redis::connect_unix(co_await asio::this_coro::executor, path);
    CHECK((co_await conn->execute("ECHO", "over unix")).str == "over unix");
    auto again = co_await conn->connect_again();
    CHECK((co_await again->execute("PING")).str == "PONG");
    co_await again->close();
    co_await conn->close();
  }());
  ::unlink(path.c_str());
}

TEST_CASE("connecting to a port nobody listens on throws", "[redis]") {
  asio::io_context ctx;
  const int port = sluice_test::free_port();
  CHECK_THROWS_AS(run_for(ctx, connect_to(port)), sluice::system_error);
}

TEST_CASE("AUTH (ACL user) and SELECT are sent again on every reconnect, after CLIENT KILL",
          "[redis]") {
  auto server = sluice_test::server_or_skip({}, {"--requirepass", "s3cret"});
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    sluice::redis::options admin_o;
    admin_o.port = static_cast<std::uint16_t>(server.port());
    admin_o.password = "s3cret";
    auto admin = co_await sluice::redis::connect(ex, admin_o);
    co_await admin->execute("ACL", "SETUSER", "svc", "on", ">pw2", "~*", "&*", "+@all");
    sluice::redis::options o = admin_o;
    o.user = "svc";
    o.password = "pw2";
    o.db = 3;
    auto c = co_await sluice::redis::connect(ex, o);
    auto info = [&]() -> asio::awaitable<std::string> {
      co_return (co_await c->execute("CLIENT", "INFO")).str;
    };
    {
      const std::string got = co_await info();
      CHECK(got.find("user=svc") != std::string::npos);
      CHECK(got.find(" db=3 ") != std::string::npos);
    }
    for (int round = 0; round < 3; ++round) {
      co_await admin->execute("CLIENT", "KILL", "USER", "svc");
      for (int i = 0; i < 100 && c->is_open(); ++i) co_await sleep_ms(5);
      CHECK_FALSE(c->is_open());
      const std::string got = co_await info();  // reconnects, authenticated, in db 3
      CHECK(got.find("user=svc") != std::string::npos);
      CHECK(got.find(" db=3 ") != std::string::npos);
    }
    // connect_again (a semaphore's pub/sub connection) authenticates too.
    auto c2 = co_await c->connect_again();
    {
      const std::string got = (co_await c2->execute("CLIENT", "INFO")).str;
      CHECK(got.find("user=svc") != std::string::npos);
    }
    // A wrong password is a clear error, not a hang.
    sluice::redis::options bad = o;
    bad.password = "wrong";
    const auto ec = co_await sluice_test::error_of(sluice::redis::connect(ex, bad));
    CHECK(ec == sluice::redis::make_error_code(sluice::redis::errc::handshake_failed));
    co_await c2->close();
    co_await c->close();
    co_await admin->close();
  }());
}

TEST_CASE("a stalled server fails the pending calls after command_timeout; then it reconnects",
          "[redis]") {
  auto server = sluice_test::server_or_skip();
  asio::io_context ctx;
  run_for(ctx, [&]() -> asio::awaitable<void> {
    sluice::redis::options o;
    o.port = static_cast<std::uint16_t>(server.port());
    o.command_timeout = 300ms;
    auto c = co_await sluice::redis::connect(co_await asio::this_coro::executor, o);
    co_await c->execute("SET", "k", "v");
    server.pause();  // SIGSTOP: the socket stays open, nothing answers
    const auto start = std::chrono::steady_clock::now();
    const auto ec = co_await sluice_test::error_of(c->execute("GET", "k"));
    const auto waited = std::chrono::steady_clock::now() - start;
    server.resume();
    CHECK(ec == sluice::redis::make_error_code(sluice::redis::errc::timed_out));
    CHECK(waited < 5s);  // a hang would be TCP's minutes
    CHECK(c->pending() == 0);
    const auto r = co_await c->execute("GET", "k");  // a new socket
    CHECK(r.str == "v");
    co_await c->close();
  }());
}
