#!/usr/bin/env python3
"""bench/cost_split.py — used by cost-split.sh: a flat `perf report` per target, turned into
µs of CPU per request by where the samples fell (kernel, malloc, Pingora, tokio, pdgate, …),
and the symbols of the last target's excess over the one before it.

  cost_split.py FREQ SECONDS DIR NAME… — reads DIR/NAME.txt (perf report --stdio, fields
  overhead,sample,dso,sym) and DIR/NAME.rps (the load's req/s during the recording)."""
import collections
import re
import sys


def load(path, rps, freq, secs):
    per_request = collections.Counter()
    for line in open(path):
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if not m:
            continue
        samples, dso, kind, sym = int(m.group(1)), m.group(2), m.group(3), m.group(4).strip()
        # One key per symbol whatever binary it is in (the floors are in pdgate-bench).
        where = "libc" if "libc" in dso else dso if dso.startswith("[") else "bin"
        per_request[(kind, where, sym)] += samples / (rps * secs) * 1e6 / freq
    return per_request


# Symbol patterns, first match wins (checked after the kernel, malloc, libc and the clock).
SYMBOL_LAYERS = [
    (r"^<?pdgate::", "pdgate"),
    (r"pingora", "Pingora"),
    (r"tokio", "tokio"),
    (r"pdgate_filters", "pdgate-filters (JSON scan, splice)"),
    (r"pdgate_bench", "the floors' own code"),
    (r"pdgate", "pdgate"),
    (r"\bhttp::|httparse", "http, httparse (heads)"),
    (r"serde_json", "serde_json"),
    (r"prometheus", "prometheus"),
    (r"^<?(core|alloc|std)::", "core, std (inlined futures' polls)"),
]


def category(key):
    kind, where, sym = key
    if kind == "k":
        return "kernel"
    if re.search(r"malloc|free|_int_|tcache|unlink_chunk|consolidate|BlockCache|__rust_(de)?alloc", sym):
        return "malloc family"
    if where == "libc" or sym.startswith("__mem"):
        return "memcpy, memcmp, libc" if "mem" in sym else "libc, other"
    if "vdso" in where:
        return "clock (vdso)"
    for pattern, layer in SYMBOL_LAYERS:
        if re.search(pattern, sym):
            return layer
    return "other crates"


def main():
    freq, secs, d = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    names = sys.argv[4:]
    runs = {n: load(f"{d}/{n}.txt", float(open(f"{d}/{n}.rps").read()), freq, secs) for n in names}
    cats = {n: collections.Counter() for n in names}
    for n, r in runs.items():
        for k, v in r.items():
            cats[n][category(k)] += v
    order = sorted({c for n in names for c in cats[n]}, key=lambda c: -cats[names[-1]][c])
    head = " | ".join(names)
    diffs = [f"{b} − {a}" for a, b in zip(names, names[1:])]
    print(f"| µs of CPU per request (perf samples) | {head} | {' | '.join(diffs)} |")
    print("|---|" + "---:|" * (len(names) + len(diffs)))
    for c in order + ["total"]:
        vals = [sum(cats[n].values()) if c == "total" else cats[n][c] for n in names]
        cells = [f"{v:.1f}" for v in vals] + [f"{b - a:+.1f}" for a, b in zip(vals, vals[1:])]
        label = f"**{c}**" if c == "total" else c
        print(f"| {label} | {' | '.join(cells)} |")
    if len(names) >= 2:
        a, b = runs[names[-2]], runs[names[-1]]
        rows = sorted(((b.get(k, 0) - a.get(k, 0), k) for k in set(a) | set(b)), reverse=True)
        print()
        print(f"| {names[-1]} − {names[-2]}, largest symbols | µs/request | category |")
        print("|---|---:|---|")
        for v, k in rows[:30]:
            sym = k[2].replace("|", "\\|")
            if len(sym) > 110:
                sym = sym[:107] + "…"
            print(f"| `{sym}` | {v:+.2f} | {category(k)} |")


if __name__ == "__main__":
    main()
