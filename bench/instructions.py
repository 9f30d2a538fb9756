#!/usr/bin/env python3
"""Instructions per request from callgrind dumps (bench/instructions.sh).

    instructions.py REPORT_ROWS...   each row: NAME STREAM REQUESTS CALLGRIND_FILE

Prints the table of instructions per request (user space only), with what `memcpy`/`memmove`
executed apart (valgrind counts each byte a `rep movsb` moves as one instruction, so that column
is close to bytes copied for the large copies), then the functions whose own instructions per
request differ most between the first two rows of the same STREAM."""
import collections
import re
import sys

COPY = ("__memcpy", "__memmove", "memcpy", "memmove")


def self_costs(path):
    """Own instructions of every function in a callgrind file (`--dump-instr=no`)."""
    names, costs = {}, collections.Counter()
    fn, in_call = None, False
    for line in open(path, errors="replace"):
        if line.startswith("fn="):
            m = re.match(r"\((\d+)\)(?: (.*))?", line[3:].rstrip("\n"))
            if m:
                if m.group(2) is not None:
                    names[m.group(1)] = m.group(2)
                fn = names.get(m.group(1), "?")
            else:
                fn = line[3:].rstrip("\n")
        elif line.startswith("cfn="):
            m = re.match(r"\((\d+)\) (.*)", line[4:].rstrip("\n"))
            if m:
                names[m.group(1)] = m.group(2)
        elif line.startswith("calls="):
            in_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            parts = line.split()
            if len(parts) >= 2 and not in_call:
                costs[fn] += int(parts[1])
            in_call = False
    return costs


def main(args):
    rows = [args[i : i + 4] for i in range(0, len(args), 4)]
    print("| build | stream | requests | instructions / request | of which memcpy/memmove | the rest |")
    print("|---|---|---:|---:|---:|---:|")
    per = {}
    for name, stream, requests, path in rows:
        n = max(int(requests), 1)
        costs = self_costs(path)
        total = sum(costs.values())
        copy = sum(c for f, c in costs.items() if f.startswith(COPY))
        per[(name, stream)] = {f: c / n for f, c in costs.items()}
        print(f"| {name} | {stream} | {n} | {total / n:,.0f} | {copy / n:,.0f} | {(total - copy) / n:,.0f} |")
    streams = collections.OrderedDict((s, [r[0] for r in rows if r[1] == s]) for _, s, _, _ in rows)
    for stream, names in streams.items():
        if len(names) < 2:
            continue
        a, b = per[(names[0], stream)], per[(names[1], stream)]
        diff = sorted(((a.get(f, 0) - b.get(f, 0), f) for f in set(a) | set(b)), key=lambda x: -abs(x[0]))
        print()
        print(f"| stream {stream}: {names[0]} − {names[1]}, largest differences | instructions / request |")
        print("|---|---:|")
        for d, f in diff[:15]:
            f = f.replace("|", "\\|")
            print(f"| `{f[:110]}` | {d:+,.0f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
