#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Plots the request latency distribution with and without a hedge at the p95.

  python3 examples/call_policies_plot.py LATENCY.csv OUT   (writes OUT.png and OUT.svg)

LATENCY.csv comes from `call_policies --csv LATENCY.csv` (one row per request:
request, no_hedge_ms, hedged_ms; virtual time, exact). `make policy-docs` runs both.
"""
import csv
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def quantile(sorted_values, q):
    """Nearest rank, as examples/support/policy_scenarios.hpp computes it."""
    rank = max(1, min(len(sorted_values), math.ceil(q * len(sorted_values))))
    return sorted_values[rank - 1]


def main():
    plt.rcParams["svg.hashsalt"] = "sluice"  # reproducible ids: the SVG changes only with the data
    src, out = sys.argv[1], sys.argv[2]
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for column, label, style in (("no_hedge_ms", "no hedge", "-"),
                                 ("hedged_ms", "hedge at the p95, budget 5%", "--")):
        v = sorted(float(r[column]) for r in rows)
        n = len(v)
        ax.step(v, [(i + 1) / n for i in range(n)], where="post", lw=1.6, ls=style,
                label=f"{label} (p99 {quantile(v, 0.99):.1f} ms)")
    for q in (0.95, 0.99):
        ax.axhline(q, color="grey", lw=0.8, ls=":")
        ax.annotate(f"p{int(q * 100)}", (1, q), xycoords=("axes fraction", "data"),
                    xytext=(-24, -11), textcoords="offset points", fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_xlabel("request latency (ms, virtual time, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0.5, 1.005)
    ax.set_title(f"{len(rows)} requests, each a fan-out of 10 calls; 1% of calls 100x slower")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{out}.{ext}", dpi=110, metadata={"Date": None} if ext == "svg" else None)


if __name__ == "__main__":
    main()
