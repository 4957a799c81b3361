#!/usr/bin/env python3
"""Turns one tools/bench run into tables, a CSV and a chart.

Reads, from the run's directory:
  meta.json           date, machine, rounds, whether the run was --quick
  timing.txt          seconds per section of the run
  gb/r<N>/*.json      Google Benchmark output of round N, one file per
                      contender (one process each)
  cold_start.jsonl    one JSON line per fresh-process cold-start measurement
  elastic.jsonl       bench/elastic_pool's lines (create, burst, growth, idle), one
                      of each per round
  channel.jsonl       bench/channel_handoff's lines, one per round (BufferChannel
                      and a socket pair in the same round, interleaved)
  java.jsonl          the seed experiment in Java, when java was present
                      (with the binding's bench/java/SeedPool.java lines)
  java_bench.jsonl    the Java binding's interleaved rounds (bench/java:
                      PairBench, IoBench, ChurnBench), one JSON line per
                      contender per round, with its "workload"
  skipped.txt         contenders that could not run here, one per line
  run_copy_bench/copy_bench.csv, run_echo_bench/echo_bench.json
                      every round of the copy and echo benchmarks
  extra/*.md          the tables the copy, stream and echo scripts print

Every figure is a median over rounds with the lowest and highest round
beside it. A ratio between two contenders is computed round by round (both
ran in the same round) and then its median taken. "Rounds won" counts the
rounds in which libbufpool's row was faster than the peer's best variant
(the variant with the lowest median) in that same round. A goal is met when
the median of its per-round figure meets it; the rounds that meet it on
their own are counted beside it.

Prints markdown on stdout; writes summary.csv, chart.gp and, when gnuplot
is installed, chart.svg.

Usage: tools/bench_report.py RESULTS_DIR
"""
import csv
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

REFERENCE = "libbufpool_buffer"
# (workload, title, unit, reference contender)
WORKLOADS = [
    ("Pair", "Hot pair: acquire, write one byte, release (1 thread)",
     "ns/buffer", REFERENCE),
    ("WorkingSet", "Working set: 1,024 live, released in random order, "
     "re-acquired", "ns/buffer", REFERENCE),
    ("Bulk32", "Batches of 32 (bulk API where the contender has one)",
     "ns/buffer", "libbufpool_bulk"),
    ("Handoff", "Hand-off: thread A acquires and writes, thread B releases",
     "ns/buffer", REFERENCE),
    ("ManyPools", "Hot pair alternating over 1, 2 and 4 pools", "ns/buffer",
     "libbufpool_1pool"),
    ("HolderPair", "Hot pair with holder tracking off, sampled (1 in 128) "
     "and all (bufpool/holders.h)", "ns/buffer", "off"),
    ("SharedObject", "Hot pair called from the executable and from a -fPIC "
     "shared object (64 pairs per call)", "ns/buffer", "libbufpool_exe"),
    ("Reclaim", "Acquire() of a buffer parked in another CPU's cache (a "
     "drain; p99 of 2,000 per round)", "us p99", "libbufpool"),
    ("Share", "SharedBuffer copy + destroy vs std::shared_ptr", "ns/op",
     "libbufpool"),
    ("Slice", "SharedBuffer::Slice vs std::shared_ptr aliasing", "ns/op",
     "libbufpool"),
    ("Framing", "Framing: 64 KiB read, 1 KiB frames + 16-byte headers, one "
     "gather write", "ns/frame", "libbufpool"),
    ("FramingPerFrame", "Framing, one write per frame", "ns/frame",
     "libbufpool"),
    ("LengthFrames", "Length-prefixed frames (4-byte prefix, 1 KiB) cut "
     "from 64 KiB reads, in memory", "ns/frame", "libbufpool"),
    ("Lines", "80-byte lines cut from 64 KiB reads, in memory", "ns/line",
     "libbufpool_foreach"),
    ("ReadLE32", "uint32 loads inside one 4 KiB slice: ChainCursor vs memcpy",
     "ns/load", "libbufpool"),
    ("AppendBudget", "BufferChain::Append of 100 bytes, 41 a turn, then "
     "Consume: a chain bound to a budget vs an unbound one", "ns/append",
     "libbufpool_unbound"),
    ("UringRecvHandling256", "io_uring receive of 256-byte messages (under "
     "copy_below), handling 32 completions only: Take + consume + Refill vs "
     "raw liburing (ring_into: consumed per message, each packed into the "
     "emptied queue; ring_into_pairs: consumed per two, the second copied)",
     "ns/message", "libbufpool_ring_into"),
    ("UringRecvHandling2048", "io_uring receive of 2,048-byte messages (at "
     "or above copy_below), handling 32 completions only: Take + consume + "
     "Refill vs raw liburing (ring_into: consumed per message, each linked "
     "into the emptied queue; raw_liburing_link_floor: raw liburing plus a "
     "pool release and acquire per message)", "ns/message",
     "libbufpool_ring_into"),
    ("UringRecvFull256", "io_uring receive of 256-byte messages, whole turn "
     "(32 sends, io_uring_enter, handling)", "ns/message",
     "libbufpool_ring_into"),
    ("UringRecvFull2048", "io_uring receive of 2,048-byte messages, whole "
     "turn (32 sends, io_uring_enter, handling)", "ns/message",
     "libbufpool_ring_into"),
    ("Trickle", "A 20 KB line received a byte at a time into one chain: pool "
     "bytes pinned per byte held", "bytes/byte",
     "libbufpool_copy_below_512_incremental_on"),
    ("HeldSend", "HeldSend of a 64 KiB chain over TCP loopback: plain vs "
     "zero-copy", "us/send", "plain"),
    ("UringCopy", "1,000 copies of a 64 KiB file, io_uring method, through "
     "a 2 MiB vs a 1 GiB pool", "us/file", "pool_2MiB"),
]
# Families of peers: a libbufpool row wins a round against a family when it
# is faster than that family's best variant in that round.
FAMILIES = ("dpdk", "tcmalloc", "jemalloc", "mimalloc", "glibc", "mmap")


def family(contender):
    """The peer family of a contender; None for libbufpool and floor rows."""
    if contender.startswith(("libbufpool", "floor_")):
        return None
    for f in FAMILIES:
        if contender.startswith(f):
            return f
    return contender


# ---- Loading -----------------------------------------------------------------

