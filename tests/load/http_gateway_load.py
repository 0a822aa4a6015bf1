#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""The HTTP gateway under real load, and through a provider outage (CTest `http_gateway_load`).

  python3 tests/load/http_gateway_load.py --gateway build/dev/examples/http_gateway \\
      --provider build/dev/examples/slow_server [--seconds 5] [--connections 64]

Starts examples/slow_server on a free loopback port (it answers THROTTLED to
more than --cap calls at once and to a second call for a key already in
flight, and counts what it sees), starts examples/http_gateway in front of it
(4 threads, sessions on strands, one call policy shared by all), and runs
three phases, asserting counts and orders only (never a duration or a rate):

  load     wrk (Debian `wrk`): --connections keep-alive connections, 100 keys,
           32 users, for --seconds. The provider counts 0 throttles, at most
           --cap calls at once and no two calls for one key at once.
  outage   the provider fails every call (`FAIL 1`) under 8 client threads.
           The breaker opens within its window (the provider's failed calls
           stay within window + cap + queue + one trial per reopening), then
           fails fast: over a stretch in which /metrics shows it open
           throughout, the provider sees no call while the gateway refuses
           calls (`not_permitted` grows, the clients get 503s, each with a
           Retry-After). The provider comes back (`FAIL 0`): the breaker
           closes through half-open (its transitions, printed by the gateway,
           come in the order closed -> open [-> half_open -> open]... ->
           half_open -> closed; /metrics says closed) and the clients get
           200s again.
  short    a second provider, 4 times slower (--short-slower: 20-120 ms), and
           a gateway whose deadline (--short-timeout-ms, 30) is shorter than
           most of its calls, with --short-linger-ms (300): most calls are
           abandoned while the provider still works on them; the provider
           still counts at most --cap at once, 0 throttles and no same-key
           collision (the slots and keys of abandoned calls linger). With
           --short-linger-ms 0 it counts more than --cap and collisions.

Every wait is bounded (wrk's duration; polls give up after 30 s). Exits 77
(skipped) when wrk is not installed or a server cannot start. Prints the
figures (RESULT lines) that docs/threads.md reports.
"""

import argparse
import collections
import http.client
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
POLL_S = 30  # a bound on every wait for a state; a hang must not pass

LUA = """
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/item/key" .. math.random(0, 99) .. "?user=user" .. math.random(0, 31))
end
"""


def wait_for_line(path, pattern, proc, seconds=15):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            return None
        with open(path) as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        time.sleep(0.05)
    return None


def provider_command(port, line):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(line.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode()


def provider_stats(port):
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", provider_command(port, "STATS"))}


def metrics(port):
    """The gateway's /metrics as {(metric, state label or None): value}."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for m in re.finditer(r'^(\w+)\{([^}]*)\} (\S+)$', text, re.M):
        state = re.search(r'state="(\w+)"', m.group(2))
        out[(m.group(1), state.group(1) if state else None)] = float(m.group(3))
    return out


def breaker(m):
    state = next((s for s in ("closed", "open", "half_open")
                  if m.get(("sluice_breaker_state", s)) == 1), "?")
    return (state, int(m.get(("sluice_breaker_opened_total", None), -1)),
            int(m.get(("sluice_breaker_not_permitted_total", None), -1)))


def start(cmd, out, pattern):
    proc = subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT)
    m = wait_for_line(out, pattern, proc)
    return proc, (int(m.group(1)) if m else None)


def stop(proc, seconds=15):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def run_wrk(wrk, script, port, args):
    cmd = [wrk, "-t2", f"-c{args.connections}", f"-d{args.seconds}s", "--latency",
           "--timeout", "10s", "-s", script, f"http://127.0.0.1:{port}/"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.seconds + 60).stdout

    def grab(pattern, default="?"):
        m = re.search(pattern, out, re.M)
        return m.group(1) if m else default

    return {"requests": int(grab(r"(\d+) requests in", "0")),
            "rps": grab(r"Requests/sec:\s+([\d.]+)"), "p50": grab(r"^\s+50%\s+(\S+)"),
            "p99": grab(r"^\s+99%\s+(\S+)"),
            "non2xx": int(grab(r"Non-2xx or 3xx responses: (\d+)", "0"))}


