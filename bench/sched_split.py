#!/usr/bin/env python3
"""bench/sched_split.py — used by sched.sh: per request, the tracepoints counted in
DIR/NAME-events.data and the kernel's samples in DIR/NAME-samples.data (split by the system
call they fell in), each divided by the requests of its load (DIR/NAME-KIND.requests), for each
NAME, side by side.

  sched_split.py FREQ DIR NAME…"""
import collections
import re
import subprocess
import sys


def perf_script(path, fields):
    return subprocess.run(
        ["perf", "script", "-i", path, "-F", fields], capture_output=True, text=True, check=True
    ).stdout


def events(path):
    """Counts of each tracepoint; context switches split by the state the thread left in."""
    counts = collections.Counter()
    for line in perf_script(path, "event,trace").splitlines():
        m = re.match(r"\s*(\S+):\s*(.*)", line)
        if not m:
            continue
        event, trace = m.group(1), m.group(2)
        if event == "sched:sched_switch":
            state = re.search(r"prev_state=(\S+)", trace)
            runnable = state is not None and state.group(1).startswith("R")
            event += " (preempted)" if runnable else " (asleep)"
        counts[event] += 1
    return counts


FRAME = re.compile(r"\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)$")


def kernel_split(path):
    """Samples: user space, or the kernel by system call (or the switch back to a thread that
    was preempted, or an interrupt)."""
    split = collections.Counter()
    for block in perf_script(path, "ip,sym,dso").split("\n\n"):
        frames = [m.groups() for m in map(FRAME.match, block.splitlines()) if m]
        if not frames:
            continue
        if "kernel" not in frames[0][1]:
            split["user space"] += 1
            continue
        syms = [s for s, _ in frames]
        call = next((s for s in syms if s.startswith(("__x64_sys_", "__do_sys_"))), None)
        if call:
            where = "kernel: " + re.sub(r"^__(x64|do)_sys_", "", call)
        elif any("schedule" in s for s in syms) and any("exit_to_user" in s for s in syms):
            where = "kernel: preempted, switched back at return to user"
        else:
            where = "kernel: interrupts, other"
        split[where] += 1
    return split


def main(freq, data, names):
    freq = float(freq)
    per_req = {}
    rows = collections.OrderedDict()
    for name in names:
        reqs = {k: int(open(f"{data}/{name}-{k}.requests").read()) for k in ("events", "samples")}
        ev = events(f"{data}/{name}-events.data")
        ks = kernel_split(f"{data}/{name}-samples.data")
        per_req[name] = {}
        for k, v in sorted(ev.items()):
            per_req[name][("count", k)] = v / reqs["events"]
        for k, v in ks.items():
            per_req[name][("µs", k)] = v / freq / reqs["samples"] * 1e6
        per_req[name][("µs", "total")] = sum(ks.values()) / freq / reqs["samples"] * 1e6
        for key in per_req[name]:
            rows[key] = None
    base, last = names[0], names[-1]
    print(f"| per request | {' | '.join(names)} | {last} − {base} |")
    print("|---|" + "---:|" * (len(names) + 1))
    order = sorted(rows, key=lambda k: (k[0] != "count", k[1] == "total", -per_req[last].get(k, 0)))
    for key in order:
        vals = [per_req[n].get(key, 0.0) for n in names]
        if key[1] != "total" and max(vals) < (0.001 if key[0] == "count" else 0.05):
            continue
        fmt = "{:.3f}" if key[0] == "count" else "{:.1f}"
        label = key[1] if key[0] == "count" else f"{key[1]} (µs of CPU)"
        if key[1] == "total":
            label = "**total (µs of CPU)**"
        diff = vals[-1] - vals[0]
        print(f"| {label} | {' | '.join(fmt.format(v) for v in vals)} | {'+' if diff >= 0 else ''}{fmt.format(diff)} |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