def classify(b):
    """(workload, contender, threads, value, counters) of one Google Benchmark
    entry, value in the unit of its workload (lower is better); None if the
    entry carries no figure."""
    name = b["run_name"]
    parts = name.split("/")
    threads = b.get("threads", 1)
    ips = b.get("items_per_second")
    counters = {k: b[k] for k in ("allocs_per_item", "p50_us", "p99_us")
                if k in b}
    args = dict(p.split(":", 1) for p in parts[1:] if ":" in p)
    if parts[0] in ("BM_Ring", "BM_RingInto", "BM_RingIntoPairs",
                    "BM_RingIntoBudget", "BM_RingIntoPairsBudget",
                    "BM_RingVisit", "BM_RingTakeBuffer",
                    "BM_RawLiburing", "BM_RawLiburingCopy",
                    "BM_RawLiburingSwap", "BM_RawLiburingLink"):
        workload = ("UringRecvHandling" if args.get("handling") == "1"
                    else "UringRecvFull") + args.get("bytes", "")
        contender = {"BM_Ring": "libbufpool_ring",
                     "BM_RingInto": "libbufpool_ring_into",
                     "BM_RingIntoPairs": "libbufpool_ring_into_pairs",
                     "BM_RingIntoBudget": "libbufpool_ring_into_budget",
                     "BM_RingIntoPairsBudget":
                         "libbufpool_ring_into_pairs_budget",
                     "BM_RingVisit": "libbufpool_ring_visit",
                     "BM_RingTakeBuffer": "libbufpool_ring_take_buffer",
                     "BM_RawLiburing": "raw_liburing",
                     # Floors: raw liburing plus the least an owning queue
                     # does (uring_ring_benchmark.cc says what).
                     "BM_RawLiburingCopy": "raw_liburing_copy_floor",
                     "BM_RawLiburingSwap": "raw_liburing_swap_floor",
                     "BM_RawLiburingLink": "raw_liburing_link_floor"}[
                         parts[0]]
        return (workload, contender, 1, 1e9 / ips, counters) if ips else None
    if parts[0] == "BM_TrickleLine":
        pinned = b.get("pinned_per_byte")
        contender = (f"libbufpool_copy_below_{args.get('copy_below')}_"
                     "incremental_" +
                     ("on" if args.get("incremental") == "1" else "off"))
        return ("Trickle", contender, 1, pinned, counters) \
            if pinned is not None else None
    if parts[0] == "BM_HeldSend":
        bps = b.get("bytes_per_second")
        contender = "zero_copy" if "zero_copy:1" in name else "plain"
        return ("HeldSend", contender, 1, 65536 / bps * 1e6,
                counters) if bps else None
    if parts[0] == "CopiesThroughSharedPool":
        contender = "pool_1GiB" if parts[1] == "1024" else f"pool_{parts[1]}MiB"
        return ("UringCopy", contender, 1, 1e6 / ips, counters) if ips else None
    if parts[0] == "Reclaim":
        p99 = b.get("p99_us")
        return ("Reclaim", parts[1], 1, p99, counters) if p99 is not None \
            else None
    if len(parts) < 2 or not ips:
        return None
    return parts[0], parts[1], threads, 1e9 / ips, counters


def load_rounds(run_dir):
    """{(workload, contender, threads): {round: value}} and the counters
    {(workload, contender, threads): {round: {name: value}}}."""
    values, counters = {}, {}
    for path in sorted(glob.glob(os.path.join(run_dir, "gb", "r*", "*.json"))):
        m = re.fullmatch(r"r(\d+)", os.path.basename(os.path.dirname(path)))
        if not m:
            continue
        rnd = int(m.group(1))
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:  # an interrupted process
            print(f"bench_report: ignoring {path}: {e}", file=sys.stderr)
            continue
        seen = {}
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" and \
                    b.get("aggregate_name") != "median":
                continue
            got = classify(b)
            if got is None:
                continue
            w, c, t, v, cnt = got
            seen.setdefault((w, c, t), []).append((v, cnt))
        for key, vs in seen.items():
            # Several repetitions in one process: their median.
            values.setdefault(key, {})[rnd] = statistics.median(v for v, _ in vs)
            counters.setdefault(key, {})[rnd] = vs[-1][1]
    return values, counters


