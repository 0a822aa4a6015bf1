#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""CTest `metrics_endpoint_scrape`: examples/metrics_endpoint over real HTTP.

  metrics_endpoint_scrape.py PATH/TO/metrics_endpoint

Starts the example on a free loopback port (real time), waits for its known
workload to finish, scrapes GET /metrics with curl (Debian curl), and checks
the numbers against the workload: counts only (real time; the durations are
checked exactly by `metrics_endpoint --virtual`). Also checks that the text
parses as Prometheus exposition format (every sample of a declared family)
and that another path is a 404. Exit 77 (skipped) without curl.
"""
import re
import shutil
import signal
import subprocess
import sys
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


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    curl = shutil.which("curl")
    if curl is None:
        print("metrics_endpoint_scrape: no curl (Debian: curl); skipped")
        return 77
    proc = subprocess.Popen([sys.argv[1], "--port", "0", "--scale", "0.2"],
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
        for key, want in EXPECTED.items():
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
              f"{len(EXPECTED)} checked, {bad} wrong")
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