class clients:
    """Client threads that GET items on keep-alive connections until stopped,
    counting the answers by status, in order of arrival."""

    def __init__(self, port, threads=8):
        self.port, self.statuses, self.lock = port, [], threading.Lock()
        self.no_retry_after = 0  # 429s and 503s without a Retry-After header
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self.loop, args=(i,)) for i in range(threads)]
        for t in self.threads:
            t.start()

    def loop(self, seed):
        rnd = random.Random(seed)
        conn = None
        while not self.done.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("GET", f"/item/key{rnd.randrange(100)}?user=user{rnd.randrange(32)}")
                r = conn.getresponse()
                r.read()
                with self.lock:
                    self.statuses.append(r.status)
                    self.no_retry_after += r.status in (429, 503) and not r.getheader("Retry-After")
            except (OSError, http.client.HTTPException):
                conn = None
                time.sleep(0.01)

    def count(self, since=0):
        with self.lock:
            return collections.Counter(self.statuses[since:]), len(self.statuses)

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(timeout=POLL_S)


def poll(what, fn):
    deadline = time.time() + POLL_S
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"not within {POLL_S} s: {what}")


def outage(provider_port, port, args, failures, log_path):
    """The provider fails every call, then comes back."""
    before = provider_stats(provider_port)
    c = clients(port)
    try:
        provider_command(provider_port, "FAIL 1")
        poll("the breaker opens", lambda: breaker(metrics(port))[0] == "open")
        # Fail fast: a stretch in which the breaker is open throughout (same
        # state and same number of openings at both ends), started after the
        # calls admitted before it opened have ended.
        fast = None
        for _ in range(10):
            time.sleep(0.3)
            m1 = metrics(port)
            s1 = provider_stats(provider_port)
            time.sleep(0.5)
            s2 = provider_stats(provider_port)
            m2 = metrics(port)
            b1, b2 = breaker(m1), breaker(m2)
            if b1[0] == b2[0] == "open" and b1[1] == b2[1] and m1.get(("sluice_limit_in_use", None)) == 0:
                fast = (s2["requests"] - s1["requests"], b2[2] - b1[2])
                break
        failing = provider_stats(provider_port)
        provider_command(provider_port, "FAIL 0")
        healed_at = c.count()[1]
        poll("the breaker closes", lambda: breaker(metrics(port))[0] == "closed")
        closed_at = c.count()[1]
        poll("200s after the breaker closed", lambda: c.count(closed_at)[0][200] > 0)
    finally:
        c.stop()
    during, _ = c.count()
    after_heal, _ = c.count(healed_at)
    final = breaker(metrics(port))
    with open(log_path) as f:
        changes = re.findall(r"breaker: (\w+) -> (\w+)", f.read())
    failed = failing["failed"] - before.get("failed", 0)
    reopenings = final[1] - 1
    print(f"RESULT outage: clients {dict(sorted(during.items()))}; provider failed {failed} "
          f"(bound {20 + args.cap + args.queue + reopenings}); breaker opened {final[1]} times, "
          f"transitions {' '.join(f'{a}->{b}' for a, b in changes)}; while open: provider calls "
          f"{fast[0] if fast else '?'}, refused {fast[1] if fast else '?'}; after FAIL 0: "
          f"{after_heal[200]} x 200")
    if final[1] < 1:
        failures.append("the breaker never opened")
    if failed > 20 + args.cap + args.queue + reopenings:
        failures.append(f"the provider failed {failed} calls before the breaker held them off")
    if fast is None:
        failures.append("no stretch with the breaker open throughout was seen")
    elif fast[0] != 0 or fast[1] <= 0:
        failures.append(f"while open the provider saw {fast[0]} calls, {fast[1]} were refused")
    if c.no_retry_after:
        failures.append(f"{c.no_retry_after} answers 429 or 503 came without Retry-After")
    if during[503] == 0 or during[502] == 0:
        failures.append(f"the clients saw no 502 (failure) or no 503 (open): {dict(during)}")
    chained = all(a[1] == b[0] for a, b in zip(changes, changes[1:]))
    allowed = {("closed", "open"), ("open", "half_open"), ("half_open", "open"),
               ("half_open", "closed")}
    if (changes[:1] != [("closed", "open")] or changes[-1:] != [("half_open", "closed")]
            or not chained or not set(changes) <= allowed or final[0] != "closed"):
        failures.append(f"the breaker's transitions are out of order: {changes}, now {final[0]}")

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--provider", required=True)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--cap", type=int, default=8)
    ap.add_argument("--queue", type=int, default=16)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--open-ms", type=int, default=3000)
    ap.add_argument("--short-slower", type=int, default=4)
    ap.add_argument("--short-timeout-ms", type=int, default=30)
    ap.add_argument("--short-linger-ms", type=int, default=300)
    args = ap.parse_args()

    wrk = shutil.which("wrk")
    if not wrk:
        print("wrk not found (Debian: apt-get install wrk): skipped")
        return SKIP

    tmp = tempfile.mkdtemp(prefix="sluice-gateway-")
    script = os.path.join(tmp, "keys.lua")
    with open(script, "w") as f:
        f.write(LUA)
    common = ["--threads", str(args.threads), "--cap", str(args.cap), "--queue", str(args.queue),
              "--rate", str(args.rate)]
    failures = []
    procs = []
    try:
        for phase, slower, extra in (
                ("load", 1, ["--open-ms", str(args.open_ms)]),
                ("short", args.short_slower, ["--timeout-ms", str(args.short_timeout_ms),
                                              "--linger-ms", str(args.short_linger_ms),
                                              "--breaker-calls", "1000000"])):
            provider, provider_port = start(
                [args.provider, "--port", "0", "--throttle-above", str(args.cap),
                 "--throttle-per-key", "1", "--slower", str(slower)],
                os.path.join(tmp, f"provider-{phase}.out"), r"serving on 127\.0\.0\.1:(\d+)")
            procs.append(provider)
            if provider_port is None:
                print("the provider did not start: skipped")
                return SKIP
            log = os.path.join(tmp, f"gateway-{phase}.out")
            cmd = [args.gateway, "--port", "0", "--provider-port", str(provider_port)] + common + extra
            gateway, port = start(cmd, log, r"listening on 127\.0\.0\.1:(\d+)")
            procs.append(gateway)
            if port is None:
                print("the gateway did not start: skipped")
                return SKIP
            w = run_wrk(wrk, script, port, args)
            time.sleep(0.5)  # wrk's connections close; the sessions and lingering slots end
            s = provider_stats(provider_port)
            m = metrics(port)
            print(" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(cmd)))
            print(f"RESULT {phase}: requests={w['requests']} requests_per_s={w['rps']} "
                  f"p50={w['p50']} p99={w['p99']} non2xx={w['non2xx']} "
                  f"provider_calls={s['requests']} "
                  f"timeouts={int(m.get(('sluice_timeout_timeouts_total', None), 0))} "
                  f"shed={int(m.get(('sluice_shed_shed_total', None), 0))} "
                  f"provider_throttled={s['throttled']} provider_max_in_flight={s['max_concurrent']}"
                  f" (cap {args.cap}) provider_collisions={s['collisions']}")
            if w["requests"] == 0 or s["requests"] == 0:
                failures.append(f"{phase}: no request went through")
            if phase == "short" and m.get(("sluice_timeout_timeouts_total", None), 0) == 0:
                failures.append("short: no call timed out (the deadline is not short)")
            if phase == "load":
                outage(provider_port, port, args, failures, log)
            code = stop(gateway)
            if code != 0:
                failures.append(f"{phase}: the gateway exited with {code} after SIGTERM")
            s = provider_stats(provider_port)
            print(f"provider ({phase}): {s}")
            if s["throttled"] != 0:
                failures.append(f"{phase}: the provider throttled {s['throttled']} calls")
            if s["max_concurrent"] > args.cap:
                failures.append(f"{phase}: the provider saw {s['max_concurrent']} calls at once "
                                f"(cap {args.cap})")
            if s["collisions"] != 0:
                failures.append(f"{phase}: {s['collisions']} calls for a key already in flight")
    except AssertionError as e:
        failures.append(str(e))
    finally:
        for p in reversed(procs):
            stop(p)
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