def load_cold(run_dir):
    """{contender: {round: ms}}, {contender: {round: faults per buffer}};
    the k-th line of a contender is its round k."""
    cold, faults = {}, {}
    for name in ("cold_start.jsonl", "java.jsonl"):
        path = os.path.join(run_dir, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                runs = cold.setdefault(r["contender"], {})
                rnd = len(runs) + 1
                runs[rnd] = r["ms"]
                if "minflt_per_buffer" in r:
                    faults.setdefault(r["contender"], {})[rnd] = \
                        r["minflt_per_buffer"]
    return cold, faults


def load_elastic(run_dir):
    """{"<contender>.<field>": {round: value}} from elastic.jsonl; the k-th
    line of a contender is its round k."""
    return load_jsonl_rounds(run_dir, "elastic.jsonl")


def load_jsonl_rounds(run_dir, name):
    """{"<contender>.<field>": {round: value}} from the JSON lines of `name`;
    the k-th line of a contender is its round k."""
    out, seen = {}, {}
    path = os.path.join(run_dir, name)
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            c = r.pop("contender")
            seen[c] = seen.get(c, 0) + 1
            for k, v in r.items():
                if isinstance(v, (int, float)):
                    out.setdefault(f"{c}.{k}", {})[seen[c]] = v
    return out


def load_copy(run_dir):
    """{contender: {round: seconds}} from run_copy_bench's copy_bench.csv."""
    path = os.path.join(run_dir, "run_copy_bench", "copy_bench.csv")
    out = {}
    if os.path.exists(path):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                out.setdefault(row["contender"], {})[int(row["round"])] = \
                    float(row["seconds"])
    return out


def load_echo(run_dir):
    """{(engine, message bytes): {round: run}} from echo_bench.json."""
    path = os.path.join(run_dir, "run_echo_bench", "echo_bench.json")
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            data = json.load(f)
        for m in data.get("runs", []):
            out.setdefault((m["engine"], m["message_bytes"]), {})[m["round"]] = m
    return out


def load_java(run_dir):
    """{(workload, contender): {round: value}} from java_bench.jsonl: ns per
    pair, ms per 10,000 buffers, seconds per copy or record run; churn lines
    as {(\"churn\", contender): {1: the line}}."""
    path = os.path.join(run_dir, "java_bench.jsonl")
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            w, c = r["workload"], r["contender"]
            runs = out.setdefault((w, c), {})
            rnd = r.get("round", len(runs) + 1)
            if w == "churn":
                runs[rnd] = r
            else:
                runs[rnd] = r.get("ns", r.get("ms", r.get("seconds")))
    return out


JAVA_TABLES = [
    ("pair", "Java: acquire + write one byte + release, one thread, in one "
     "JVM (the thread's CPU time)", "ns/pair", "java_bufpool_pair"),
    ("seed10k", "Java: obtain 10,000 buffers of 4 KiB and write each once, "
     "warm JVM (the thread's CPU time)", "ms", "java_seed10k_bufpool_bulk"),
    ("copy", "Java: copy a 512 MiB file in the page cache", "s",
     "java_files_copy"),
    ("records", "Java: write and read back records field by field", "s",
     "java_records_data_stream"),
]


def java_tables(java):
    """Markdown for the Java binding's rows, one table per workload."""
    out = []
    for w, title, unit, ref in JAVA_TABLES:
        entries = {c: v for (ww, c), v in java.items() if ww == w}
        if not entries:
            continue
        out.extend(workload_table(title, unit, entries, ref, {}))
    for (w, c), runs in sorted(java.items()):
        if w != "churn":
            continue
        for r in runs.values():
            out.append(f"\n{c}: {r['threads']} threads for {r['seconds']} s "
                       f"({r['pairs']:,} buffers), region {r['region_mib']} "
                       f"MiB: VmRSS {r['rss_start_mib']} MiB after warm-up, "
                       f"{r['rss_end_mib']} MiB at the end (most "
                       f"{r['rss_max_mib']}), growth {r['rss_growth_mib']} "
                       f"MiB; {r['leaks']} leak(s).")
    return out


def java_goals(java, cold):
    """The Java binding's goal rows (issue 60)."""
    g = []
    J = lambda w, c: java.get((w, c), {})
    div = lambda a, b: a / b
    pair = J("pair", "java_bufpool_pair")
    g.append(goal("Java acquire + release pair <= 30 ns (java_bufpool_pair)",
                  pair, 30, True))
    g.append(goal("Java pair >= 2x faster than Netty's pooled direct pair",
                  per_round(J("pair", "java_netty_pooled_pair"), pair, div),
                  2, False))
    each = J("seed10k", "java_seed10k_allocateDirect_each")
    sliced = J("seed10k", "java_seed10k_allocateDirect_sliced")
    bulk = J("seed10k", "java_seed10k_bufpool_bulk")
    g.append(goal("10,000 buffers from the pool >= 100x faster than 10,000 "
                  "allocateDirect (warm JVM)", per_round(each, bulk, div),
                  100, False))
    g.append(goal("10,000 buffers from the pool faster than one allocation "
                  "sliced (warm JVM, time ratio)", per_round(sliced, bulk, div),
                  1 + 1e-9, False))
    fresh = cold.get("java_bufpool_bulk", {})
    if fresh:
        g.append(goal("10,000 buffers from the pool >= 100x faster than 10,000 "
                      "allocateDirect (fresh JVM)",
                      per_round(cold.get("java_allocateDirect_each", {}), fresh,
                                div), 100, False))
        g.append(goal("10,000 buffers from the pool faster than one allocation "
                      "sliced (fresh JVM, time ratio)",
                      per_round(cold.get("java_allocateDirect_sliced", {}),
                                fresh, div), 1 + 1e-9, False))
    files = J("copy", "java_files_copy")
    for m in ("transfer_to", "read_write"):
        g.append(goal(f"the binding's copy ({m}) >= 1.0x the speed of "
                      f"java.nio.file.Files.copy",
                      per_round(files, J("copy", f"java_bufpool_copy_{m}"),
                                div), 1.0, False))
    churn = J("churn", "java_bufpool_churn")
    if churn:
        g.append(goal("Java churn on 8 threads: resident memory growth <= "
                      "4 MiB (MiB)",
                      {r: v["rss_growth_mib"] for r, v in churn.items()},
                      4, True))
    return [x for x in g if x]


# ---- Round arithmetic ----------------------------------------------------------

def summary(by_round):
    """(median, min, max, rounds) of {round: value}."""
    v = list(by_round.values())
    return statistics.median(v), min(v), max(v), len(v)


def per_round(a, b, f):
    """{round: f(a[round], b[round])} over the rounds both have."""
    return {r: f(a[r], b[r]) for r in sorted(a) if r in b}


def best_variant(entries, fam):
    """The name of the variant of family `fam` with the lowest median."""
    names = [c for c in entries if family(c) == fam]
    return min(names, key=lambda c: summary(entries[c])[0]) if names else None


def rounds_won(ours, theirs):
    """(rounds in which ours < theirs, rounds both ran)."""
    pairs = per_round(ours, theirs, lambda a, b: a < b)
    return sum(pairs.values()), len(pairs)


def goal(label, by_round, target, at_most):
    """One goal row: {label, median, lo, hi, meeting, rounds, met}.

    target None: a figure reported beside the goals, with none of its own
    (meeting and met are None)."""
    if not by_round:
        return None
    med, lo, hi, n = summary(by_round)
    if target is None:
        return {"label": label, "median": med, "lo": lo, "hi": hi,
                "meeting": None, "rounds": n, "met": None}
    ok = (lambda v: v <= target) if at_most else (lambda v: v >= target)
    return {"label": label, "median": med, "lo": lo, "hi": hi,
            "meeting": sum(1 for v in by_round.values() if ok(v)),
            "rounds": n, "met": ok(med)}


# ---- Formatting ----------------------------------------------------------------

def fmt(v):
    if v is None:
        return ""
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}" if abs(v) >= 0.01 or v == 0 else f"{v:.3f}"


def spread(by_round, unit=""):
    med, lo, hi, _ = summary(by_round)
    u = f" {unit}" if unit else ""
    return f"{fmt(med)}{u} ({fmt(lo)}–{fmt(hi)})"


def compare(value, ref):
    if ref is None:
        return ""
    if abs(value - ref) < 1e-12:
        return "reference"
    if value >= ref:
        return f"{value / ref:.1f}x slower"
    return f"{ref / value:.1f}x faster"


def workload_table(title, unit, entries, ref_name, counters):
    """entries: {contender: {round: value}}; lower is better."""
    has_allocs = any("allocs_per_item" in c for cs in counters.values()
                     for c in cs.values())
    head = f"| contender | {unit} (median) | min–max | rounds | vs libbufpool |"
    line = "|---|---:|---:|---:|---|"
    if has_allocs:
        head += " allocs/item |"
        line += "---:|"
    out = [f"\n### {title}\n", head, line]
    ref = summary(entries[ref_name])[0] if ref_name in entries else None
    for c, v in sorted(entries.items(), key=lambda kv: summary(kv[1])[0]):
        med, lo, hi, n = summary(v)
        row = (f"| {c} | {fmt(med)} | {fmt(lo)}–{fmt(hi)} | {n} | "
               f"{compare(med, ref)} |")
        if has_allocs:
            a = [x["allocs_per_item"] for x in counters.get(c, {}).values()
                 if "allocs_per_item" in x]
            row += f" {fmt(statistics.median(a)) if a else ''} |"
        out.append(row)
    out.extend(won_table(entries))
    return out


