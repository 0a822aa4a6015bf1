# SPDX-License-Identifier: BSL-1.0
"""`make bench-peers`: sluice beside Go, tokio, asyncio and Trio on the same
workloads, built offline from Debian packages, interleaved, checked.

  python3 benchmarks/peers.py [--build build/bench] [--boost-build build/bench-boost]
                              [--out build/bench] [--rounds 5] [--n 100000]
                              [--py-n 20000] [--rss-n 1000000] [--page docs/performance.md]
                              [--readme README.md]

1. Builds the peers into OUT/peers/: benchmarks/peers/go (GO111MODULE=off,
   GOPATH=/usr/share/gocode: golang-go, golang-golang-x-sync-dev) and
   benchmarks/peers/rust (cargo --offline --release with crates-io replaced by
   the directory source /usr/share/cargo/registry: cargo, librust-tokio-dev,
   librust-futures-dev). benchmarks/peers/py_peer.py runs on /usr/bin/python3
   (python3-trio). The C++ program, sluice_peer, is built by the Makefile.
2. Runs every (program, workload, kind) once per round, in a shuffled order
   per round (fixed seed), each in its own process; each program times its
   workload itself in CPU time (process CPU clock) and prints
   {"ns", "sum", "handoffs"}. Every answer is checked: fanout and stream must
   sum to n(n+1)/2, handoff must count n acquisitions; the hand-offs that
   found the other side suspended (a real hand-off to a waiter) are recorded.
   The median over the rounds is kept.
3. Peak RSS: each program's fanout (limit 100, immediate tasks) over
   --rss-n lazy inputs once, the program's own VmHWM (/proc/self/status).
4. Writes OUT/peers.json (report.py folds it into report.json and the ns/task
   plot) and, with --page, the block between <!-- bench-peers:begin --> and
   <!-- bench-peers:end --> of that page (every column); with --readme, the
   same block of the README (sluice, the Asio floor and the other languages).
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "peers")
WORKLOADS = [("fanout", "immediate"), ("fanout", "suspending"), ("stream", "immediate"),
             ("stream", "suspending"), ("handoff", "immediate")]

# column key -> (label, what it runs)
COLUMNS = [
    ("sluice", "sluice", "sluice (Asio 1.22)"),
    ("sluice_next", "sluice_next", "sluice, stream read by `while (co_await s.next())`"),
    ("sluice_unsafe", "sluice", "sluice, `io_context{ASIO_CONCURRENCY_HINT_UNSAFE}`"),
    ("boost_sluice", "sluice", "sluice, Boost.Asio 1.81"),
    ("boost_sluice_unsafe", "sluice", "sluice, Boost.Asio 1.81 + UNSAFE hint"),
    ("floor", "floor", "Asio floor"),
    ("floor_unsafe", "floor", "Asio floor + UNSAFE hint"),
    ("go", "go", "Go errgroup / semaphore.Weighted (P=1)"),
    ("tokio", "tokio", "tokio current_thread"),
    ("asyncio", "asyncio", "asyncio"),
    ("trio", "trio", "Trio"),
]
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def build_peers(out):
    d = os.path.abspath(os.path.join(out, "peers"))
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode", GOFLAGS="",
               GOCACHE=os.path.join(d, "gocache"), GOTOOLCHAIN="local")
    t0 = time.monotonic()
    subprocess.run(["go", "build", "-o", os.path.join(d, "go_peer"), "main.go"],
                   cwd=os.path.join(PEERS, "go"), env=env, check=True)
    print(f"== go build ({time.monotonic() - t0:.0f} s)", flush=True)
    # cargo writes Cargo.lock next to Cargo.toml: build a copy under OUT.
    src = os.path.join(d, "rust")
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(os.path.join(PEERS, "rust"), src)
    home = os.path.join(d, "cargo-home")
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write('[source.crates-io]\nreplace-with = "debian"\n'
                '[source.debian]\ndirectory = "/usr/share/cargo/registry"\n'
                '[net]\noffline = true\n')
    cargo = "/usr/bin/cargo" if os.path.exists("/usr/bin/cargo") else "cargo"
    t0 = time.monotonic()
    subprocess.run([cargo, "build", "--release", "--offline", "--quiet",
                    "--target-dir", os.path.join(d, "target")],
                   cwd=src, env=dict(os.environ, CARGO_HOME=home), check=True)
    print(f"== cargo build ({time.monotonic() - t0:.0f} s)", flush=True)
    with open(os.path.join(src, "Cargo.lock")) as f:
        lock = f.read()
    versions = {}
    for block in lock.split("[[package]]"):
        lines = dict(l.split(" = ", 1) for l in block.strip().splitlines() if " = " in l)
        name = lines.get("name", "").strip('"')
        if name in ("tokio", "futures"):
            versions[name] = lines["version"].strip('"')
    return d, versions


def commands(a, peers_dir):
    cmd = {}
    for col, impl, _ in COLUMNS:
        if col.endswith(("sluice", "sluice_unsafe", "sluice_next")) or col.startswith("floor"):
            build = a.boost_build if col.startswith("boost_") else a.build
            if not build:
                continue
            exe = os.path.join(build, "benchmarks", "sluice_peer")
            if not os.path.exists(exe):
                continue
            extra = ["unsafe"] if col.endswith("unsafe") else []
            cmd[col] = lambda w, k, n, exe=exe, impl=impl, extra=extra: \
                [exe, impl, w, k, str(n)] + extra
        elif col == "go":
            cmd[col] = lambda w, k, n: [os.path.join(peers_dir, "go_peer"), "go", w, k, str(n)]
        elif col == "tokio":
            cmd[col] = lambda w, k, n: [os.path.join(peers_dir, "target", "release",
                                                     "tokio_peer"), "tokio", w, k, str(n)]
        else:
            cmd[col] = lambda w, k, n, lib=col: [PYTHON, os.path.join(PEERS, "py_peer.py"), lib,
                                                 w, k, str(n)]
    return cmd


def run_one(argv, workload, n):
    """Runs one program; returns (answer, peak RSS in KiB: the program's own
    VmHWM, since wait4's ru_maxrss keeps the forking parent's peak across
    exec). Checks the sum."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, env=dict(os.environ, GOMAXPROCS="1"))
    if p.returncode != 0:
        sys.exit(f"{' '.join(argv)}: exit {p.returncode}")
    r = json.loads(p.stdout)
    want = n if workload == "handoff" else n * (n + 1) // 2
    if r["sum"] != want:
        sys.exit(f"{' '.join(argv)}: sum {r['sum']}, expected {want}")
    return r, r["rss_kib"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build/bench")
    ap.add_argument("--boost-build")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--py-n", type=int, default=20_000)
    ap.add_argument("--rss-n", type=int, default=1_000_000)
    ap.add_argument("--page")
    ap.add_argument("--readme")
    a = ap.parse_args()
    t_start = time.monotonic()
    peers_dir, versions = build_peers(a.out)
    cmd = commands(a, peers_dir)
    # sluice_next is the streaming workload read another way: nothing else.
    runs = [(col, w, k) for col in cmd for w, k in WORKLOADS
            if col != "sluice_next" or w == "stream"]
    samples = {}
    rng = random.Random(23)
    for rnd in range(a.rounds):
        rng.shuffle(runs)
        t0 = time.monotonic()
        for col, w, k in runs:
            n = a.py_n if col in ("asyncio", "trio") else a.n
            r, _ = run_one(cmd[col](w, k, n), w, n)
            s = samples.setdefault(f"{col}/{w}/{k}", {"ns": [], "handoffs": [], "n": n})
            s["ns"].append(r["ns"])
            s["handoffs"].append(r["handoffs"])
        print(f"== round {rnd + 1}/{a.rounds} ({time.monotonic() - t0:.0f} s)", flush=True)
    results = {}
    for key, s in samples.items():
        results[key] = {"ns": statistics.median(s["ns"]), "n": s["n"], "samples": s["ns"]}
        if key.split("/")[1] == "handoff":
            results[key]["handoff_fraction"] = min(s["handoffs"]) / s["n"]
    for col in cmd:
        if col == "sluice_next":
            continue
        t0 = time.monotonic()
        _, rss = run_one(cmd[col]("fanout", "immediate", a.rss_n), "fanout", a.rss_n)
        results[f"{col}/rss"] = {"peak_rss_kib": rss, "n": a.rss_n}
        print(f"== {col} peak RSS, {a.rss_n:,} tasks: {rss / 1024:.1f} MiB "
              f"({time.monotonic() - t0:.0f} s)", flush=True)
    go = subprocess.run(["go", "version"], capture_output=True, text=True).stdout.split()
    trio = subprocess.run([PYTHON, "-c", "import trio, sys; print(trio.__version__, "
                           "sys.version.split()[0])"], capture_output=True, text=True).stdout.split()
    context = dict(go=go[2] if len(go) > 2 else None, tokio=versions.get("tokio"),
                   futures=versions.get("futures"), trio=trio[0] if trio else None,
                   python=trio[1] if len(trio) > 1 else None, rounds=a.rounds, n=a.n,
                   py_n=a.py_n, rss_n=a.rss_n, load=os.getloadavg(),
                   seconds=round(time.monotonic() - t_start))
    with open(os.path.join(a.out, "peers.json"), "w") as f:
        json.dump(dict(context=context, results=results), f, indent=1)
    block = table(results, context)
    print(block)
    sys.path.insert(0, HERE)
    from report import rewrite_block
    if a.page:
        rewrite_block(a.page, block, "<!-- bench-peers:begin -->", "<!-- bench-peers:end -->")
    if a.readme:
        rewrite_block(a.readme, table(results, context, README_COLUMNS),
                      "<!-- bench-peers:begin -->", "<!-- bench-peers:end -->")


def fmt(v):
    return "—" if v is None else (f"{v:.1f}" if v < 100 else f"{v:,.0f}")


# The README's table: sluice beside its floor and the other languages.
README_COLUMNS = ("sluice", "floor", "go", "tokio", "asyncio", "trio")


def table(results, ctx, only=None):
    cols = [(c, label) for c, _, label in COLUMNS
            if any(k.startswith(c + "/") for k in results) and (only is None or c in only)]
    rows = [("bounded fan-out (limit 100), immediate tasks (ns/task)", "fanout/immediate"),
            ("bounded fan-out (limit 100), tasks that suspend once (ns/task)", "fanout/suspending"),
            ("streaming unordered (limit 64), immediate (ns/task)", "stream/immediate"),
            ("streaming unordered (limit 64), suspending once (ns/task)", "stream/suspending"),
            ("contended semaphore hand-off (ns/acquisition)", "handoff/immediate")]
    out = [f"Go {ctx['go']} + x/sync, tokio {ctx['tokio']} (futures {ctx['futures']}) "
           f"current_thread, Trio {ctx['trio']}, Python {ctx['python']}; C++ n = {ctx['n']:,}, "
           f"Python n = {ctx['py_n']:,}; CPU-time medians of {ctx['rounds']} shuffled rounds, "
           f"one process per run; load average at the end {ctx['load'][0]:.1f} on "
           f"{os.cpu_count()} cores; `make bench-peers` took {ctx['seconds']} s "
           "(build + runs).", "",
           "| workload | " + " | ".join(l for _, l in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for label, key in rows:
        cells = []
        for c, _ in cols:
            r = results.get(f"{c}/{key}")
            cell = fmt(r["ns"]) if r else "—"
            if r and "handoff_fraction" in r and r["handoff_fraction"] < 0.999:
                cell += f" ({r['handoff_fraction'] * 100:.0f}% real hand-offs)"
            cells.append(cell)
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for c, _ in cols:
        r = results.get(f"{c}/rss")
        cells.append("—" if not r else f"{r['peak_rss_kib'] / 1024:.1f}")
    out.append(f"| peak RSS, {ctx['rss_n']:,} lazy tasks, limit 100 (MiB) | "
               + " | ".join(cells) + " |")
    parts = []
    for k in ("immediate", "suspending"):
        f = results.get(f"floor/stream/{k}")
        a, b = results.get(f"sluice/stream/{k}"), results.get(f"sluice_next/stream/{k}")
        if f and a and b:
            parts.append(f"{k}: `for_each` {a['ns'] / f['ns']:.2f}x, the `next()` loop "
                         f"{b['ns'] / f['ns']:.2f}x")
    h, t = results.get("sluice/handoff/immediate"), results.get("tokio/handoff/immediate")
    if parts:
        out += ["", "Streaming against the Asio floor (the same lazy loop): " + "; ".join(parts)
                + (f". Hand-off, sluice / tokio: {h['ns'] / t['ns']:.2f}x." if h and t else ".")]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
