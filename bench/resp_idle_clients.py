#!/usr/bin/env python3
"""Opens many idle connections to a RESP server on 127.0.0.1, for
bench/run_resp_bench's memory rows. Standard library only.

  resp_idle_clients.py --port P --conns N --mode idle|half [--hold S]

idle: each connection sends one PING and reads the +PONG, then stays idle.
half: each connection sends 100 bytes of a SET whose value never completes
      (*3 $3 SET $3 key $200 and 72 bytes of the 200), then stays idle.

Raises RLIMIT_NOFILE to what it needs (up to the hard limit). Prints
"ready N" on stdout once every connection is open (and, for idle, answered),
then holds them for --hold seconds (the caller ends it sooner with SIGTERM). Every step is bounded in time: a connect, send or reply that takes
longer than --timeout seconds, or a setup longer than --deadline, ends it
with a one-line error on stderr and exit status 1.
"""
import argparse
import resource
import socket
import sys
import time

PING = b"*1\r\n$4\r\nPING\r\n"
HALF_HEAD = b"*3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$200\r\n"
HALF = HALF_HEAD + b"v" * (100 - len(HALF_HEAD))  # 100 bytes, 72 of the value


def fail(msg):
    print(f"resp_idle_clients: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--mode", choices=("idle", "half"), required=True)
    ap.add_argument("--hold", type=float, default=120.0)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--deadline", type=float, default=120.0)
    a = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.conns + 64
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            fail(f"RLIMIT_NOFILE hard limit {hard} < {want} needed for "
                 f"{a.conns} connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    start = time.monotonic()
    conns = []
    msg = PING if a.mode == "idle" else HALF
    for i in range(a.conns):
        if time.monotonic() - start > a.deadline:
            fail(f"only {i} of {a.conns} connections open after "
                 f"{a.deadline:.0f} s")
        try:
            s = socket.create_connection(("127.0.0.1", a.port),
                                         timeout=a.timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(msg)
            if a.mode == "idle":
                got = b""
                while not got.endswith(b"\r\n"):
                    chunk = s.recv(64)
                    if not chunk:
                        fail(f"connection {i}: the server closed it")
                    got += chunk
                if got != b"+PONG\r\n":
                    fail(f"connection {i}: unexpected reply {got!r}")
        except OSError as e:  # socket.timeout is one
            fail(f"connection {i} of {a.conns}: {e or type(e).__name__}")
        conns.append(s)
    print(f"ready {len(conns)}", flush=True)

    time.sleep(a.hold)  # SIGTERM ends it sooner; the kernel closes them
    for s in conns:
        s.close()


if __name__ == "__main__":
    main()