def won_table(entries):
    """Rounds won by each libbufpool row against each peer family's best."""
    ours = sorted(c for c in entries if c.startswith("libbufpool"))
    fams = []
    for c in sorted(entries, key=lambda c: summary(entries[c])[0]):
        f = family(c)
        if f and f not in fams:
            fams.append(f)
    if not ours or not fams:
        return []
    best = {f: best_variant(entries, f) for f in fams}
    out = ["", "Rounds won (faster than the peer's best variant in the same "
           "round; best variant in brackets):", "",
           "| libbufpool row | " + " | ".join(
               f"{f} [{best[f]}]" if best[f] != f else f for f in fams) + " |",
           "|---|" + "---:|" * len(fams)]
    for c in ours:
        cells = []
        for f in fams:
            won, n = rounds_won(entries[c], entries[best[f]])
            cells.append(f"{won}/{n}")
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    return out


# ---- The report ----------------------------------------------------------------

def headline(values, copy, echo):
    """Rows: (comparison, ours {round: v}, theirs {round: v}, unit,
    lower_is_better)."""
    rows = []
    for w, label in (("Pair", "hot pair"), ("WorkingSet", "working set")):
        entries = {c: v for (wl, c, t), v in values.items() if wl == w}
        if REFERENCE not in entries:
            continue
        for fam, peer in (("dpdk", "DPDK rte_mempool"), ("tcmalloc", "tcmalloc"),
                          ("jemalloc", "jemalloc"), ("mimalloc", "mimalloc"),
                          ("glibc", "glibc")):
            b = best_variant(entries, fam)
            if b:
                rows.append((f"{label}: libbufpool vs {peer} ({b})",
                             entries[REFERENCE], entries[b], "ns", True))
    pairs = [("bufpool-copy auto", "cp", "copy 512 MiB, page cache"),
             ("bufpool-copy auto", "dd bs=128k", "copy 512 MiB, page cache"),
             ("bufpool-copy direct", "dd bs=1M iflag=direct oflag=direct",
              "copy 512 MiB, O_DIRECT"),
             ("tree warm: bufpool-copy -r", "tree warm: cp -r",
              "10,000 4 KiB files, page cache")]
    for ours, theirs, what in pairs:
        if ours in copy and theirs in copy:
            rows.append((f"{what}: {ours} vs {theirs}", copy[ours],
                         copy[theirs], "s", True))
    for size in sorted({s for _, s in echo}):
        base = echo.get(("malloc", size))
        for engine in ("uring", "epoll"):
            if base and (engine, size) in echo:
                rate = lambda runs: {r: m["msgs_per_s"] for r, m in runs.items()}
                rows.append((f"echo {size // 1024} KiB: {engine} engine vs "
                             f"malloc baseline (msgs/s)",
                             rate(echo[(engine, size)]), rate(base), "msgs/s",
                             False))
    return rows


def headline_table(rows):
    out = ["| comparison | libbufpool | peer | libbufpool's speed-up "
           "(median, min–max) | rounds won |", "|---|---:|---:|---:|---:|"]
    for label, ours, theirs, unit, lower in rows:
        # Speed-up > 1: libbufpool faster.
        ratio = per_round(ours, theirs,
                          (lambda a, b: b / a) if lower else (lambda a, b: a / b))
        if not ratio:
            continue
        won = sum(1 for v in ratio.values() if v > 1)
        out.append(f"| {label} | {spread(ours, unit)} | {spread(theirs, unit)} "
                   f"| {spread(ratio)}x | {won}/{len(ratio)} |")
    return out


