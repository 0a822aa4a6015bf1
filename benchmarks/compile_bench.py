#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""make compile-bench: what sluice costs at every compile, as ratios to Asio alone.

  python3 benchmarks/compile_bench.py [--compilers g++,clang++] [--opts=-O0,-O2]
                                      [--rounds 3] [--rows empty,fanout] [--tus ...]
                                      [--include DIR] [--against DIR]
                                      [--json FILE] [--check]

Compiles each translation unit of benchmarks/compile/ (`-c`, C++20, standalone
Asio, the flags the sluice::sluice target gives a consumer) with every compiler
at every optimisation level, `--rounds` times, and prints the median of each and
the ratio of each sluice TU to its Asio-only twin:

  sluice_empty   `#include <sluice/sluice.hpp>` + an empty io_context
                 against asio_empty (`#include <asio.hpp>` + the same); target <= 1.25x
  sluice_fanout  10 tasks through gather_with_concurrency, a semaphore and
                 for_each(map_unordered), each from its own header,
                 against asio_fanout (the same 10 tasks awaited in a loop); target <= 1.5x

Each sluice TU is compiled twice: header-only (the default) and, as
`<name>+sep`, with SLUICE_SEPARATE_COMPILATION (sluice's type-independent
machinery compiled once per program, by <sluice/src.hpp>, instead of in every
TU). The once-per-program TU is measured too (`sluice_src`, no ratio), and
the targets are checked on both.

--rows measures only the named rows (a row is a sluice TU and its Asio-only
twin: `--rows fanout` compiles sluice_fanout and asio_fanout); --tus names TUs
one by one. The default (every row, both compilers, both levels, 3 rounds) is
48 compiles: about 5 minutes of CPU on an idle machine.

The figure is CPU time (user + sys) of the compiler driver and its children
(cc1plus, as), read with os.wait4, not wall time: the machine may be shared, and
another process's compile slows a wall clock but not this one. The variants are
interleaved (every round compiles every TU once, in a shuffled order), so a
change in the machine's load falls on all of them alike. --check exits 1 when a
target is missed. --against DIR also compiles the sluice TUs against the
headers in DIR (say, a checkout of main: `git worktree add /tmp/main main`,
then `--against /tmp/main/include`), interleaved with the rest: a change's
before and after in one run.
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TUS = os.path.join(ROOT, "benchmarks", "compile")
# (sluice TU, its Asio-only baseline, target ratio)
PAIRS = [("sluice_empty", "asio_empty", 1.25), ("sluice_fanout", "asio_fanout", 1.5)]
SEP = "+sep"  # a sluice TU compiled with SLUICE_SEPARATE_COMPILATION
PAIRS = PAIRS + [(s + SEP, b, t) for s, b, t in PAIRS]
SRC = "sluice_src"  # <sluice/src.hpp>: compiled once per program in that mode
# What the sluice::sluice target defines for a consumer (clang with libstdc++ needs
# the two for Asio 1.22's coroutines; sluice/config.hpp would define them too).
FLAGS = ["-std=c++20", "-DASIO_HAS_CO_AWAIT=1", "-DASIO_HAS_STD_COROUTINE=1"]


def cpu_seconds(cmd):
    """Runs cmd; returns the user + sys seconds of it and its children."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"compile failed: {' '.join(cmd)}\n{err}")
    return usage.ru_utime + usage.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compilers", default="g++,clang++")
    ap.add_argument("--opts", default="-O0,-O2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rows", help="comma-separated rows: empty, fanout (default: every row)")
    ap.add_argument("--tus", help="comma-separated TU names (default: every pair)")
    ap.add_argument("--include", default=os.path.join(ROOT, "include"),
                    help="sluice's include directory (default: this tree's)")
    ap.add_argument("--against", help="also compile the sluice TUs against this include directory")
    ap.add_argument("--json", help="write every sample here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    a = ap.parse_args()

    compilers = a.compilers.split(",")
    opts = a.opts.split(",")
    if a.rows:
        rows = a.rows.split(",")
        unknown = [r for r in rows if "sluice_" + r not in [p[0] for p in PAIRS]]
        if unknown:
            sys.exit(f"unknown row(s) {unknown}: the rows are "
                     + ", ".join(p[0][len("sluice_"):] for p in PAIRS))
        tus = [t for p in PAIRS if p[0][len("sluice_"):].removesuffix(SEP) in rows
               for t in p[:2]]
    else:
        tus = a.tus.split(",") if a.tus else [t for p in PAIRS for t in p[:2]] + [SRC]
    tus = list(dict.fromkeys(tus))
    includes = {t: a.include for t in tus}
    if a.against:
        for t in [t for t in tus if t.startswith("sluice_")]:
            includes[t + "@against"] = a.against
        tus = list(includes)
    cells = [(c, o, t) for c in compilers for o in opts for t in tus]
    samples = {cell: [] for cell in cells}
    out = "/dev/null"
    start = time.monotonic()
    rng = random.Random(1)
    for r in range(a.rounds):
        order = cells[:]
        rng.shuffle(order)
        for c, o, t in order:
            name = t.split("@")[0]
            extra = []
            if name.endswith(SEP) or name == SRC:
                extra = ["-DSLUICE_SEPARATE_COMPILATION"]
                name = name.removesuffix(SEP)
            src = os.path.join(TUS, name + ".cpp")
            cmd = [c, *FLAGS, *extra, "-I" + includes[t], o, "-c", src, "-o", out]
            samples[(c, o, t)].append(cpu_seconds(cmd))
        print(f"round {r + 1}/{a.rounds} done ({time.monotonic() - start:.0f} s)", file=sys.stderr)
        if a.json:  # after every round: an interrupted run keeps what it measured
            with open(a.json, "w") as f:
                json.dump({"rounds_done": r + 1, "load": os.getloadavg()[0],
                           "samples": {" ".join(k): v for k, v in samples.items()}}, f, indent=1)

    med = {cell: statistics.median(v) for cell, v in samples.items()}
    load = os.getloadavg()[0]
    print(f"Compile cost: CPU seconds (user + sys of the compiler and its children, not wall "
          f"time), median of {a.rounds}, variants interleaved; load average {load:.1f} on "
          f"{os.cpu_count()} cores; {time.monotonic() - start:.0f} s in all.")
    print()
    print("| TU | " + " | ".join(f"{c} {o}" for c in compilers for o in opts) + " |")
    print("|---|" + "---|" * (len(compilers) * len(opts)))
    for t in tus:
        print(f"| {t} | " + " | ".join(f"{med[(c, o, t)]:.2f} s" for c in compilers
                                       for o in opts) + " |")
    if a.against:
        print(f"\n@against: the headers of {a.against}; without: {a.include}\n")
    missed = []
    pairs = PAIRS + [(s + "@against", b, t) for s, b, t in PAIRS if s + "@against" in tus]
    for s, b, target in pairs:
        if s not in tus or b not in tus:
            continue
        ratios = []
        for c in compilers:
            for o in opts:
                x = med[(c, o, s)] / med[(c, o, b)]
                ratios.append(f"{x:.2f}x")
                if x > target and "@" not in s:
                    missed.append(f"{s} / {b} {c} {o}: {x:.2f}x > {target}x")
        print(f"| **{s} / {b}** (target <= {target}x) | " + " | ".join(ratios) + " |")
    print()
    print("every target met" if not missed else "missed: " + "; ".join(missed))
    return 1 if a.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
