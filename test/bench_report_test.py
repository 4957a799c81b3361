#!/usr/bin/env python3
"""tools/bench_report.py's round arithmetic on a synthetic results directory:
medians and ranges over rounds, ratios paired by round, rounds won against a
peer's best variant, goals met or not from the rounds.

  python3 test/bench_report_test.py
"""
import contextlib
import importlib.util
import io
import json
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "bench_report", os.path.join(HERE, "..", "tools", "bench_report.py"))
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)

# ns per buffer, round by round (rounds 1, 2, 3).
PAIR = {
    "libbufpool_buffer": [1.0, 5.0, 1.5],
    "libbufpool_c": [2.0, 2.5, 4.0],
    "dpdk_mempool_cache256": [2.0, 2.0, 6.0],
    # Lower in round 1 but a higher median: not DPDK's best variant.
    "dpdk_mempool_cache256_4k_stride": [0.5, 7.0, 7.0],
    "glibc_posix_memalign": [30.0, 40.0, 35.0],
    "floor_plain_stack": [0.1, 0.1, 0.1],
}
THREADS = {1: [2.0, 2.0, 2.0], 2: [1.0, 1.25, 1.0]}  # speed-ups 2.0, 1.6, 2.0


def bench_entry(name, ns, threads=1, **extra):
    e = {"name": name, "run_name": name, "run_type": "iteration",
         "repetitions": 1, "threads": threads, "iterations": 1000,
         "real_time": ns, "cpu_time": ns, "time_unit": "ns",
         "items_per_second": 1e9 / ns}
    e.update(extra)
    return e


def write_run(root, quick=False):
    for r in range(3):
        d = os.path.join(root, "gb", f"r{r + 1}")
        os.makedirs(d, exist_ok=True)
        for c, vals in PAIR.items():
            with open(os.path.join(d, f"bench__{c}.json"), "w") as f:
                json.dump({"context": {}, "benchmarks": [
                    bench_entry(f"Pair/{c}", vals[r])]}, f)
        with open(os.path.join(d, "bench__threads.json"), "w") as f:
            json.dump({"benchmarks": [
                bench_entry(f"Threads/libbufpool_buffer/real_time/threads:{t}",
                            v[r], threads=t) for t, v in THREADS.items()]}, f)
        with open(os.path.join(d, "core__reclaim.json"), "w") as f:
            json.dump({"benchmarks": [bench_entry(
                "Reclaim/libbufpool/iterations:2000/manual_time", 1000.0,
                p50_us=5.0, p99_us=[10.0, 60.0, 70.0][r])]}, f)
        with open(os.path.join(d, "core__manypools.json"), "w") as f:
            json.dump({"benchmarks": [
                bench_entry("ManyPools/floor_indexed_stack_1pool", 1.0),
                bench_entry("ManyPools/floor_indexed_stack_2pools",
                            [1.5, 1.6, 1.4][r])]}, f)
        with open(os.path.join(d, "uring__ring.json"), "w") as f:
            json.dump({"benchmarks": [
                bench_entry("BM_Ring/handling:1/bytes:2048/iterations:20000/"
                            "manual_time", [104.0, 110.0, 100.0][r]),
                bench_entry("BM_RingInto/handling:1/bytes:2048/"
                            "iterations:20000/manual_time",
                            [140.0, 160.0, 150.0][r]),
                bench_entry("BM_RawLiburing/handling:1/bytes:2048/"
                            "iterations:20000/manual_time", 100.0),
                # Another size: kept apart from the 2,048-byte rows.
                bench_entry("BM_RingInto/handling:1/bytes:256/"
                            "iterations:20000/manual_time", 300.0),
                bench_entry("BM_RawLiburing/handling:1/bytes:256/"
                            "iterations:20000/manual_time", 100.0),
                bench_entry("BM_RingVisit/handling:1/bytes:256/"
                            "iterations:20000/manual_time",
                            [130.0, 210.0, 120.0][r]),
                bench_entry("BM_RingInto/handling:0/bytes:256/"
                            "iterations:20000/manual_time", 900.0),
                # No items_per_second: the figure is the counter.
                {"name": "BM_TrickleLine/copy_below:512/incremental:1/"
                 "iterations:1", "run_name": "BM_TrickleLine/copy_below:512/"
                 "incremental:1/iterations:1", "run_type": "iteration",
                 "repetitions": 1, "threads": 1, "iterations": 1,
                 "real_time": 70.0, "cpu_time": 70.0, "time_unit": "ms",
                 "pinned_per_byte": [1.0, 1.5, 3.0][r]}]}, f)
    with open(os.path.join(root, "gb", "r2", "broken.json"), "w") as f:
        f.write("{ interrupted")
    with open(os.path.join(root, "cold_start.jsonl"), "w") as f:
        for ms in (4.0, 6.0, 4.5):
            f.write(json.dumps({"contender": "libbufpool", "ms": ms}) + "\n")
            f.write(json.dumps({"contender": "glibc_posix_memalign",
                                "ms": 10 * ms}) + "\n")
    with open(os.path.join(root, "meta.json"), "w") as f:
        json.dump({"date_utc": "2026-12-01 12:00 UTC", "rounds": 3,
                   "quick": quick, "nproc": 2, "cpu_model": "Test CPU",
                   "kernel": "6.0", "min_time_s": 0.2}, f)