def goals(values, counters, cold, copy, echo, elastic=None):
    """The goal rows that this run has the figures for."""
    g = []
    V = lambda w, c, t=1: values.get((w, c, t), {})
    div = lambda a, b: a / b
    pair, dpdk = V("Pair", REFERENCE), V("Pair", "dpdk_mempool_cache256")
    g.append(goal("hot pair <= 2 ns (libbufpool_buffer, ns)", pair, 2, True))
    g.append(goal("hot pair >= 3x faster than DPDK's cached pair",
                  per_round(dpdk, pair, div), 3, False))
    g.append(goal("raw pair (TryAcquireRaw + ReleaseRaw) >= 1.5x faster "
                  "than DPDK's cached pair",
                  per_round(dpdk, V("Pair", "libbufpool_raw"), div), 1.5,
                  False))
    g.append(goal("fallback pair (locked caches, glibc.pthread.rseq=0) / "
                  "rseq pair, time ratio",
                  per_round(V("Pair", "libbufpool_fallback"), pair, div),
                  None, True))
    g.append(goal("hot pair per mode: mm_cid (the default where the kernel "
                  "has it), ns", pair, None, True))
    g.append(goal("hot pair per mode: cpu_id (BUFPOOL_RSEQ_INDEX=cpu_id), ns",
                  V("Pair", "libbufpool_cpu_id"), None, True))
    g.append(goal("hot pair per mode: locked (glibc.pthread.rseq=0), ns",
                  V("Pair", "libbufpool_fallback"), None, True))
    g.append(goal("cpu_id pair / default pair <= 1.1 (time ratio)",
                  per_round(V("Pair", "libbufpool_cpu_id"), pair, div), 1.1,
                  True))
    g.append(goal("cpu_id working set / default working set (time ratio)",
                  per_round(V("WorkingSet", "libbufpool_cpu_id"),
                            V("WorkingSet", REFERENCE), div), None, True))
    g.append(goal("working set (1,024 live) >= 1.2x faster than DPDK's "
                  "cached mempool",
                  per_round(V("WorkingSet", "dpdk_mempool_cache256"),
                            V("WorkingSet", REFERENCE), div), 1.2, False))
    g.append(goal("8 threads >= 2x DPDK's cached pair (time ratio at 8 "
                  "threads)",
                  per_round(V("Threads", "dpdk_mempool_cache256", 8),
                            V("Threads", REFERENCE, 8), div), 2, False))
    g.append(goal("cache-off pair no slower than DPDK's ring "
                  "(DPDK ring / cache off)",
                  per_round(V("Pair", "dpdk_mempool_ring"),
                            V("Pair", "libbufpool_cache_off"), div), 1, False))
    g.append(goal("C pair (bufpool_try_acquire + bufpool_release) >= 2x "
                  "faster than DPDK's cached pair",
                  per_round(dpdk, V("Pair", "libbufpool_c"), div), 2, False))
    g.append(goal("bulk 32 <= 0.5 ns per buffer (libbufpool_bulk, ns)",
                  V("Bulk32", "libbufpool_bulk"), 0.5, True))
    # DPDK's default objects are 4,160 bytes apart; the pool's buffers are
    # page-aligned, so every first byte the workloads write falls in the
    # same L1 set. The same contender with 4,096-byte spacing shows what that
    # costs, beside the goals above.
    stride = "dpdk_mempool_cache256_4k_stride"
    g.append(goal("bulk 32: DPDK at 4,096-byte spacing / libbufpool_bulk, "
                  "time ratio",
                  per_round(V("Bulk32", stride),
                            V("Bulk32", "libbufpool_bulk"), div), None, False))
    g.append(goal("working set: DPDK at 4,096-byte spacing / libbufpool, "
                  "time ratio",
                  per_round(V("WorkingSet", stride),
                            V("WorkingSet", REFERENCE), div), None, False))
    g.append(goal("hand-off <= 50 ns per buffer (ns)",
                  V("Handoff", REFERENCE, 2), 50, True))
    g.append(goal("2 threads >= 1.8x one thread's throughput",
                  per_round(V("Threads", REFERENCE, 1),
                            V("Threads", REFERENCE, 2), div), 1.8, False))
    one = V("ManyPools", "libbufpool_1pool")
    for c, label in (("libbufpool_2pools", "2"), ("libbufpool_4pools", "4")):
        g.append(goal(f"pair alternating {label} pools <= 1.3x one pool",
                      per_round(V("ManyPools", c), one, div), 1.3, True))
    # The same loop over floor stacks (no pool): what taking turns between
    # caches in memory costs on this CPU, beside the goals above.
    floor_one = V("ManyPools", "floor_indexed_stack_1pool")
    for label in ("2", "4"):
        g.append(goal(f"floor: alternating {label} stacks / one stack (no "
                      "pool), time ratio",
                      per_round(V("ManyPools",
                                  f"floor_indexed_stack_{label}pools"),
                                floor_one, div), None, True))
    g.append(goal("pair from a -fPIC shared object <= 1.3x the executable",
                  per_round(V("SharedObject", "libbufpool_pic_so"),
                            V("SharedObject", "libbufpool_exe"), div),
                  1.3, True))
    g.append(goal("reclaiming an idle cache: p99 <= 50 us",
                  V("Reclaim", "libbufpool"), 50, True))
    g.append(goal("framing >= 2x the frames/s of std::string",
                  per_round(V("Framing", "std_string"),
                            V("Framing", "libbufpool"), div), 2, False))
    allocs = {r: c["allocs_per_item"] for r, c in
              counters.get(("Framing", "libbufpool", 1), {}).items()
              if "allocs_per_item" in c}
    g.append(goal("framing: 0 heap allocations per frame", allocs, 0, True))
    g.append(goal("length-prefixed frames as views (ForEachFrame) >= 2x "
                  "the std::string way that erases once per read",
                  per_round(V("LengthFrames", "std_string_batch_erase"),
                            V("LengthFrames", "libbufpool_views"), div),
                  2, False))
    g.append(goal("length-prefixed frames as owning chains (Next) >= 1.0x "
                  "the std::string way that erases once per read",
                  per_round(V("LengthFrames", "std_string_batch_erase"),
                            V("LengthFrames", "libbufpool"), div),
                  1.0, False))
    g.append(goal("(the most any splitter could reach: the string way over "
                  "the reads alone)",
                  per_round(V("LengthFrames", "std_string_batch_erase"),
                            V("LengthFrames", "read_only_floor"), div),
                  None, False))
    allocs = {r: c["allocs_per_item"] for r, c in
              counters.get(("LengthFrames", "libbufpool", 1), {}).items()
              if "allocs_per_item" in c}
    g.append(goal("length-prefixed frames: 0 heap allocations per frame",
                  allocs, 0, True))
    g.append(goal("line splitting (ForEachLine) >= 0.8x the lines/s of a "
                  "memchr loop over one buffer",
                  per_round(V("Lines", "memchr_contiguous"),
                            V("Lines", "libbufpool_foreach"), div), 0.8, False))
    g.append(goal("ChainCursor::ReadLE<uint32_t> within 1.5x a memcpy load "
                  "(time ratio)",
                  per_round(V("ReadLE32", "libbufpool"),
                            V("ReadLE32", "memcpy"), div), 1.5, True))
    g.append(goal("ring Take + release + Refill within 5% of raw liburing "
                  "(time ratio, handling only, 2,048 B, a new chain per "
                  "message)",
                  per_round(V("UringRecvHandling2048", "libbufpool_ring"),
                            V("UringRecvHandling2048", "raw_liburing"), div),
                  1.05, True))
    for size, label, target in (
            ("256", "under copy_below (256 B)", 2),
            ("2048", "above copy_below (2,048 B)", 1.5)):
        w = f"UringRecvHandling{size}"
        g.append(goal(f"ring handling {label} <= {target}x raw liburing "
                      "(time ratio, Take into one chain + consume + Refill; "
                      "consumed per message, the emptied queue keeping no "
                      "buffer)",
                      per_round(V(w, "libbufpool_ring_into"),
                                V(w, "raw_liburing"), div), target, True))
        if size == "2048":
            # How far Take() is from the least a queue that keeps no buffer
            # when empty can do: a pool release and acquire per message.
            g.append(goal(f"ring handling {label} <= 1.5x the link floor "
                          "(time ratio, Take into one chain + consume + "
                          "Refill vs raw liburing plus a pool release and "
                          "acquire per message)",
                          per_round(V(w, "libbufpool_ring_into"),
                                    V(w, "raw_liburing_link_floor"), div),
                          1.5, True))
        if size == "256":
            g.append(goal(f"ring handling {label}, two messages per consume "
                          f"(the second copied) <= {target}x raw liburing "
                          "(time ratio)",
                          per_round(V(w, "libbufpool_ring_into_pairs"),
                                    V(w, "raw_liburing"), div), target,
                          True))
        g.append(goal(f"ring handling {label}, in place: Visit + Refill "
                      f"<= {target}x raw liburing (time ratio)",
                      per_round(V(w, "libbufpool_ring_visit"),
                                V(w, "raw_liburing"), div), target, True))
        g.append(goal(f"ring handling {label}, owned as one Buffer: "
                      f"TakeBuffer + Refill <= {target}x raw liburing "
                      "(time ratio)",
                      per_round(V(w, "libbufpool_ring_take_buffer"),
                                V(w, "raw_liburing"), div), target, True))
    # What a budget costs: the same work through a bound chain.
    g.append(goal("a chain bound to a budget: Append within 1.1x an unbound "
                  "chain (time ratio)",
                  per_round(V("AppendBudget", "libbufpool_budget"),
                            V("AppendBudget", "libbufpool_unbound"), div),
                  1.1, True))
    for size, bound, plain in (
            ("256", "libbufpool_ring_into_budget", "libbufpool_ring_into"),
            ("2048", "libbufpool_ring_into_budget", "libbufpool_ring_into"),
            ("256", "libbufpool_ring_into_pairs_budget",
             "libbufpool_ring_into_pairs")):
        w = f"UringRecvHandling{size}"
        g.append(goal(f"a chain bound to a budget: ring handling ({plain}, "
                      f"{size} B) within 1.1x unbound (time ratio)",
                      per_round(V(w, bound), V(w, plain), div), 1.1, True))
    for inc in ("on", "off"):
        g.append(goal(f"trickled 20 KB line: pool bytes pinned per byte held "
                      f"<= 2 (copy_below 512, incremental {inc})",
                      V("Trickle",
                        f"libbufpool_copy_below_512_incremental_{inc}"),
                      2, True))
    g.append(goal("64 KiB copies through a 1 GiB pool within 10% of a 2 MiB "
                  "pool (time ratio)",
                  per_round(V("UringCopy", "pool_1GiB"),
                            V("UringCopy", "pool_2MiB"), div), 1.10, True))
    g.extend(elastic_goals(values, elastic or {}))
    if "libbufpool" in cold:
        g.append(goal("cold start of 10,000 ready buffers <= 5 ms",
                      cold["libbufpool"], 5, True))
        if "glibc_posix_memalign" in cold:
            g.append(goal("cold start >= 20x faster than glibc posix_memalign",
                          per_round(cold["glibc_posix_memalign"],
                                    cold["libbufpool"], div), 20, False))
    speed = lambda a, b: per_round(copy.get(b, {}), copy.get(a, {}), div)
    ddd = "dd bs=1M iflag=direct oflag=direct"
    for ours, theirs, target in (("bufpool-copy auto", "cp", 1),
                                 ("bufpool-copy auto", "dd bs=128k", 1),
                                 ("bufpool-copy readwrite", "dd bs=128k", 1),
                                 ("bufpool-copy uring", "dd bs=128k", 1),
                                 ("bufpool-copy direct", ddd, 2)):
        label = f"{ours} >= {target}x the speed of {theirs}" if target != 1 \
            else f"{ours} at least as fast as {theirs}"
        g.append(goal(label, speed(ours, theirs), target, False))
    if "tree warm: bufpool-copy -r" in copy and "tree warm: cp -r" in copy:
        g.append(goal("bufpool-copy -r >= 1.5x the speed of cp -r (10,000 "
                      "4 KiB files, warm)",
                      speed("tree warm: bufpool-copy -r", "tree warm: cp -r"),
                      1.5, False))
    fio = "fio read (io_uring QD32 128k)"
    g.append(goal("bufpool-copy direct >= 80% of fio's read bandwidth",
                  speed("bufpool-copy direct", fio), 0.8, False))
    for size in sorted({s for _, s in echo}):
        for engine in ("uring", "epoll"):
            if (engine, size) in echo:
                # A difference of two runs' counts: |x| < 0.01 is zero.
                g.append(goal(f"echo {size // 1024} KiB: {engine} makes no "
                              f"heap allocation per message (allocs/msg)",
                              {r: abs(m["allocs_per_msg"]) for r, m in
                               echo[(engine, size)].items()}, 0.01, True))
        u, m = echo.get(("uring", size)), echo.get(("malloc", size))
        if u and m:
            # One server configuration for both sizes: 1.3x at 4 KiB, 1.1x
            # at 64 KiB (large messages, where copying bytes dominates).
            target = 1.1 if size >= 64 * 1024 else 1.3
            g.append(goal(f"echo {size // 1024} KiB: uring >= {target}x the "
                          f"malloc baseline's msgs/s",
                          per_round(u, m, lambda a, b: a["msgs_per_s"] /
                                    b["msgs_per_s"]), target, False))
            g.append(goal(f"echo {size // 1024} KiB: uring p99 below malloc's "
                          f"(p99 ratio)",
                          per_round(u, m, lambda a, b: a["p99_us"] /
                                    b["p99_us"]), 1 - 1e-9, True))
            # And less server CPU per message than malloc's, over the
            # rounds that measured it on both sides.
            cpu = "server_cpu_us_per_msg"
            g.append(goal(f"echo {size // 1024} KiB: uring server CPU per "
                          f"message below malloc's (ratio)",
                          {r: u[r][cpu] / m[r][cpu] for r in sorted(u)
                           if r in m and u[r].get(cpu) is not None
                           and m[r].get(cpu)}, 1 - 1e-9, True))
    return [x for x in g if x]


