#!/usr/bin/env python3
"""Plot a bench/run.sh sweep: req/s and p50 latency vs concurrency, per target.

usage: plot.py sweep.jsonl out.png

One row per (mode, streaming); colour = target, line style = prompt size.
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLES = ["-", "--", ":", "-."]


def main(src, dst):
    rows = [json.loads(line) for line in open(src) if line.strip()]
    if not rows:
        sys.exit("no results in " + src)
    panels = sorted({(r["mode"], r["stream"]) for r in rows})
    targets = list(dict.fromkeys(r["target"] for r in rows))
    sizes = sorted({round(r["prompt_bytes"] / 1024) for r in rows})
    colours = {t: f"C{i}" for i, t in enumerate(targets)}
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.6 * len(panels)), squeeze=False)
    for row, (mode, stream) in enumerate(panels):
        series = defaultdict(list)
        for r in rows:
            if (r["mode"], r["stream"]) == (mode, stream):
                series[(r["target"], round(r["prompt_bytes"] / 1024))].append(r)
        for (target, kb), pts in sorted(series.items()):
            pts.sort(key=lambda r: r["concurrency"])
            c = [p["concurrency"] for p in pts]
            style = dict(color=colours[target], linestyle=STYLES[sizes.index(kb) % len(STYLES)], marker="o")
            label = f"{target} {kb} KB"
            axes[row][0].plot(c, [p["rps"] for p in pts], label=label, **style)
            axes[row][1].plot(c, [p["p50_ms"] or 0 for p in pts], label=label, **style)
        title = f"{mode}, {'streaming' if stream else 'non-streaming'}"
        axes[row][0].set_title(f"{title}: requests/s")
        axes[row][1].set_title(f"{title}: p50 latency (ms)")
        for ax in axes[row]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.grid(True, alpha=0.3)
        axes[row][0].set_yscale("log")
        axes[row][1].set_yscale("log")
        axes[row][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=90)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
