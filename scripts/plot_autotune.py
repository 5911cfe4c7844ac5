"""Draws an autotune curve from HVD_AUTOTUNE_LOG's CSV: the score (GB/s over the sample's
response lists) of every sample in order, coloured by cycle time and labelled by fusion
threshold, with the setting autotune kept and any hand-picked references as lines.

    /usr/bin/python3 scripts/plot_autotune.py LOG.csv OUT.png [--steps-per-sample N]
        [--reference "fusion off, cycle 0=1.82"] ...

A reference is LABEL=GB/s (a hand-picked setting's rate measured in the same session, e.g. the
busbw hvd_bench prints for it). Uses Debian's python3-matplotlib.
"""

import argparse
import csv

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("log")
    p.add_argument("out")
    p.add_argument("--steps-per-sample", type=int, default=10,
                   help="HVD_AUTOTUNE_STEPS_PER_SAMPLE of the run (x axis in steps)")
    p.add_argument("--reference", action="append", default=[], metavar="LABEL=GBPS")
    args = p.parse_args()

    samples, best = [], None
    with open(args.log) as f:
        for row in csv.DictReader(f):
            entry = (int(row["fusion_threshold_bytes"]), float(row["cycle_time_ms"]),
                     float(row["score_bytes_per_s"]) / 1e9)
            if row["sample"] == "best":
                best = entry
            else:
                samples.append((int(row["sample"]),) + entry)
    if not samples:
        raise SystemExit("no samples in %s" % args.log)

    fig, ax = plt.subplots(figsize=(9, 4.5))
    colors = {}
    for cycle in sorted({s[2] for s in samples}):
        xs = [(s[0] + 1) * args.steps_per_sample for s in samples if s[2] == cycle]
        ys = [s[3] for s in samples if s[2] == cycle]
        line = ax.scatter(xs, ys, label="sample, cycle %g ms" % cycle)
        colors[cycle] = line
    for s in samples:
        fusion = "off" if s[1] == 0 else "%d MiB" % (s[1] >> 20)
        ax.annotate(fusion, ((s[0] + 1) * args.steps_per_sample, s[3]), fontsize=6,
                    xytext=(2, 3), textcoords="offset points")
    end = (len(samples) + 1) * args.steps_per_sample
    if best:
        fusion = "off" if best[0] == 0 else "%d MiB" % (best[0] >> 20)
        ax.axvline(end, color="grey", linestyle=":")
        ax.annotate("kept: fusion %s, cycle %g ms" % (fusion, best[1]), (end, best[2]),
                    fontsize=8, xytext=(-150, 8), textcoords="offset points")
    for ref in args.reference:
        label, value = ref.rsplit("=", 1)
        ax.axhline(float(value), linestyle="--", linewidth=1, label=label)
    ax.set_xlabel("training steps (response lists)")
    ax.set_ylabel("score, GB/s")
    ax.set_ylim(bottom=0)
    ax.set_title("autotune from a poor start: each setting scored twice, the best mean kept")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