def channel_goals(c):
    """bench/channel_handoff's rows: a 4 KiB buffer between two pinned
    processes, one-way = half a ping-pong round trip."""
    C = lambda k: c.get(f"channel_handoff.{k}", {})
    return [x for x in [
        goal("channel: BufferChannel hand-off of 4 KiB between two processes, "
             "one-way p50 <= 350 ns (ns)", C("channel_oneway_p50_ns"), 350,
             True),
        goal("channel: the same, one-way p99 (ns)", C("channel_oneway_p99_ns"),
             None, True),
        goal("channel: >= 10x faster than 4 KiB over a Unix socket pair "
             "(p50 ratio)", C("socket_vs_channel_p50"), 10, False),
        goal("channel: its floor, the bare token ring without the pool, "
             "one-way p50 (ns)", C("ring_oneway_p50_ns"), None, True),
        goal("channel: the machine's floor, one cache line bounced between "
             "the two CPUs, one-way p50 (ns)", C("line_oneway_p50_ns"), None,
             True),
        goal("channel: BufferChannel / that floor (p50 ratio)",
             C("channel_vs_line_p50"), None, True),
        goal("channel: the socket pair, one-way p50 (ns)",
             C("socket_oneway_p50_ns"), None, True),
    ] if x]


def elastic_goals(values, e):
    """The elastic pool's rows: bench/elastic_pool and the
    libbufpool_elastic contender beside the fixed pool."""
    V = lambda w, c, t=1: values.get((w, c, t), {})
    div = lambda a, b: a / b
    E = lambda k: e.get(k, {})
    return [
        goal("elastic: RSS after Create(512 of a 262,144 ceiling) <= 4 MiB "
             "above an empty process (MiB)",
             E("elastic_create.rss_above_empty_mib"), 4, True),
        goal("elastic: RSS after a burst to 200,000 in use, their release and "
             "Trim() <= 4 MiB above an empty process (MiB)",
             E("elastic_burst.rss_after_trim_above_empty_mib"), 4, True),
        goal("elastic: that Trim() <= 1 s (ms)", E("elastic_burst.trim_ms"),
             1000, True),
        goal("elastic: trim_after_idle (200 ms, a 10 ms TrimIdle() tick) "
             "back within 4 MiB, ms after the release",
             E("elastic_idle.back_after_ms"), None, True),
        goal("elastic: the burst's growth steps (doubling from 512 buffers "
             "to 32,768) p99 (ms)",
             E("elastic_burst.grow_step_p99_ms"), None, True),
        goal("elastic: burst to 200,000 / its floor (the bytes committed by "
             "hand + a fixed pool's burst) <= 1.5 (time ratio)",
             E("elastic_growth.burst_vs_floor"), 1.5, True),
        goal("elastic: burst to 200,000 / its floor, thread CPU time "
             "(ratio)", E("elastic_growth.burst_vs_floor_cpu"), None, True),
        goal("elastic: one growth step of 2 MiB / a plain populate of 2 MiB "
             "<= 2 (time ratio, medians of 64)",
             E("elastic_growth.step_vs_populate"), 2, True),
        goal("elastic: the burst / the same from a fixed pool of the ceiling "
             "<= 1.5 (time ratio)",
             per_round(E("elastic_burst.elastic_burst_ms"),
                       E("elastic_burst.fixed_burst_ms"), div), 1.5, True),
        goal("elastic: the burst / a fixed pool's Create() (pre-faulting "
             "the 1 GiB) + its burst (time ratio)",
             per_round(E("elastic_burst.elastic_burst_ms"),
                       {r: v + E("elastic_burst.fixed_create_ms").get(r, 0)
                        for r, v in E("elastic_burst.fixed_burst_ms").items()},
                       div), None, True),
    ] + [
        row
        for mode in ("default", "cpu_id", "locked")
        for row in (
            goal(f"elastic, {mode}: worst TryAcquire() while a trimmer/grower "
                 f"sleeps 200 ms in a signal handler <= 10 ms (ms)",
                 E(f"elastic_stall_{mode}.worst_ms"), 10, True),
            goal(f"elastic, {mode}: the same with no sleeps (ms, this "
                 f"machine's preemption)",
                 E(f"elastic_stall_{mode}.quiet_worst_ms"), None, True),
        )
    ] + [
        goal("elastic: hot pair / fixed pool's (time ratio, within noise)",
             per_round(V("Pair", "libbufpool_elastic"), V("Pair", REFERENCE),
                       div), None, True),
        goal("elastic: working set / fixed pool's (time ratio, within noise)",
             per_round(V("WorkingSet", "libbufpool_elastic"),
                       V("WorkingSet", REFERENCE), div), None, True),
    ]


