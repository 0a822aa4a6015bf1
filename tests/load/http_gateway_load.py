#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""The HTTP gateway under real load (CTest `http_gateway_load`).

  python3 tests/load/http_gateway_load.py --gateway build/gcc/examples/http_gateway \
      --provider build/gcc/examples/slow_server [--seconds 5] [--connections 64]

Starts examples/slow_server on a free loopback port (it answers THROTTLED to
more than --cap calls at once and to a second call for a key already in
flight), starts examples/http_gateway in front of it (4 threads, sessions on
strands, the limits shared through sluice::strand_bound), and drives the
gateway with wrk (Debian `wrk`): --connections keep-alive connections over 2
wrk threads for --seconds, each request for one of 100 keys and one of 32
users. Bounded in time (wrk's duration; every wait has a deadline).

Asserts what the provider counted on its side: zero throttles, at most --cap
calls in flight, no two calls for one key at once (single-flight held across
threads); and that the gateway answered. Reports requests/s, p50/p99 latency,
the answers by status, and the gateway's open descriptors and RSS before and
after. Exits 77 (skipped) when wrk is not installed or a server cannot start.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

SKIP = 77

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


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def provider_stats(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"STATS\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", data.decode())}


def stop(proc, seconds=15):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--provider", required=True)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--cap", type=int, default=8)
    ap.add_argument("--rate", type=int, default=5000)
    args = ap.parse_args()

    wrk = shutil.which("wrk")
    if not wrk:
        print("wrk not found (Debian: apt-get install wrk): skipped")
        return SKIP

    tmp = tempfile.mkdtemp(prefix="sluice-gateway-")
    provider_out = os.path.join(tmp, "provider.out")
    gateway_out = os.path.join(tmp, "gateway.out")
    script = os.path.join(tmp, "keys.lua")
    with open(script, "w") as f:
        f.write(LUA)

    provider = subprocess.Popen(
        [args.provider, "--port", "0", "--throttle-above", str(args.cap), "--throttle-per-key", "1"],
        stdout=open(provider_out, "w"), stderr=subprocess.STDOUT)
    gateway = None
    try:
        m = wait_for_line(provider_out, r"serving on 127\.0\.0\.1:(\d+)", provider)
        if not m:
            print("the provider did not start: skipped")
            return SKIP
        provider_port = int(m.group(1))
        gateway_cmd = [args.gateway, "--port", "0", "--provider-port", str(provider_port),
                       "--threads", str(args.threads), "--cap", str(args.cap),
                       "--rate", str(args.rate)]
        gateway = subprocess.Popen(gateway_cmd, stdout=open(gateway_out, "w"),
                                   stderr=subprocess.STDOUT)
        m = wait_for_line(gateway_out, r"listening on 127\.0\.0\.1:(\d+)", gateway)
        if not m:
            print("the gateway did not start: skipped")
            return SKIP
        port = int(m.group(1))
        fds_before, rss_before = fds(gateway.pid), rss_kib(gateway.pid)

        wrk_cmd = [wrk, "-t2", f"-c{args.connections}", f"-d{args.seconds}s", "--latency",
                   "--timeout", "10s", "-s", script, f"http://127.0.0.1:{port}/"]
        out = subprocess.run(wrk_cmd, capture_output=True, text=True,
                             timeout=args.seconds + 60).stdout
        time.sleep(0.5)  # wrk's connections close; the gateway's sessions end
        fds_after, rss_after = fds(gateway.pid), rss_kib(gateway.pid)
        stats = provider_stats(provider_port)
        code = stop(gateway)
        gateway = None
        with open(gateway_out) as f:
            gateway_log = f.read()
    finally:
        if gateway is not None:
            stop(gateway)
        stop(provider)

    def grab(pattern, default="?"):
        m = re.search(pattern, out, re.M)
        return m.group(1) if m else default

    requests = int(grab(r"(\d+) requests in", "0"))
    rps = grab(r"Requests/sec:\s+([\d.]+)")
    p50 = grab(r"^\s+50%\s+(\S+)")
    p99 = grab(r"^\s+99%\s+(\S+)")
    non2xx = int(grab(r"Non-2xx or 3xx responses: (\d+)", "0"))
    errors = grab(r"Socket errors: (.*)$", "none")
    answers = re.search(r"gateway: .*", gateway_log)

    print(" ".join(wrk_cmd))
    print(out.strip())
    print(f"gateway ({' '.join(os.path.basename(a) if i == 0 else a for i, a in enumerate(gateway_cmd))}):"
          f" {answers.group(0) if answers else gateway_log.strip()}; exit {code}")
    print(f"provider: {stats}")
    print(f"RESULT requests={requests} requests_per_s={rps} p50={p50} p99={p99} non2xx={non2xx}"
          f" socket_errors={errors!r} provider_throttled={stats.get('throttled')}"
          f" provider_max_in_flight={stats.get('max_concurrent')} (cap {args.cap})"
          f" provider_collisions={stats.get('collisions')}"
          f" gateway_fds={fds_before}->{fds_after} gateway_rss_kib={rss_before}->{rss_after}")

    failures = []
    if requests == 0:
        failures.append("wrk completed no request")
    if stats.get("throttled") != 0:
        failures.append(f"the provider throttled {stats.get('throttled')} calls")
    if stats.get("max_concurrent", 0) > args.cap:
        failures.append(f"the provider saw {stats.get('max_concurrent')} calls at once (cap {args.cap})")
    if stats.get("collisions") != 0:
        failures.append(f"{stats.get('collisions')} calls for a key already in flight")
    if stats.get("requests", 0) == 0:
        failures.append("the provider saw no call")
    if code != 0:
        failures.append(f"the gateway exited with {code} after SIGTERM")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
