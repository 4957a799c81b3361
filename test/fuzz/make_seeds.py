#!/usr/bin/env python3
"""Writes the hand-made seeds (test/fuzz/corpus/<target>/seed-*).

The rest of each corpus is what libFuzzer found (merged with -merge=1);
these seeds are the typical uses, written down so a run from nothing (the
planted-defect check, tools/fuzz --planted) starts from them.

args_fuzz reads: one byte (the tool: 0 copy, 1 echo, 2 echo-load, modulo
3), then NUL-separated arguments. echo_fuzz reads through
FuzzedDataProvider, which takes integers from the end of the input; Fdp
below builds such an input from the values in the order the target asks
for them.

  test/fuzz/make_seeds.py    # rewrites the seed-* files
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def args_seed(tool, *args):
    return bytes([tool]) + b"\0".join(a.encode() for a in args)


class Fdp:
    """Inverse of FuzzedDataProvider's ConsumeIntegralInRange/ConsumeBool."""

    def __init__(self):
        self.taken = []  # bytes in the order they are consumed (from the end)

    def integral(self, lo, hi, value):
        assert lo <= value <= hi
        rng, v = hi - lo, value - lo
        n = 0
        while n < 8 and (rng >> (8 * n)) > 0:
            n += 1
        # The first byte consumed ends up most significant.
        self.taken += [(v >> (8 * (n - 1 - i))) & 0xFF for i in range(n)]
        return self

    def boolean(self, value):
        self.taken.append(1 if value else 0)
        return self

    def data(self):
        return bytes(reversed(self.taken))


def echo_seed(uring, ops, shift=2, count=64, small_limit=True, limit=2048):
    f = Fdp()
    f.integral(0, 4, shift).integral(4, 256, count).boolean(uring)
    f.boolean(small_limit).integral(1, 4096 if small_limit else 256 << 10, limit)
    open_conns = 0
    for op, extra in ops:
        f.integral(0, 9, op)
        if op == 0:
            f.integral(0, 3, extra)  # receive buffer: 0 default, else 1 KiB << n
            open_conns += 1
            continue
        f.integral(0, open_conns - 1, 0)  # the first open connection
        if op in (1, 2):
            f.integral(1, 512 if op == 1 else 96 * 1024, extra)
        elif op == 3:
            f.integral(1, 64 << 10, extra)
        elif op == 4:
            f.integral(0, 2000, extra)
        elif op == 8:
            f.boolean(extra)
        if op in (7, 8):
            open_conns -= 1
    return f.data()


def main():
    write("args_fuzz", "seed-copy-options", args_seed(
        0, "--method", "uring", "--buffer-size", "65536", "--buffer-count",
        "32", "--queue-depth", "8", "--direct-io", "--fsync", "src", "dst"))
    write("args_fuzz", "seed-copy-flags", args_seed(
        3, "-n", "--verify", "--json", "--no-progress", "--method=readwrite",
        "--buffer-count=16", "a", "b", "dir"))
    write("args_fuzz", "seed-copy-dashdash",
          args_seed(0, "--progress", "--", "-x", "./-", "out"))
    write("args_fuzz", "seed-copy-limits", args_seed(
        0, "--buffer-size", "64", "--buffer-count", "4096", "--queue-depth",
        "4096", "a", "b"))
    write("args_fuzz", "seed-echo-options", args_seed(
        1, "--listen", "127.0.0.1:0", "--engine", "epoll", "--buffers", "64",
        "--buffer-size", "4096", "--max-unsent", "1024"))
    write("args_fuzz", "seed-echo-equals", args_seed(
        4, "--listen=localhost:9000", "--engine=uring", "--buffers=4096"))
    write("args_fuzz", "seed-echo-load-options", args_seed(
        2, "--target", "127.0.0.1:7", "--connections", "4", "--messages",
        "10", "--size", "1:4096", "--seed", "7"))
    write("args_fuzz", "seed-echo-load-limits", args_seed(
        2, "--target", "127.0.0.1:65535", "--connections", "65536",
        "--messages", "4096", "--size", "67108864:67108864"))
    write("args_fuzz", "seed-echo-load-help", args_seed(5, "--help"))

    # A uring session whose client floods with a small receive buffer, waits
    # for the echo, half-closes; and an epoll one with small messages.
    write("echo_fuzz", "seed-uring-flood-half-close", echo_seed(
        True, [(0, 1), (9, None), (5, None), (6, None)]))
    write("echo_fuzz", "seed-epoll-messages", echo_seed(
        False, [(0, 0), (1, 100), (3, 50), (2, 3000), (5, None), (0, 0),
                (1, 7), (8, True)], shift=0, count=8, small_limit=False,
        limit=100000))
    write("echo_fuzz", "seed-uring-reset", echo_seed(
        True, [(0, 0), (2, 20000), (4, 500), (7, None), (0, 2), (1, 1),
               (5, None)], small_limit=False, limit=65536))


if __name__ == "__main__":
    main()