def goals_table(rows):
    out = ["| goal | median (min–max) over rounds | rounds meeting it | met |",
           "|---|---:|---:|---|"]
    for x in rows:
        out.append(f"| {x['label']} | {fmt(x['median'])} ({fmt(x['lo'])}–"
                   f"{fmt(x['hi'])}) | "
                   + ("– | no goal |" if x["met"] is None else
                      f"{x['meeting']}/{x['rounds']} | "
                      f"{'met' if x['met'] else 'not met'} |"))
    return out


def machine_line(meta):
    return (f"{meta.get('nproc')} CPUs ({meta.get('cpu_model')}), Linux "
            f"{meta.get('kernel')}")


def main(run_dir):
    meta = {}
    if os.path.exists(os.path.join(run_dir, "meta.json")):
        with open(os.path.join(run_dir, "meta.json")) as f:
            meta = json.load(f)
    timing = {}
    if os.path.exists(os.path.join(run_dir, "timing.txt")):
        with open(os.path.join(run_dir, "timing.txt")) as f:
            for line in f:
                if line.split():
                    name, secs = line.split()
                    timing[name] = int(secs)
    values, counters = load_rounds(run_dir)
    cold, faults = load_cold(run_dir)
    copy, echo = load_copy(run_dir), load_echo(run_dir)
    csv_rows = ["workload,contender,threads,median,min,max,rounds,unit"]
    units = {w: u for w, _, u, _ in WORKLOADS}
    for (w, c, t), v in sorted(values.items()):
        med, lo, hi, n = summary(v)
        csv_rows.append(f"{w},{c},{t},{med:.4f},{lo:.4f},{hi:.4f},{n},"
                        f"{units.get(w, 'ns/buffer')}")

    text = [f"# tools/bench report, {meta.get('date_utc', 'date unknown')}", ""]
    rounds = meta.get("rounds")
    how = (f"{rounds} interleaved rounds" if rounds else "rounds unknown")
    if meta.get("quick"):
        how += (" (--quick: fewer rounds and shorter measurements than the "
                "default run; treat the figures as rough)")
    text.append(f"Machine: {machine_line(meta)}; load average at the start "
                f"{meta.get('loadavg', '?')}. {how}; Google Benchmark "
                f"min_time {meta.get('min_time_s', '?')} s per benchmark, one "
                f"process per contender per round, one repetition each.")
    loads = []
    for path in glob.glob(os.path.join(run_dir, "gb", "r*", "loadavg.txt")):
        m = re.fullmatch(r"r(\d+)", os.path.basename(os.path.dirname(path)))
        with open(path) as f:
            loads.append((int(m.group(1)), f.read().split()[0]))
    if loads:
        text.append("Load average (1 min) at the start of each round: " +
                    ", ".join(v for _, v in sorted(loads)) +
                    f" on {meta.get('nproc', '?')} CPUs; above the CPU "
                    "count, other work shared the machine.")
    if meta.get("only"):
        text.append(f"Partial run: only the jobs matching "
                    f"'{meta['only']}'.")
    if "total" in timing:
        text.append(f"The run took {timing['total'] / 60:.1f} minutes ("
                    + ", ".join(f"{k} {v} s" for k, v in timing.items()
                                if k != "total") + ").")

    head = headline(values, copy, echo)
    if head:
        text.append("\n## Headline\n")
        text.extend(headline_table(head))
        text.append("\nSpeed-up: the peer's time (or, for echo, libbufpool's "
                    "msgs/s) divided by the other side's, round by round; "
                    "above 1 means libbufpool is faster. Peers with several "
                    "variants are represented by the one with the lowest "
                    "median.")

    java = load_java(run_dir)
    g = goals(values, counters, cold, copy, echo, load_elastic(run_dir))
    g.extend(java_goals(java, cold))
    g.extend(channel_goals(load_jsonl_rounds(run_dir, "channel.jsonl")))
    if g:
        text.append("\n## Goals\n")
        text.append("A goal is met when the median over rounds of its "
                    "figure meets it; the rounds that meet it on their own "
                    "are counted beside it. Ratios are taken round by round.\n")
        text.extend(goals_table(g))

    if values:
        text.append("\n## Pool, chains and io_uring, per workload")
    for workload, title, unit, ref in WORKLOADS:
        entries = {c: v for (w, c, t), v in values.items() if w == workload}
        cnt = {c: v for (w, c, t), v in counters.items() if w == workload}
        if entries:
            text.extend(workload_table(title, unit, entries, ref, cnt))
        if workload == "Handoff":
            text.extend(threads_table(values))

    if cold:
        n = max(len(v) for v in cold.values())
        text.append(f"\n### Cold start: obtain 10,000 buffers of 4 KiB and "
                    f"write each once, in a fresh process ({n} rounds)\n")
        text.append("| contender | ms (median) | min–max | page faults per "
                    "buffer | vs libbufpool |")
        text.append("|---|---:|---:|---:|---|")
        ref = summary(cold["libbufpool"])[0] if "libbufpool" in cold else None
        for c, v in sorted(cold.items(), key=lambda kv: summary(kv[1])[0]):
            med, lo, hi, _ = summary(v)
            flt = f"{summary(faults[c])[0]:.2f}" if c in faults else "n/a"
            text.append(f"| {c} | {med:.2f} | {lo:.2f}–{hi:.2f} | {flt} | "
                        f"{compare(med, ref)} |")
            csv_rows.append(f"ColdStart,{c},1,{med:.4f},{lo:.4f},{hi:.4f},"
                            f"{len(v)},ms")

    if any(c.startswith("floor_") for (_, c, _) in values) or \
            any(c.startswith("floor_") for c in cold):
        text.append("\nRows named floor_* are not allocators but what the "
                    "machine needs without one: floor_plain_stack is a "
                    "per-thread stack with no lock and no checks (the cost of "
                    "touching page-aligned buffers plus a push and a pop); "
                    "floor_shared_stack is the same stack with its top in "
                    "memory, loaded and stored on every call, as a cache "
                    "that other threads may drain must keep it, and "
                    "floor_indexed_stack that stack found as a per-CPU "
                    "cache is, at an address computed from an index read "
                    "on every call (floor_indexed_stack_Npools: the "
                    "alternating-pools loop over N such stacks); "
                    "floor_kernel_zeroing maps and populates the same huge-page "
                    "region the pool uses, with no pool (the kernel's zeroing "
                    "alone).")

    jt = java_tables(java)
    if jt:
        text.append("\n## The Java binding (bindings/java, bench/java)")
        text.extend(jt)
        text.append("\nOne JVM per workload, contenders interleaved round by "
                    "round; java_ffm_floor is two raw critical downcalls "
                    "(bufpool_try_acquire, bufpool_release), what the binding "
                    "adds its checks to. The seed in a fresh JVM is in the "
                    "cold-start table (java_bufpool_*: the pool made before "
                    "the clock; *_with_create: loading and linking the "
                    "library and mapping the region timed too).")
        for (w, c), v in sorted(java.items()):
            if w != "churn":
                med, lo, hi, n = summary(v)
                csv_rows.append(f"Java_{w},{c},1,{med:.4f},{lo:.4f},{hi:.4f},"
                                f"{n},{dict((t[0], t[2]) for t in JAVA_TABLES)[w]}")

    skipped = os.path.join(run_dir, "skipped.txt")
    if os.path.exists(skipped):
        with open(skipped) as f:
            lines = sorted({l.strip() for l in f if l.strip()})
        if lines:
            text.append("\nSkipped or failed here: " + "; ".join(lines) + ".")

    for extra in sorted(glob.glob(os.path.join(run_dir, "extra", "*.md"))):
        with open(extra) as f:
            body = f.read().rstrip()
        body = script_goals(os.path.basename(extra), body)
        if body:
            text.append(f"\n## {os.path.basename(extra)[:-3]}\n\n" + body)

    print("\n".join(text))
    with open(os.path.join(run_dir, "summary.csv"), "w") as f:
        f.write("\n".join(csv_rows) + "\n")
    write_chart(run_dir, values, cold)


