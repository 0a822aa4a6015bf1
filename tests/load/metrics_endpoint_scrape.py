#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""CTest `metrics_endpoint_scrape`: examples/metrics_endpoint over real HTTP.

  metrics_endpoint_scrape.py PATH/TO/metrics_endpoint [--redis]

Starts the example on a free loopback port (real time), waits for its known
workload to finish, scrapes GET /metrics with curl (Debian curl), and checks
the numbers against the workload: counts only (real time; the durations are
checked exactly by `metrics_endpoint --virtual`). Also checks that the text
parses as Prometheus exposition format (every sample of a declared family)
and that another path is a 404. Exit 77 (skipped) without curl.

--redis (CTest `metrics_endpoint_scrape_redis`): also starts a private
redis-server on a free loopback port (no persistence) and passes it as
--redis-port, then checks the fleet limits' stats as well; exit 77 (skipped)
when no redis-server can be started.
"""
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

DEADLINE_S = 60  # a hang must not pass; the workload takes about 0.5 s

# What the workload does to each limit (see examples/metrics_endpoint.cpp).
EXPECTED = {
    ("sluice_acquired_total", "backend"): 20,
    ("sluice_acquired_total", "per_account"): 20,
    ("sluice_acquired_total", "process_cap"): 20,
    ("sluice_acquired_total", "config"): 2,
    ("sluice_cancelled_total", "config"): 2,
    ("sluice_acquired_total", "rpm"): 5,
    ("sluice_throttled_total", "rpm"): 3,
    ("sluice_acquired_total", "burst"): 3,
    ("sluice_throttled_total", "burst"): 2,
    ("sluice_in_use", "rpm"): 5,
    ("sluice_in_use", "burst"): 3,
    ("sluice_limit", "backend"): 4,
    ("sluice_limit", "config"): 1,
    ("sluice_limit", "rpm"): 5,
    ("sluice_limit", "burst"): 3,
    ("sluice_limit", "process_cap"): 8,
    ("sluice_limit", "per_account"): 1,
    ("sluice_wait_seconds_count", "backend"): 20,
    ("sluice_wait_seconds_count", "per_account"): 20,
    # In real time one permit in 16 of each limit has its hold timed: of 20
    # permits the 1st and the 17th, of the lock's 2 guards the 1st.
    ("sluice_hold_seconds_count", "backend"): 2,
    ("sluice_hold_seconds_count", "process_cap"): 2,
    ("sluice_hold_seconds_count", "per_account"): 2,
    ("sluice_hold_seconds_count", "config"): 1,
    ("sluice_hold_seconds_count", "rpm"): 0,
}
for limit in ("backend", "config", "rpm", "burst", "process_cap", "per_account"):
    EXPECTED[("sluice_waiting", limit)] = 0
for limit in ("backend", "config", "process_cap", "per_account"):
    EXPECTED[("sluice_in_use", limit)] = 0

# With --redis: 4 calls under redis::semaphore{2}, 5 try_acquire()s of a
# redis::rate_limiter{3 per hour}. Every grant's wait and every redis permit's
# hold is timed (no sample: a clock read is nothing beside a round trip).
EXPECTED_REDIS = {
    ("sluice_acquired_total", "fleet_cap"): 4,
    ("sluice_cancelled_total", "fleet_cap"): 0,
    ("sluice_throttled_total", "fleet_cap"): 0,
    ("sluice_waiting", "fleet_cap"): 0,
    ("sluice_in_use", "fleet_cap"): 0,
    ("sluice_limit", "fleet_cap"): 2,
    ("sluice_wait_seconds_count", "fleet_cap"): 4,
    ("sluice_hold_seconds_count", "fleet_cap"): 4,
    ("sluice_acquired_total", "fleet_rpm"): 3,
    ("sluice_throttled_total", "fleet_rpm"): 2,
    ("sluice_waiting", "fleet_rpm"): 0,
    ("sluice_in_use", "fleet_rpm"): 3,
    ("sluice_limit", "fleet_rpm"): 3,
    ("sluice_wait_seconds_count", "fleet_rpm"): 3,
    ("sluice_hold_seconds_count", "fleet_rpm"): 0,
}

SAMPLE = re.compile(r'^([a-z_]+)\{limit="([a-z_]+)"(?:,quantile="([0-9.]+)")?\} (\S+)$')


def parse(text):
    """{(name, limit): value} of the un-quantiled samples; checks the format."""
    families, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            families[name] = kind
            continue
        if line.startswith("# HELP ") or not line:
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a Prometheus sample: {line!r}")
        name, limit, quantile, value = m.groups()
        base = re.sub(r"_(sum|count)$", "", name)
        if name not in families and base not in families:
            raise ValueError(f"sample of an undeclared family: {line!r}")
        float(value)
        if quantile is None:
            samples[(name, limit)] = float(value)
    return samples


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir):
    """A private redis-server on a free loopback port: (process, port), or None."""
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    for _ in range(5):
        port = free_port()
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", workdir],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            if proc.poll() is not None:
                break
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return proc, port
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
    return None


def main():
    args = sys.argv[1:]
    with_redis = "--redis" in args
    args = [a for a in args if a != "--redis"]
    if len(args) != 1:
        sys.exit(__doc__)
    curl = shutil.which("curl")
    if curl is None:
        print("metrics_endpoint_scrape: no curl (Debian: curl); skipped")
        return 77
    if not with_redis:
        return scrape(curl, [args[0]], EXPECTED)
    with tempfile.TemporaryDirectory() as workdir:
        redis = start_redis(workdir)
        if redis is None:
            print("metrics_endpoint_scrape: no redis-server could be started; skipped")
            return 77
        proc, port = redis
        try:
            return scrape(curl, [args[0], "--redis-port", str(port)],
                          {**EXPECTED, **EXPECTED_REDIS})
        finally:
            proc.terminate()
            proc.wait(timeout=DEADLINE_S)


def scrape(curl, command, expected):
    proc = subprocess.Popen(command + ["--port", "0", "--scale", "0.2"],
                            stdout=subprocess.PIPE, text=True)
    lines = []
    done = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.strip())
            if "workload done" in line:
                done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not done.wait(DEADLINE_S) or not any("workload done" in l for l in lines):
            print("metrics_endpoint_scrape: the workload did not finish:", lines)
            return 1
        url = next(re.search(r"(http://\S+)", l).group(1) for l in lines if "listening on" in l)
        text = subprocess.run([curl, "-sS", "--max-time", "20", url], check=True,
                              capture_output=True, text=True).stdout
        samples = parse(text)
        bad = 0
        for key, want in expected.items():
            got = samples.get(key)
            if got != want:
                print(f"metrics_endpoint_scrape: {key[0]}{{limit=\"{key[1]}\"}} = {got}, "
                      f"expected {want}")
                bad += 1
        code = subprocess.run([curl, "-sS", "--max-time", "20", "-o", "/dev/null", "-w",
                               "%{http_code}", url.replace("/metrics", "/other")],
                              check=True, capture_output=True, text=True).stdout
        if code != "404":
            print(f"metrics_endpoint_scrape: GET /other answered {code}, expected 404")
            bad += 1
        print(f"metrics_endpoint_scrape: {len(samples)} samples from {url}, "
              f"{len(expected)} checked, {bad} wrong")
        return 1 if bad else 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            print("metrics_endpoint_scrape: the example did not stop on SIGTERM")
            sys.exit(1)


if __name__ == "__main__":
    sys.exit(main())
