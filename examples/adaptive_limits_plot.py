#!/usr/bin/env python3
# SPDX-License-Identifier: BSL-1.0
"""Plots the limit over time against the provider's capacity.

  python3 examples/adaptive_limits_plot.py LIMITS.csv OUT   (writes OUT.png and OUT.svg)

LIMITS.csv comes from `adaptive_limits --csv LIMITS.csv` (one row per second:
t, capacity, then one column per adaptive run). `make adaptive-docs` runs both.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    plt.rcParams["svg.hashsalt"] = "sluice"  # reproducible ids: the SVG changes only with the data
    src, out = sys.argv[1], sys.argv[2]
    with open(src, newline="") as f:
        rows = list(csv.DictReader(f))
    names = [k for k in rows[0].keys() if k not in ("t", "capacity")]
    t = [float(r["t"]) for r in rows]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.step(t, [int(r["capacity"]) for r in rows], where="post", color="black", lw=2.2,
            label="provider capacity (oracle)")
    styles = ["-", "--", ":", "-."]
    for i, name in enumerate(names):
        pts = [(x, int(r[name])) for x, r in zip(t, rows) if r[name] != ""]
        ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", lw=1.2,
                ls=styles[i % len(styles)], label=name.replace("adaptive: ", ""))
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("calls in flight allowed")
    ax.set_ylim(0, 15)
    ax.set_title("adaptive_limit: the limit (sampled each second) against the capacity")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{out}.{ext}", dpi=110, metadata={"Date": None} if ext == "svg" else None)


if __name__ == "__main__":
    main()