def script_goals(name, body):
    """The copy script's goal table judges ratios of medians; the Goals
    section above judges the same goals from its rounds, so it is dropped.
    Other scripts' goals (not run in rounds) are labelled as theirs."""
    parts = re.split(r"(?m)^### Goals\n", body, maxsplit=1)
    if len(parts) == 1:
        return body
    head, rest = parts
    nxt = re.search(r"(?m)^#", rest)
    tail = rest[nxt.start():] if nxt else ""
    if name == "run_copy_bench.md":
        return (head.rstrip() + "\n\n(Its goals are judged from the rounds "
                "in the Goals section above.)\n\n" + tail).rstrip()
    return (head + "### Goals (the script's own, from medians of runs "
            "inside one process, not from rounds)\n" + rest).rstrip()


def threads_table(values):
    """Aggregate throughput at 1, 2 and 8 threads with the 2/1 speed-up."""
    th = {(c, t): v for (w, c, t), v in values.items() if w == "Threads"}
    if not th:
        return []
    counts = sorted({t for _, t in th})
    out = ["\n### Threads: hot pair on every thread, aggregate (ns per buffer "
           "across all threads, median and min–max over rounds)\n",
           "| contender | " + " | ".join(f"{t} thr" for t in counts) +
           " | 2 thr / 1 thr speed-up |",
           "|---|" + "---:|" * len(counts) + "---:|"]
    last = counts[-1]

    def order(c):
        return summary(th[(c, last)])[0] if (c, last) in th else float("inf")

    for c in sorted({c for c, _ in th}, key=order):
        cells = [spread(th[(c, t)]) if (c, t) in th else "" for t in counts]
        up = per_round(th.get((c, 1), {}), th.get((c, 2), {}),
                       lambda a, b: a / b)
        out.append(f"| {c} | " + " | ".join(cells) +
                   f" | {spread(up) + 'x' if up else ''} |")
    return out


def write_chart(run_dir, values, cold):
    """Hot pair and cold start medians as two bar charts in one SVG."""
    pair = sorted(((c, summary(v)[0]) for (w, c, t), v in values.items()
                   if w == "Pair"), key=lambda kv: kv[1])
    coldm = sorted(((c, summary(v)[0]) for c, v in cold.items()),
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
set title "Hot pair: median ns per acquire + write + release (lower is better, log scale)"
plot "{data}" index 0 using 0:2:xtic(1) with boxes lc rgb "#3060a0"
set title "Cold start: median ms to obtain and write 10,000 x 4 KiB in a fresh process (log scale)"
plot "{data}" index 1 using 0:2:xtic(1) with boxes lc rgb "#a05030"
unset multiplot
""")
    if shutil.which("gnuplot") and pair and coldm:
        subprocess.run(["gnuplot", gp], check=False,
                       stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_report.py RESULTS_DIR")
    if not os.path.isdir(sys.argv[1]):
        sys.exit(f"bench_report.py: no such results directory: {sys.argv[1]}")
    main(sys.argv[1])
