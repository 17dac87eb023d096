"""Records/s of the wide&deep PS job (2 servers + 2 workers) on two "hosts"
against the same job on one host, runs alternating.

The hosts are network namespaces on this machine (as in tests/trainer/test_multihost.py):
two hosts, each with one veth interface (10.77.2.1, 10.77.3.1) joined by the
pair, each running 1 server + 1 worker under its own fleetrun; one host, a
namespace with one veth interface (10.77.2.1) running all four processes under
one fleetrun. Both share this machine's cores, so the difference is what the
split costs (the link, the second fleetrun), not what a second machine gives.
Needs root (``unshare -n``, ``nsenter``, ``ip``).

    sudo .venv/bin/python benchmarks/bench_multihost.py [--rounds 3] [--lines 2000]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "wide_and_deep_ps", "train.py")
RATE = re.compile(r"worker \d+ epoch (\d+): mean loss [\d.]+, ([\d,]+) records/s")
KEY = "b3" * 32


class Namespace:
    """A network namespace held open by a sleeping process."""

    def __init__(self) -> None:
        self.holder = subprocess.Popen(
            ["unshare", "-n", "sleep", "3600"], stdout=subprocess.DEVNULL
        )
        own = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.holder.pid}/ns/net") == own:
            if self.holder.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("unshare -n failed: this needs root")
            time.sleep(0.02)
        self.ip("link", "set", "lo", "up")

    def enter(self, *argv: str) -> list[str]:
        """``argv`` run in this namespace."""
        return ["nsenter", "-t", str(self.holder.pid), "-n", *argv]

    def ip(self, *argv: str) -> None:
        """``ip ARGV`` in this namespace."""
        subprocess.run(self.enter("ip", *argv), check=True)

    def close(self) -> None:
        """Ends the namespace (and its interfaces)."""
        self.holder.kill()
        self.holder.wait()


def linked_pair() -> tuple[Namespace, Namespace]:
    """Two namespaces joined by a veth pair: 10.77.2.1 and 10.77.3.1."""
    a, b = Namespace(), Namespace()
    # (A failure here leaves the two sleeping holders: the caller exits anyway.)
    a.ip("link", "add", "ff-a", "type", "veth", "peer", "name", "ff-b", "netns", str(b.holder.pid))
    for host, interface, address in ((a, "ff-a", "10.77.2.1"), (b, "ff-b", "10.77.3.1")):
        host.ip("addr", "add", f"{address}/16", "dev", interface)
        host.ip("link", "set", interface, "up")
    return a, b


def run_job(
    starts: list[tuple[Namespace, list[str]]], work: str, lines: int, log: str
) -> float:
    """Runs one fleetrun per (namespace, endpoint arguments); the records/s of
    the last epoch, summed over the workers."""
    env = dict(os.environ, PYTHONPATH=ROOT, FLEETFEED_JOB_KEY=KEY)
    script = [TRAIN, "--lines", str(lines), "--print-period", "100000",
              "--data", os.path.join(work, "data")]
    processes = [
        subprocess.Popen(
            host.enter(sys.executable, "-m", "trainer.job.launch", *endpoints,
                       "--log_dir", os.path.join(work, f"{log}{i}"), *script),
            cwd=work, env=env, stdout=subprocess.DEVNULL,
        )
        for i, (host, endpoints) in enumerate(starts)
    ]
    if any(process.wait() != 0 for process in processes):
        raise SystemExit(f"the job failed; logs in {work}/{log}*")
    rates: dict[int, float] = {}
    for i in range(len(starts)):
        directory = os.path.join(work, f"{log}{i}")
        for name in os.listdir(directory):
            if name.startswith("workerlog"):
                with open(os.path.join(directory, name)) as text:
                    found = RATE.findall(text.read())
                last = max(int(epoch) for epoch, _ in found)
                rates[len(rates)] = sum(
                    float(rate.replace(",", "")) for epoch, rate in found if int(epoch) == last
                )
    return sum(rates.values())


def main() -> None:
    """Alternates the one-host and the two-host job; prints each run and the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lines", type=int, default=2000)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-multihost-")
    a, b = linked_pair()
    alone = Namespace()
    made = [a, b, alone]
    two = ["--servers", "10.77.2.1:24101,10.77.3.1:24101",
           "--workers", "10.77.2.1:24102,10.77.3.1:24102"]
    one = ["--servers", "10.77.2.1:24101,10.77.2.1:24103",
           "--workers", "10.77.2.1:24102,10.77.2.1:24104"]
    results: dict[str, list[float]] = {"one host": [], "two hosts": []}
    try:
        # One veth interface too (its peer in the same namespace, unused).
        alone.ip("link", "add", "ff-one", "type", "veth", "peer", "name", "ff-one-peer")
        alone.ip("addr", "add", "10.77.2.1/16", "dev", "ff-one")
        alone.ip("link", "set", "ff-one", "up")
        for round_ in range(args.rounds):
            for name, starts in (("one host", [(alone, one)]), ("two hosts", [(a, two), (b, two)])):
                rate = run_job(starts, work, args.lines, f"r{round_}-{name[:3]}-")
                results[name].append(rate)
                print(f"round {round_}: {name}: {rate:,.0f} records/s", flush=True)
    finally:
        for host in made:
            host.close()
    for name, rates in results.items():
        print(f"{name}: median {statistics.median(rates):,.0f} records/s over {len(rates)} runs "
              f"(2 workers, last epoch, summed; wide&deep, --lines {args.lines})")


if __name__ == "__main__":
    main()