class RoundArithmetic(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        write_run(self.dir)
        with contextlib.redirect_stderr(io.StringIO()):
            self.values, self.counters = report.load_rounds(self.dir)

    def tearDown(self):
        self.tmp.cleanup()

    def pair(self, c):
        return self.values[("Pair", c, 1)]

    def test_every_round_is_loaded_and_a_broken_file_skipped(self):
        self.assertEqual(self.pair("libbufpool_buffer"),
                         {1: 1.0, 2: 5.0, 3: 1.5})

    def test_median_and_range(self):
        self.assertEqual(report.summary(self.pair("libbufpool_buffer")),
                         (1.5, 1.0, 5.0, 3))
        self.assertEqual(report.summary(self.pair("libbufpool_c")),
                         (2.5, 2.0, 4.0, 3))

    def test_best_variant_is_the_lowest_median(self):
        entries = {c: self.pair(c) for c in PAIR}
        self.assertEqual(report.best_variant(entries, "dpdk"),
                         "dpdk_mempool_cache256")
        self.assertEqual(report.best_variant(entries, "tcmalloc"), None)

    def test_rounds_won_pairs_rounds(self):
        # 1.0 < 2.0 yes, 5.0 < 2.0 no, 1.5 < 6.0 yes.
        self.assertEqual(report.rounds_won(self.pair("libbufpool_buffer"),
                                           self.pair("dpdk_mempool_cache256")),
                         (2, 3))
        # Partial rounds: only rounds both ran count.
        self.assertEqual(report.rounds_won({1: 1.0, 3: 9.0}, {1: 2.0, 2: 2.0,
                                                              3: 2.0}), (1, 2))

    def test_families(self):
        self.assertEqual(report.family("dpdk_mempool_ring"), "dpdk")
        self.assertEqual(report.family("glibc_new_aligned"), "glibc")
        self.assertEqual(report.family("mutex_freelist"), "mutex_freelist")
        self.assertIsNone(report.family("floor_plain_stack"))
        self.assertIsNone(report.family("libbufpool_raw"))

    def test_goals_from_rounds(self):
        cold, _ = report.load_cold(self.dir)
        goals = {g["label"]: g for g in
                 report.goals(self.values, self.counters, cold, {}, {})}
        hot = goals["hot pair <= 2 ns (libbufpool_buffer, ns)"]
        self.assertEqual((hot["median"], hot["meeting"], hot["rounds"],
                          hot["met"]), (1.5, 2, 3, True))
        # dpdk / pool per round: 2.0, 0.4, 4.0 -> median 2.0 < 3.
        three = goals["hot pair >= 3x faster than DPDK's cached pair"]
        self.assertEqual((three["median"], three["meeting"], three["met"]),
                         (2.0, 1, False))
        # dpdk / C per round: 1.0, 0.8, 1.5.
        c = [g for label, g in goals.items() if label.startswith("C pair")][0]
        self.assertEqual((c["median"], c["meeting"], c["met"]), (1.0, 0, False))
        two = goals["2 threads >= 1.8x one thread's throughput"]
        self.assertEqual((two["median"], two["lo"], two["meeting"],
                          two["met"]), (2.0, 1.6, 2, True))
        reclaim = goals["reclaiming an idle cache: p99 <= 50 us"]
        self.assertEqual((reclaim["median"], reclaim["meeting"],
                          reclaim["met"]), (60.0, 1, False))
        ring = [g for label, g in goals.items()
                if label.startswith("ring Take")][0]
        self.assertAlmostEqual(ring["median"], 1.04)
        self.assertEqual((ring["meeting"], ring["met"]), (2, True))
        # Into one chain, by size: 1.4, 1.6, 1.5 against 1.5 (at 2,048 B),
        # 3.0 against 2 (at 256 B).
        swap = [g for label, g in goals.items()
                if label.startswith("ring handling above")][0]
        self.assertAlmostEqual(swap["median"], 1.5)
        self.assertEqual((swap["meeting"], swap["met"]), (2, True))
        copy = [g for label, g in goals.items()
                if label.startswith("ring handling under")][0]
        self.assertAlmostEqual(copy["median"], 3.0)
        self.assertEqual((copy["meeting"], copy["met"]), (0, False))
        self.assertAlmostEqual(self.values[("UringRecvFull256",
                                            "libbufpool_ring_into", 1)][1],
                               900.0)
        visit = goals["ring handling under copy_below (256 B), in "
                      "place: Visit + Refill <= 2x raw liburing (time ratio)"]
        self.assertEqual((visit["median"], visit["meeting"], visit["met"]),
                         (1.3, 2, True))
        floor = goals["floor: alternating 2 stacks / one stack (no pool), "
                      "time ratio"]
        self.assertEqual((floor["median"], floor["meeting"], floor["met"]),
                         (1.5, None, None))
        self.assertNotIn("floor: alternating 4 stacks / one stack (no pool), "
                         "time ratio", goals)
        trickle = [g for label, g in goals.items()
                   if label.startswith("trickled") and "on)" in label][0]
        self.assertEqual((trickle["median"], trickle["meeting"],
                          trickle["met"]), (1.5, 2, True))
        self.assertEqual(goals["cold start of 10,000 ready buffers <= 5 ms"]
                         ["meeting"], 2)
        glibc = goals["cold start >= 20x faster than glibc posix_memalign"]
        self.assertAlmostEqual(glibc["median"], 10.0)
        self.assertFalse(glibc["met"])
        # No figures, no goal line.
        self.assertNotIn("bulk 32 <= 0.5 ns per buffer (libbufpool_bulk, ns)",
                         goals)

    def test_report_text(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(io.StringIO()):
            report.main(self.dir)
        text = out.getvalue()
        self.assertIn("3 interleaved rounds", text)
        self.assertNotIn("--quick", text)
        self.assertIn("2 CPUs (Test CPU), Linux 6.0", text)
        # Pool row's table line: median 1.50, range 1.00-5.00, 3 rounds.
        self.assertIn("| libbufpool_buffer | 1.50 | 1.00–5.00 | 3 | reference |",
                      text)
        # Rounds won against DPDK's best variant and glibc's.
        self.assertIn("| libbufpool_buffer | 2/3 | 3/3 |", text)
        self.assertIn("| libbufpool_c | 1/3 | 3/3 |", text)
        self.assertIn("| hot pair <= 2 ns (libbufpool_buffer, ns) | 1.50 "
                      "(1.00–5.00) | 2/3 | met |", text)
        self.assertIn("(0.40–4.00) | 1/3 | not met |", text)
        # Headline: speed-up vs DPDK round by round 2.0, 0.4, 4.0.
        self.assertIn("hot pair: libbufpool vs DPDK rte_mempool "
                      "(dpdk_mempool_cache256) | 1.50 ns (1.00–5.00) | "
                      "2.00 ns (2.00–6.00) | 2.00 (0.40–4.00)x | 2/3 |", text)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "summary.csv")))

    def test_quick_run_says_so(self):
        write_run(self.dir, quick=True)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(io.StringIO()):
            report.main(self.dir)
        self.assertIn("--quick", out.getvalue())

    def test_copy_and_echo_rounds(self):
        os.makedirs(os.path.join(self.dir, "run_copy_bench"))
        with open(os.path.join(self.dir, "run_copy_bench", "copy_bench.csv"),
                  "w") as f:
            f.write("group,contender,round,seconds,bytes\n")
            for r, (auto, cp) in enumerate([(1.0, 1.1), (1.2, 1.0),
                                            (0.9, 1.0)]):
                f.write(f"buffered,bufpool-copy auto,{r},{auto},1\n")
                f.write(f"buffered,cp,{r},{cp},1\n")
        os.makedirs(os.path.join(self.dir, "run_echo_bench"))
        runs = []
        for r, (u, m) in enumerate([(130, 100), (120, 100), (140, 100)]):
            runs.append({"engine": "uring", "message_bytes": 4096,
                         "round": r + 1, "msgs_per_s": u, "p99_us": 5,
                         "allocs_per_msg": [0.0, -0.002, 2.0][r]})
            runs.append({"engine": "malloc", "message_bytes": 4096,
                         "round": r + 1, "msgs_per_s": m, "p99_us": 10})
        # 64 KiB: 1.2, 1.0, 1.15 of malloc's rate; server CPU per message
        # 0.9, 1.2, 0.8 of malloc's.
        for r, (u, cpu) in enumerate([(120, 9), (100, 12), (115, 8)]):
            runs.append({"engine": "uring", "message_bytes": 65536,
                         "round": r + 1, "msgs_per_s": u, "p99_us": 5,
                         "allocs_per_msg": 0.0, "server_cpu_us_per_msg": cpu})
            runs.append({"engine": "malloc", "message_bytes": 65536,
                         "round": r + 1, "msgs_per_s": 100, "p99_us": 10,
                         "server_cpu_us_per_msg": 10})
        with open(os.path.join(self.dir, "run_echo_bench", "echo_bench.json"),
                  "w") as f:
            json.dump({"runs": runs}, f)
        copy, echo = report.load_copy(self.dir), report.load_echo(self.dir)
        goals = {g["label"]: g for g in report.goals({}, {}, {}, copy, echo)}
        auto = goals["bufpool-copy auto at least as fast as cp"]
        self.assertEqual((auto["meeting"], auto["rounds"], auto["met"]),
                         (2, 3, True))
        self.assertAlmostEqual(auto["median"], 1.1)
        echo_goal = goals["echo 4 KiB: uring >= 1.3x the malloc baseline's "
                          "msgs/s"]
        self.assertEqual((echo_goal["median"], echo_goal["meeting"],
                          echo_goal["met"]), (1.3, 2, True))
        allocs = goals["echo 4 KiB: uring makes no heap allocation per "
                       "message (allocs/msg)"]
        self.assertEqual((allocs["meeting"], allocs["rounds"], allocs["met"]),
                         (2, 3, True))
        p99 = goals["echo 4 KiB: uring p99 below malloc's (p99 ratio)"]
        self.assertEqual((p99["meeting"], p99["met"]), (3, True))
        big = goals["echo 64 KiB: uring >= 1.1x the malloc baseline's "
                    "msgs/s"]
        self.assertAlmostEqual(big["median"], 1.15)
        self.assertEqual((big["meeting"], big["met"]), (2, True))
        cpu = goals["echo 64 KiB: uring server CPU per message below "
                    "malloc's (ratio)"]
        self.assertAlmostEqual(cpu["median"], 0.9)
        self.assertEqual((cpu["meeting"], cpu["met"]), (2, True))
        # No CPU figures at 4 KiB here: no row; one target per size.
        self.assertNotIn("echo 4 KiB: uring server CPU per message below "
                         "malloc's (ratio)", goals)
        self.assertNotIn("echo 4 KiB: uring >= 1.1x the malloc baseline's "
                         "msgs/s", goals)
        self.assertNotIn("echo 64 KiB: uring >= 1.3x the malloc baseline's "
                         "msgs/s", goals)
        rows = report.headline_table(report.headline({}, copy, echo))
        self.assertTrue(any("echo 4 KiB: uring engine vs malloc" in r and
                            "| 1.30 (1.20–1.40)x | 3/3 |" in r for r in rows),
                        rows)


    def test_elastic_rounds(self):
        lines = []
        for rss, trim, p99, burst, fixed in ((1.5, 90.0, 0.4, 30.0, 40.0),
                                              (2.0, 110.0, 1.2, 50.0, 30.0),
                                              (5.0, 100.0, 0.5, 45.0, 40.0)):
            lines.append({"contender": "elastic_create",
                          "rss_above_empty_mib": rss})
            lines.append({"contender": "elastic_burst", "trim_ms": trim,
                          "rss_after_trim_above_empty_mib": rss,
                          "grow_step_p99_ms": p99, "elastic_burst_ms": burst,
                          "fixed_burst_ms": fixed})
        with open(os.path.join(self.dir, "elastic.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in lines) + "\n")
        e = report.load_elastic(self.dir)
        self.assertEqual(e["elastic_create.rss_above_empty_mib"],
                         {1: 1.5, 2: 2.0, 3: 5.0})
        goals = {x["label"]: x for x in
                 report.goals(self.values, self.counters, {}, {}, {}, e)}
        rss = goals["elastic: RSS after Create(512 of a 262,144 ceiling) <= "
                    "4 MiB above an empty process (MiB)"]
        self.assertEqual((rss["median"], rss["meeting"], rss["met"]),
                         (2.0, 2, True))
        p99 = goals["elastic: the burst's growth steps (doubling from 512 "
                    "buffers to 32,768) p99 (ms)"]
        self.assertAlmostEqual(p99["median"], 0.5)
        ratio = goals["elastic: the burst / the same from a fixed pool of the "
                      "ceiling <= 1.5 (time ratio)"]
        self.assertAlmostEqual(ratio["median"], 1.125)
        self.assertEqual((ratio["meeting"], ratio["met"]), (2, True))
        # No idle lines, no libbufpool_elastic rows: no such goal rows.
        self.assertFalse(any("trim_after_idle" in k for k in goals))
        self.assertFalse(any("hot pair / fixed" in k for k in goals))

    def test_channel_rounds(self):
        lines = [{"contender": "channel_handoff", "channel_oneway_p50_ns": c,
                  "channel_oneway_p99_ns": c * 3, "socket_oneway_p50_ns": so,
                  "socket_oneway_p99_ns": so * 2,
                  "line_oneway_p50_ns": c / 2, "channel_vs_line_p50": 2.0,
                  "socket_vs_channel_p50": so / c}
                 for c, so in ((300.0, 4000.0), (400.0, 3000.0),
                               (200.0, 2500.0))]
        with open(os.path.join(self.dir, "channel.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in lines) + "\n")
        c = report.load_jsonl_rounds(self.dir, "channel.jsonl")
        self.assertEqual(c["channel_handoff.channel_oneway_p50_ns"],
                         {1: 300.0, 2: 400.0, 3: 200.0})
        goals = {x["label"]: x for x in report.channel_goals(c)}
        p50 = goals["channel: BufferChannel hand-off of 4 KiB between two "
                    "processes, one-way p50 <= 350 ns (ns)"]
        self.assertEqual((p50["median"], p50["meeting"], p50["met"]),
                         (300.0, 2, True))
        ratio = goals["channel: >= 10x faster than 4 KiB over a Unix socket "
                      "pair (p50 ratio)"]
        self.assertAlmostEqual(ratio["median"], 12.5)
        self.assertEqual((ratio["meeting"], ratio["met"]), (2, True))
        floor = goals["channel: BufferChannel / that floor (p50 ratio)"]
        self.assertEqual((floor["median"], floor["met"]), (2.0, None))
        self.assertEqual(report.channel_goals({}), [])

    def test_java_rounds(self):
        lines = []
        for r, (ours, netty, each, bulk, sliced, files, tt) in enumerate((
                (20.0, 100.0, 50.0, 0.4, 5.0, 0.30, 0.29),
                (40.0, 70.0, 60.0, 0.5, 4.0, 0.30, 0.31),
                (25.0, 80.0, 55.0, 0.6, 6.0, 0.33, 0.30)), start=1):
            lines += [
                {"workload": "pair", "contender": "java_bufpool_pair",
                 "round": r, "ns": ours},
                {"workload": "pair", "contender": "java_netty_pooled_pair",
                 "round": r, "ns": netty},
                {"workload": "seed10k", "round": r, "ms": each,
                 "contender": "java_seed10k_allocateDirect_each"},
                {"workload": "seed10k", "round": r, "ms": sliced,
                 "contender": "java_seed10k_allocateDirect_sliced"},
                {"workload": "seed10k", "round": r, "ms": bulk,
                 "contender": "java_seed10k_bufpool_bulk"},
                {"workload": "copy", "contender": "java_files_copy",
                 "round": r, "seconds": files},
                {"workload": "copy", "round": r, "seconds": tt,
                 "contender": "java_bufpool_copy_transfer_to"}]
        lines.append({"workload": "churn", "contender": "java_bufpool_churn",
                      "threads": 8, "seconds": 60, "pairs": 10, "leaks": 0,
                      "region_mib": 16.0, "rss_start_mib": 200.0,
                      "rss_end_mib": 201.5, "rss_max_mib": 202.0,
                      "rss_growth_mib": 1.5})
        with open(os.path.join(self.dir, "java_bench.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in lines) + "\n")
        java = report.load_java(self.dir)
        self.assertEqual(java[("pair", "java_bufpool_pair")],
                         {1: 20.0, 2: 40.0, 3: 25.0})
        goals = {x["label"]: x for x in report.java_goals(java, {})}
        pair = goals["Java acquire + release pair <= 30 ns (java_bufpool_pair)"]
        self.assertEqual((pair["median"], pair["meeting"], pair["met"]),
                         (25.0, 2, True))
        netty = goals["Java pair >= 2x faster than Netty's pooled direct pair"]
        # Round by round: 5.0, 1.75, 3.2.
        self.assertEqual((netty["median"], netty["meeting"], netty["met"]),
                         (3.2, 2, True))
        seed = goals["10,000 buffers from the pool >= 100x faster than 10,000 "
                     "allocateDirect (warm JVM)"]
        self.assertEqual((seed["median"], seed["meeting"], seed["met"]),
                         (120.0, 2, True))
        copy = goals["the binding's copy (transfer_to) >= 1.0x the speed of "
                     "java.nio.file.Files.copy"]
        self.assertEqual((copy["meeting"], copy["met"]), (2, True))
        self.assertNotIn("the binding's copy (read_write) >= 1.0x the speed "
                         "of java.nio.file.Files.copy", goals)
        churn = goals["Java churn on 8 threads: resident memory growth <= "
                      "4 MiB (MiB)"]
        self.assertEqual((churn["median"], churn["met"]), (1.5, True))
        text = "\n".join(report.java_tables(java))
        self.assertIn("| java_bufpool_pair | 25.00 | 20.00–40.00 | 3 | "
                      "reference |", text)
        self.assertIn("growth 1.5 MiB", text)


if __name__ == "__main__":
    unittest.main()
