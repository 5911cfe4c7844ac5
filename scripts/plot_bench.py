#!/usr/bin/python3
"""Draws busbw against message size, one line per library, one panel per rank count, from the
CSV files that run_peers.sh (../shared/peers) and `hvd_bench --csv` write, and prints the
ratios of hvd against each peer. Needs Debian's python3-matplotlib.

    scripts/plot_bench.py RESULTS_DIR [OUT.png]

RESULTS_DIR holds files with the columns label,ranks,bytes,count,iters,median_us,min_us,
algbw_GBps,busbw_GBps,check (several runs of a label are combined by their median).
"""
import csv
import glob
import os
import statistics
import sys
from collections import defaultdict


def load(directory):
    """{ranks: {label: {bytes: median busbw over runs}}} and the same for median_us."""
    bw = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    us = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for path in sorted(glob.glob(os.path.join(directory, "*.csv"))):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    ranks, size = int(row["ranks"]), int(row["bytes"])
                    busbw, median = float(row["busbw_GBps"]), float(row["median_us"])
                except (KeyError, ValueError):
                    continue
                bw[ranks][row["label"]][size].append(busbw)
                us[ranks][row["label"]][size].append(median)
    med = lambda d: {r: {l: {s: statistics.median(v) for s, v in by.items()}
                         for l, by in labels.items()} for r, labels in d.items()}
    return med(bw), med(us)


def human(n):
    for unit in ("", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n}{unit}"
        n //= 1024
    return str(n)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    bw, us = load(sys.argv[1])
    if not bw:
        sys.exit(f"no CSV rows in {sys.argv[1]}")
    for ranks in sorted(bw):
        peers = sorted(l for l in bw[ranks] if not l.startswith("hvd"))
        for mine in sorted(l for l in bw[ranks] if l.startswith("hvd")):
            print(f"{ranks} ranks, {mine}: busbw ratio against each peer (4-byte: time ratio)")
            print("  size    " + "".join(f"{p:>12}" for p in peers))
            for size in sorted(bw[ranks][mine]):
                cells = []
                for p in peers:
                    theirs = bw[ranks][p].get(size)
                    if size <= 4:
                        t_mine, t_theirs = us[ranks][mine][size], us[ranks][p].get(size)
                        cells.append(f"{t_mine:.1f}/{t_theirs:.1f}us" if t_theirs else "-")
                    else:
                        cells.append(f"{bw[ranks][mine][size] / theirs:.2f}x" if theirs else "-")
                print(f"  {human(size):>6}  " + "".join(f"{c:>12}" for c in cells))
    if len(sys.argv) < 3:
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(bw), figsize=(6.5 * len(bw), 4.8), squeeze=False)
    for ax, ranks in zip(axes[0], sorted(bw)):
        for label in sorted(bw[ranks]):
            points = sorted((s, b) for s, b in bw[ranks][label].items() if s >= 1024)
            if points:
                style = "-o" if label.startswith("hvd") else "--."
                ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"allreduce, float32 sum, {ranks} ranks on one host")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
