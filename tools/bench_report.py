#!/usr/bin/env python3
"""Prints Google Benchmark JSON (median aggregates) as one table per workload.

Each row: contender, ns per buffer (median), and how it compares with the
libbufpool row of the same workload, all from the same run.
Usage: tools/bench_report.py results/<stamp>/buffer_pool_benchmark.json
"""
import json
import sys

# Workload prefix -> (title, the pool row the others are compared with)
WORKLOADS = {
    "BM_Pair_": ("Hot pair: acquire, write one byte, release (1 thread)", "PoolBuffer"),
    "BM_Bulk32_": ("Batches of 32: acquire 32, write each, release 32", "Pool"),
    "BM_Handoff_": ("Hand-off: thread A acquires, thread B releases", "Pool"),
}


def main(path):
    with open(path) as f:
        data = json.load(f)
    ctx = data["context"]
    print(f"# {ctx.get('num_cpus')} CPUs @ {ctx.get('mhz_per_cpu')} MHz, "
          f"{ctx.get('date')}, library_build_type={ctx.get('library_build_type')}")
    rows = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"]
        per_item = 1e9 / b["items_per_second"]  # ns per buffer
        rows[name] = per_item
    for prefix, (title, base) in WORKLOADS.items():
        mine = {n[len(prefix):].split("/")[0]: v for n, v in rows.items()
                if n.startswith(prefix)}
        if not mine:
            continue
        print(f"\n## {title}")
        print(f"{'contender':<24}{'ns/buffer':>12}  vs libbufpool")
        ref = mine.get(base)
        for name, v in sorted(mine.items(), key=lambda kv: kv[1]):
            if ref is None or name == base:
                cmp = "(reference)" if name == base else ""
            elif v >= ref:
                cmp = f"{v / ref:.1f}x slower"
            else:
                cmp = f"{ref / v:.1f}x faster"
            print(f"{name:<24}{v:>12.2f}  {cmp}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench_report.py BENCHMARK_JSON")
    main(sys.argv[1])
