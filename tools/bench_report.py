#!/usr/bin/env python3
"""Turns one tools/bench run into tables, a CSV and a chart.

Reads, from the run's directory:
  *_benchmark*.json   Google Benchmark output (median aggregates are used)
  cold_start.jsonl    one JSON line per fresh-process cold-start measurement
  java.jsonl          the seed experiment in Java, when java was present
  skipped.txt         contenders that could not run here, one per line
  extra/*.md          tables from the copy, stream and echo benchmarks

Prints one markdown table per workload with each contender's median and how
many times slower or faster it is than libbufpool in the same run; writes
summary.csv, chart.gp and, when gnuplot is installed, chart.svg.

Usage: tools/bench_report.py RESULTS_DIR
"""
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys

REFERENCE = "libbufpool_buffer"
WORKLOADS = [
    ("Pair", "Hot pair: acquire, write one byte, release (1 thread)", "ns/buffer"),
    ("WorkingSet", "Working set: 1,024 live, released in random order, re-acquired", "ns/buffer"),
    ("Bulk32", "Batches of 32 (bulk API where the contender has one)", "ns/buffer"),
    ("Handoff", "Hand-off: thread A acquires and writes, thread B releases", "ns/buffer"),
    # bench/chain_benchmark.cc; their reference is the contender "libbufpool".
    ("Share", "SharedBuffer copy + destroy vs std::shared_ptr", "ns/op"),
    ("Slice", "SharedBuffer::Slice vs std::shared_ptr aliasing", "ns/op"),
    ("Framing", "Framing: 64 KiB read, 1 KiB frames + 16-byte headers, one gather write", "ns/frame"),
    ("FramingPerFrame", "Framing, one write per frame", "ns/frame"),
]
CHAIN_WORKLOADS = {"Share", "Slice", "Framing", "FramingPerFrame"}


