"""The parameter server's transport alone: what CURVE authentication and
encryption cost per call, against the unauthenticated NULL mechanism.

One process holds a ``ServerEndpoint`` (handlers that echo a reply of the
size a pull or push returns) and a worker's ``ServerSet``; it makes calls of
the sizes a wide&deep step sends (``--ids`` distinct ids: a pull of int64 ids
answered with float32 rows of ``--dim``, a push of ids and gradients answered
with the dense values) in blocks, keyed and keyless blocks alternating. The
process's CPU time covers both ends of every call, so CPU microseconds per call
is the cost of the whole round trip on this machine, steadier than wall time
when other work shares the cores.

Usage: python benchmarks/bench_transport.py [--ids 5000] [--dim 8] [--calls 300]
       [--blocks 6] [--no-write]
Results go to benchmarks/results/transport.md.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

RESULTS = HERE / "results" / "transport.md"
KEY = "bench-transport-job-key-0123456789"


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def block(keyed: bool, args: argparse.Namespace) -> tuple[float, float]:
    """Runs ``args.calls`` pull+push pairs; (wall us, CPU us) per call."""
    import torch

    from trainer.ps import transport
    from trainer.ps.server import HANDLERS

    rows = torch.rand(args.ids, args.dim)
    dense = {0: torch.rand(args.dense)}

    def pull_tables(names, ids, create):
        return [rows[: ids.shape[0]]]

    def push(worker, sparse, dense_grads):
        return dense

    handlers = dict(HANDLERS, pull_tables=pull_tables, push=push)
    keys = transport.CurveKeys.from_job_key(KEY if keyed else None)
    endpoint = f"127.0.0.1:{free_port()}"
    server = transport.ServerEndpoint(endpoint, keys, handlers, 4, "bench server")
    servers = transport.ServerSet([endpoint], keys, timeout=30)
    ids = torch.arange(args.ids, dtype=torch.int64)
    grads = {"t": (ids, torch.rand(args.ids, args.dim))}
    try:
        servers.call(0, HANDLERS["pull_tables"], ["t"], ids, True)  # connect, handshake
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.calls):
            servers.call(0, HANDLERS["pull_tables"], ["t"], ids, True)
            servers.call(0, HANDLERS["push"], 0, grads, {0: torch.rand(args.dense)})
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        servers.close()
        server.close()
    calls = 2 * args.calls
    return 1e6 * wall / calls, 1e6 * cpu / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=5000, help="distinct ids per pull/push")
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--dense", type=int, default=16_384, help="dense floats in a push reply")
    parser.add_argument("--calls", type=int, default=300, help="pull+push pairs per block")
    parser.add_argument("--blocks", type=int, default=6, help="blocks per contender")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(args.blocks):
        for keyed in ((True, False) if i % 2 == 0 else (False, True)):
            got[keyed].append(block(keyed, args))
            wall, cpu = got[keyed][-1]
            print(f"{'CURVE' if keyed else 'NULL '}: {wall:7.1f} us/call wall, "
                  f"{cpu:7.1f} us/call CPU", flush=True)
    rows = {}
    for keyed in (True, False):
        rows[keyed] = (statistics.median(w for w, _ in got[keyed]),
                       statistics.median(c for _, c in got[keyed]))
    payload = args.ids * (8 + 4 * args.dim)
    lines = [
        "| mechanism | us/call wall (median) | us/call CPU, both ends (median) |",
        "|---|---:|---:|",
        f"| CURVE (job key) | {rows[True][0]:.1f} | {rows[True][1]:.1f} |",
        f"| NULL (no key) | {rows[False][0]:.1f} | {rows[False][1]:.1f} |",
        f"| CURVE / NULL | {rows[True][0] / rows[False][0]:.3f}x | "
        f"{rows[True][1] / rows[False][1]:.3f}x |",
    ]
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            "# PS transport: the cost of CURVE per call\n\n"
            f"Pull and push calls of {args.ids:,} ids x dim {args.dim} (~{payload / 1024:.0f} "
            f"KiB out and back) and {args.dense:,} dense floats, {args.calls} pairs per block, "
            f"{args.blocks} blocks per mechanism alternating, one process holding both ends. "
            f"`python benchmarks/bench_transport.py`.\n\n" + table
        )


if __name__ == "__main__":
    main()