def load_benchmarks(run_dir):
    """{(workload, contender, threads): ns per buffer} from median aggregates."""
    rows = {}
    context = None
    for path in sorted(glob.glob(os.path.join(run_dir, "*benchmark*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:  # an interrupted run
            print(f"bench_report: ignoring {path}: {e}", file=sys.stderr)
            continue
        context = context or data.get("context")
        for b in data["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            parts = b["run_name"].split("/")
            workload, contender = parts[0], parts[1]
            threads = b.get("threads", 1)
            ips = b.get("items_per_second")
            if not ips:
                continue
            rows[(workload, contender, threads)] = 1e9 / ips
    return rows, context


def compare(value, ref):
    if ref is None:
        return ""
    if abs(value - ref) < 1e-12:
        return "reference"
    if value >= ref:
        return f"{value / ref:.1f}x slower"
    return f"{ref / value:.1f}x faster"


def fmt(v):
    return f"{v:,.2f}" if v < 1000 else f"{v:,.0f}"


def table(title, unit, entries, ref_name):
    """entries: {contender: value}; lower is better."""
    out = [f"\n### {title}\n", f"| contender | {unit} | vs libbufpool |", "|---|---:|---|"]
    ref = entries.get(ref_name)
    for name, v in sorted(entries.items(), key=lambda kv: kv[1]):
        out.append(f"| {name} | {fmt(v)} | {compare(v, ref)} |")
    return "\n".join(out)


def main(run_dir):
    rows, context = load_benchmarks(run_dir)
    csv = ["workload,contender,threads,value,unit"]
    text = []
    if context:
        text.append(f"Machine: {context.get('num_cpus')} CPUs at "
                    f"{context.get('mhz_per_cpu')} MHz; run {context.get('date')}.")

    for workload, title, unit in WORKLOADS:
        entries = {c: v for (w, c, t), v in rows.items() if w == workload}
        if not entries:
            continue
        ref = "libbufpool_bulk" if workload == "Bulk32" else REFERENCE
        if workload in CHAIN_WORKLOADS:
            ref = "libbufpool"
        text.append(table(title, unit, entries, ref))
        for c, v in entries.items():
            csv.append(f"{workload},{c},{2 if workload == 'Handoff' else 1},{v:.4f},{unit}")

    # Threads: aggregate throughput at 1, 2 and 8 threads.
    threads = sorted({t for (w, _, t) in rows if w == "Threads"})
    contenders = sorted({c for (w, c, _) in rows if w == "Threads"})
    if contenders:
        text.append("\n### Threads: hot pair on every thread, aggregate "
                    "(ns per buffer across all threads; 8 threads oversubscribe 2 cores)\n")
        head = "| contender | " + " | ".join(f"{t} thr" for t in threads) + \
               " | 2 thr / 1 thr speed-up | 8 thr vs libbufpool |"
        text.append(head)
        text.append("|---|" + "---:|" * len(threads) + "---:|---|")
        ref8 = rows.get(("Threads", REFERENCE, 8))

        def order(c):
            return rows.get(("Threads", c, 8), float("inf"))

        for c in sorted(contenders, key=order):
            vals = [rows.get(("Threads", c, t)) for t in threads]
            one, two = rows.get(("Threads", c, 1)), rows.get(("Threads", c, 2))
            speedup = f"{one / two:.2f}x" if one and two else ""
            eight = rows.get(("Threads", c, 8))
            cells = " | ".join(fmt(v) if v else "" for v in vals)
            text.append(f"| {c} | {cells} | {speedup} | "
                        f"{compare(eight, ref8) if eight else ''} |")
            for t, v in zip(threads, vals):
                if v:
                    csv.append(f"Threads,{c},{t},{v:.4f},ns/buffer")

    text.extend(core_rows(run_dir, rows, csv))

    # Cold start: medians over fresh processes.
    cold = {}
    faults = {}
    cold_path = os.path.join(run_dir, "cold_start.jsonl")
    for path in [cold_path, os.path.join(run_dir, "java.jsonl")]:
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                cold.setdefault(r["contender"], []).append(r["ms"])
                if "minflt_per_buffer" in r:
                    faults.setdefault(r["contender"], []).append(r["minflt_per_buffer"])
    if cold:
        runs = max(len(v) for v in cold.values())
        text.append(f"\n### Cold start: obtain 10,000 buffers of 4 KiB and write each "
                    f"once, in a fresh process (median of {runs} runs)\n")
        text.append("| contender | ms | page faults per buffer | vs libbufpool |")
        text.append("|---|---:|---:|---|")
        ref = statistics.median(cold["libbufpool"]) if "libbufpool" in cold else None
        for c, v in sorted(cold.items(), key=lambda kv: statistics.median(kv[1])):
            m = statistics.median(v)
            flt = f"{statistics.median(faults[c]):.2f}" if c in faults else "n/a"
            text.append(f"| {c} | {m:.2f} | {flt} | {compare(m, ref)} |")
            csv.append(f"ColdStart,{c},1,{m:.4f},ms")

    if any(c.startswith("floor_") for (_, c, _) in rows) or \
            any(c.startswith("floor_") for c in cold):
        text.append("\nRows named floor_* are not allocators but what the "
                    "machine needs without one: floor_plain_stack is a "
                    "per-thread stack with no lock and no checks (the cost of "
                    "touching page-aligned buffers plus a push and a pop); "
                    "floor_kernel_zeroing maps and populates the same huge-page "
                    "region the pool uses, with no pool (the kernel's zeroing "
                    "alone).")

    skipped = os.path.join(run_dir, "skipped.txt")
    if os.path.exists(skipped):
        with open(skipped) as f:
            lines = [l.strip() for l in f if l.strip()]
        if lines:
            text.append("\nSkipped here: " + "; ".join(lines) + ".")

    for extra in sorted(glob.glob(os.path.join(run_dir, "extra", "*.md"))):
        with open(extra) as f:
            text.append("\n" + f.read().rstrip())

    print("\n".join(text))
    with open(os.path.join(run_dir, "summary.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")
    write_chart(run_dir, rows, cold)


def core_rows(run_dir, rows, csv):
    """Many pools per thread, the -fPIC pair and reclaiming (core_benchmark),
    each against its goal."""
    out = []
    one = rows.get(("ManyPools", "libbufpool_1pool", 1))
    exe = rows.get(("SharedObject", "libbufpool_exe", 1))
    lines = []
    for name, label in (("libbufpool_2pools", "2 pools"), ("libbufpool_4pools", "4 pools")):
        v = rows.get(("ManyPools", name, 1))
        if one and v:
            r = v / one
            lines.append(f"| pair alternating {label} vs one pool | {v:.2f} vs {one:.2f} ns "
                         f"| {r:.2f}x | <= 1.3x | {'met' if r <= 1.3 else 'not met'} |")
            csv.append(f"ManyPools,{name},1,{v:.4f},ns/buffer")
    pic = rows.get(("SharedObject", "libbufpool_pic_so", 1))
    if exe and pic:
        r = pic / exe
        lines.append(f"| pair from a -fPIC shared object vs the executable | {pic:.2f} vs "
                     f"{exe:.2f} ns | {r:.2f}x | <= 1.3x | {'met' if r <= 1.3 else 'not met'} |")
        csv.append(f"SharedObject,libbufpool_pic_so,1,{pic:.4f},ns/buffer")
    for path in sorted(glob.glob(os.path.join(run_dir, "core_benchmark_*.json"))):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        for b in data["benchmarks"]:
            if b["run_name"].startswith("Reclaim/") and b.get("aggregate_name") == "median":
                p99, p50 = b.get("p99_us"), b.get("p50_us")
                if p99 is not None:
                    lines.append(f"| Acquire() of a buffer idle in a blocked thread's cache "
                                 f"| p50 {p50:.1f} us, p99 {p99:.1f} us | | p99 <= 50 us "
                                 f"| {'met' if p99 <= 50 else 'not met'} |")
                    csv.append(f"Reclaim,libbufpool,1,{p99:.4f},us_p99")
    if lines:
        out.append("\n### Core: many pools, shared objects, reclaiming\n")
        out.append("| row | measured | ratio | goal | |")
        out.append("|---|---|---:|---|---|")
        out.extend(lines)
    return out


def write_chart(run_dir, rows, cold):
    """Hot pair and cold start as two bar charts in one SVG (log scale)."""
    pair = sorted(((c, v) for (w, c, t), v in rows.items() if w == "Pair"),
                  key=lambda kv: kv[1])
    coldm = sorted(((c, statistics.median(v)) for c, v in cold.items()),
                   key=lambda kv: kv[1])
    if not pair and not coldm:
        return
    data = os.path.join(run_dir, "chart.dat")
    with open(data, "w") as f:
        for c, v in pair:
            f.write(f'"{c}" {v:.4f}\n')
        f.write("\n\n")
        for c, v in coldm:
            f.write(f'"{c}" {v:.4f}\n')
    gp = os.path.join(run_dir, "chart.gp")
    with open(gp, "w") as f:
        f.write(f"""set terminal svg size 1100,900 dynamic font "sans,11"
set output "{os.path.join(run_dir, 'chart.svg')}"
set multiplot layout 2,1
set style fill solid 0.8
set boxwidth 0.7
set logscale y
set grid ytics
set xtics rotate by -35
set key off
set title "Hot pair: ns per acquire + write + release (lower is better, log scale)"
plot "{data}" index 0 using 0:2:xtic(1) with boxes lc rgb "#3060a0"
set title "Cold start: ms to obtain and write 10,000 x 4 KiB in a fresh process (log scale)"
plot "{data}" index 1 using 0:2:xtic(1) with boxes lc rgb "#a05030"
unset multiplot
""")
    if shutil.which("gnuplot"):
        subprocess.run(["gnuplot", gp], check=False)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_report.py RESULTS_DIR")
    main(sys.argv[1])
