"""Attacks on the parameter server's wire: a fuzzing key holder and a raw outsider.

The target is a real ``ServerEndpoint`` serving the real handlers of
``trainer.ps.server`` (one table, two dense parameters, two workers) in a
process of its own, so that its resident memory can be read and a crash shows
as the process dying. ``save`` and ``load`` are refused there: their root is the
server's working directory (the repository) unless ``FLEETFEED_CHECKPOINT_ROOT``
names another, and a fuzzer must write nowhere.

The fuzzer holds the job key and sends mutations of valid requests (random
bytes, huge integers, deep nesting, bad shapes and dtypes, truncations, wrong
frame counts, other operations' arguments); after every batch it asks the
server a legitimate question, which must be answered. The outsider knows no key:
it opens raw TCP connections that send a ZMTP greeting and one handshake frame
announcing a large size, or nothing at all.

As a script::

    python tests/helpers/wire_fuzz.py serve HOST:PORT [--open-files N] [--refuse OP]
        the target: prints one JSON line ({"pid": ...}) once it listens, serves
        until its stdin closes
    python tests/helpers/wire_fuzz.py fuzz [--messages N] [--seconds S] [--seed K]
        starts a target and fuzzes it; prints one JSON line of counts

``tests/trainer/test_ps_wire_fuzz.py`` runs the fuzzer for a few seconds,
``benchmarks/fuzz_ps_wire.py`` for millions of messages.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HELPERS = Path(__file__).resolve().parent
REPO = HELPERS.parents[1]
for _path in (REPO, HELPERS):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import zmq  # noqa: E402

from trainer.ps import transport, wire  # noqa: E402

# The key the fuzzer and its target share (a test job's key, nothing else).
FUZZ_KEY = "wire-fuzz-job-key-0123456789abcdef"
TARGET_TABLE = "t"
TARGET_DIM = 4


# -- the target ------------------------------------------------------------------


def target_handlers(refused_ops: tuple[str, ...] = ()) -> dict[str, Callable]:
    """The server's real handlers over a small ParameterServer (installed here),
    but save, load and ``refused_ops``, which refuse every call."""
    import torch

    from trainer.ps import server
    from trainer.ps.tables.optim import OptimizerSpec
    from trainer.ps.tables.table import SparseTable

    # max_rows: rows created by fuzzed ids are evicted, so memory stays bounded.
    table = SparseTable(TARGET_TABLE, TARGET_DIM, OptimizerSpec("sgd"), max_rows=20_000)
    dense = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(8, 4))]
    server.install(server.ParameterServer(
        0, 1, 2, "async", {TARGET_TABLE: table}, dense, torch.optim.SGD(dense, lr=0.01)
    ))

    def refused(*_args):
        raise PermissionError("the fuzz target refuses this operation")

    handlers = dict(server.HANDLERS)
    for name in ("save", "load", *refused_ops):
        handlers[name] = _renamed(refused, name)
    return handlers


def _renamed(func: Callable, name: str) -> Callable:
    def renamed(*args):
        return func(*args)

    renamed.__name__ = name
    return renamed


def serve(endpoint: str, open_files: int | None, refused_ops: tuple[str, ...] = ()) -> None:
    """The target's main: listens on ``endpoint`` until stdin closes."""
    import logging
    import resource

    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if open_files is not None:  # a machine's usual soft limit, the hard one kept
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, hard))
    keys = transport.CurveKeys.from_job_key(FUZZ_KEY)
    handlers = target_handlers(refused_ops)
    listening = transport.ServerEndpoint(endpoint, keys, handlers, 2, "fuzz target")
    try:
        print(json.dumps({"pid": os.getpid(), "endpoint": endpoint}), flush=True)
        sys.stdin.read()
    finally:
        listening.close()


@dataclass
class Target:
    """A target server process; ``stop()`` ends it (also on failures)."""

    process: subprocess.Popen
    endpoint: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_mib(self) -> float:
        return rss_mib(self.pid)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15) -> int:
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


@contextmanager
def running_target(
    endpoint: str, log_path: Path, open_files: int | None = None, timeout: float = 60,
    refused_ops: tuple[str, ...] = (),
) -> Iterator[Target]:
    """Starts ``serve`` in a child process and yields it once it listens."""
    command = [sys.executable, str(Path(__file__).resolve()), "serve", endpoint]
    if open_files is not None:
        command += ["--open-files", str(open_files)]
    for op in refused_ops:
        command += ["--refuse", op]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log_file,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    target = Target(process, endpoint, log_path)
    try:
        line = _read_line(process, timeout)
        if not line:
            raise RuntimeError(
                f"the fuzz target on {endpoint} exited before listening "
                f"(exit {process.poll()}): {target.log()[-3000:]}"
            )
        yield target
    finally:
        target.stop()
        if process.stdout is not None:
            process.stdout.close()


def _read_line(process: subprocess.Popen, timeout: float) -> bytes:
    import selectors

    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise TimeoutError(f"the fuzz target printed nothing within {timeout:g}s")
    return process.stdout.readline()


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (VmRSS)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


# -- the outsider -----------------------------------------------------------------

# A ZMTP 3.0 greeting that asks for CURVE, as a client (RFC 23): signature,
# version, mechanism, as-server, filler.
ZMTP_CURVE_GREETING = (
    b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"CURVE".ljust(20, b"\0") + b"\0" + b"\0" * 31
)


def large_handshake_frame_header(size: int) -> bytes:
    """A command frame's flags and 8-byte size (the CURVE HELLO's place)."""
    return b"\x06" + size.to_bytes(8, "big")


def open_announcing_connections(
    host: str, port: int, count: int, announced: int, payload_bytes: int, timeout: float = 10
) -> tuple[list[socket.socket], int]:
    """``count`` connections, each sending a greeting, a handshake frame that
    announces ``announced`` bytes, then up to ``payload_bytes`` of it (fewer
    where the server closes the connection). Returns the sockets, still open,
    and the payload bytes the server took in all."""
    connections, delivered = [], 0
    chunk = b"\x5a" * (1 << 20)
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=timeout)
        connections.append(sock)
        sock.sendall(ZMTP_CURVE_GREETING + large_handshake_frame_header(announced))
    for _ in range(0, payload_bytes, len(chunk)):
        for sock in connections:
            if sock.fileno() < 0:
                continue
            try:
                sock.sendall(chunk)
                delivered += len(chunk)
            except OSError:  # the server closed it: what a bounded server does
                sock.close()
    return connections, delivered


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` seconds (reads and
    drops whatever it sent before)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return True
        except TimeoutError:
            return False
        except OSError:  # reset: closed too
            return True
    return False


# -- the key holder's seeds -------------------------------------------------------


def seed_messages() -> list[list[bytes]]:
    """One valid request per operation of ``server.HANDLERS``, as a worker
    encodes them (the target refuses save and load, but their requests still
    pass the wire's checks, and mutations of them exercise the decoder)."""
    import torch

    ids = torch.tensor([3, -7, 2**62, 11, 5], dtype=torch.int64)
    rows = torch.randn(5, TARGET_DIM)
    dense = {0: torch.randn(4), 1: torch.randn(8, 4)}
    sparse = {TARGET_TABLE: (ids, rows)}
    requests = {
        "describe": [],
        "pull_tables": [[TARGET_TABLE], ids, True],
        "pull_step": [0, [TARGET_TABLE], ids],
        "pull_dense": [],
        "push": [0, sparse, dense],
        "push_sync": [1, sparse, dense],
        "geo_push": [1, sparse, dense],
        "worker_done": [1],
        "barrier": [0],
        # Directories under a server's checkpoint root; the target refuses both.
        "save": ["checkpoints/pass-2", "delta"],
        # A save's token and a checkpoint state are uuid4 hex (runtime.save_persistables).
        "commit_save": ["0f3c9a1e5b7d4c2a8e6f1b3d5a7c9e0f", "6b1d8f3a2c4e4a9b8d7f6e5c4b3a2d1e"],
        "load": ["checkpoints/pass-1"],
        "table_size": [TARGET_TABLE],
        "set_pass": [2],
        "shrink": [],
        "table_stats": [],
        "add_clicks": [TARGET_TABLE, ids, torch.ones(5)],
    }
    messages = []
    for request_id, (op, args) in enumerate(requests.items(), start=1):
        header = {"v": wire.PROTOCOL_VERSION, "id": request_id, "op": op}
        messages.append([bytes(frame) for frame in wire.encode(header, args)])
    return messages


# -- mutations ----------------------------------------------------------------------

HUGE_INTEGERS = ["9" * 5000, "-" + "9" * 400, str(2**63), str(-(2**63) - 1), str(2**64),
                 "1" + "0" * 30, "99999999999999999999"]
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999999", "-1e400"]
BAD_SHAPES = [
    [0, 2**63], [-1], [2**62, 2**62], [1, 1, 1, 1, 1], "4", [4.0], [True], None,
    [0] * 100, [2**40, 0], [0, 2**40, 2**40, 2**40], [2**31, 2**31], [3, -2], {},
]
BAD_DTYPES = ["object", "float128", "", None, 7, "int64 ", ["float32"], "complex64",
              "float32", "int64", "uint8", "bool", "float16"]
NASTY_VALUES = [
    None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, -0.0, "", "x" * 5000, [], {},
    {"$t": 99}, {"$t": -1}, {"$t": "0"}, {"$t": True}, {"$d": 5}, {"$d": [[1.5, 2]]},
    {"$d": [[None, 2]]}, {"$d": [[0]]}, {"$t": 0, "$d": []}, {"__reduce__": "os.system"},
    "\ud800", [[[[[[[[[[1]]]]]]]]]],
]
HEADER_TOKENS = [*HUGE_INTEGERS, *NON_FINITE, '"\\ud800"', "\\", '"',
                 "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "\0", "\xff", "true", ","]
# Tokens that cost the server (and the fuzzer) milliseconds each: sent rarely,
# so that a run covers them and still sends thousands of messages a second.
COSTLY_TOKENS = ["[" * 100_000, "{" * 50_000, '"' + '\\"' * 100_000]
COSTLY_SHARE = 0.02


def nested(depth: int, inner: str = "0", brackets: str = "[]") -> str:
    """``inner`` inside ``depth`` brackets, as JSON text (no recursion)."""
    return brackets[0] * depth + inner + brackets[1] * depth


class Mutator:
    """Mutations of valid messages; ``mutate`` stacks one to three of them."""

    def __init__(self, rng: random.Random, seeds: list[list[bytes]]) -> None:
        self.rng = rng
        self.seeds = seeds
        self.mutations: list[Callable[[list[bytes]], list[bytes]]] = [
            self.flip_bytes, self.random_header, self.truncate_frame, self.extend_frame,
            self.drop_frame, self.duplicate_frame, self.add_empty_frames, self.swap_frames,
            self.insert_token, self.set_value, self.set_shape, self.set_dtype,
            self.set_operation, self.deep_body, self.huge_integer_field, self.drop_field,
            self.header_of_another_kind, self.splice_messages, self.resize_tensor_frame,
        ]

    def mutate(self) -> list[bytes]:
        frames = list(self.rng.choice(self.seeds))
        for _ in range(self.rng.choice((1, 1, 1, 2, 3))):
            frames = self.rng.choice(self.mutations)(frames) or [b""]
        return [frame[:wire.MAX_HEADER_BYTES] for frame in frames]  # libzmq's frame limit

    # bytes

    def _pick(self, frames: list[bytes]) -> int:
        return 0 if len(frames) == 1 or self.rng.random() < 0.6 else self.rng.randrange(len(frames))

    def flip_bytes(self, frames: list[bytes]) -> list[bytes]:
        k = self._pick(frames)
        data = bytearray(frames[k])
        for _ in range(self.rng.randint(1, 4)):
            if data:
                data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        frames[k] = bytes(data)
        return frames

    def random_header(self, frames: list[bytes]) -> list[bytes]:
        frames[0] = self.rng.randbytes(self.rng.choice((0, 1, 8, 100, 4096)))
        return frames

    def truncate_frame(self, frames: list[bytes]) -> list[bytes]:
        k = self._pick(frames)
        frames[k] = frames[k][: self.rng.randint(0, max(0, len(frames[k]) - 1))]
        return frames

    def extend_frame(self, frames: list[bytes]) -> list[bytes]:
        k = self._pick(frames)
        frames[k] = frames[k] + self.rng.randbytes(self.rng.choice((1, 4, 8, 1000)))
        return frames

    def drop_frame(self, frames: list[bytes]) -> list[bytes]:
        del frames[self.rng.randrange(len(frames))]
        return frames

    def duplicate_frame(self, frames: list[bytes]) -> list[bytes]:
        k = self.rng.randrange(len(frames))
        frames.insert(k, frames[k])
        return frames

    def add_empty_frames(self, frames: list[bytes]) -> list[bytes]:
        costly = self.rng.random() < COSTLY_SHARE
        return frames + [b""] * (3000 if costly else self.rng.choice((1, 2, 100)))

    def swap_frames(self, frames: list[bytes]) -> list[bytes]:
        self.rng.shuffle(frames)
        return frames

    def resize_tensor_frame(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) > 1:
            k = self.rng.randrange(1, len(frames))
            frames[k] = self.rng.randbytes(self.rng.choice((0, 1, 3, 7, 8, 64, 65536)))
        return frames

    def insert_token(self, frames: list[bytes]) -> list[bytes]:
        text = frames[0].decode(errors="replace")
        at = self.rng.randint(0, len(text))
        costly = self.rng.random() < COSTLY_SHARE
        token = self.rng.choice(COSTLY_TOKENS if costly else HEADER_TOKENS)
        if self.rng.random() < 0.5:  # in place of a number, where one is
            digits = [i for i, c in enumerate(text) if c.isdigit()]
            if digits:
                at = self.rng.choice(digits)
                end = at
                while end < len(text) and text[end].isdigit():
                    end += 1
                frames[0] = (text[:at] + token + text[end:]).encode(errors="surrogatepass")
                return frames
        frames[0] = (text[:at] + token + text[at:]).encode(errors="surrogatepass")
        return frames

    # structure

    def _header(self, frames: list[bytes]) -> dict | None:
        try:
            header = json.loads(frames[0])
        except (ValueError, RecursionError):
            return None
        return header if isinstance(header, dict) else None

    def _dump(self, frames: list[bytes], header: dict) -> list[bytes]:
        frames[0] = json.dumps(header).encode(errors="surrogatepass")
        return frames

    def set_value(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        if header is None:
            return frames
        value = self.rng.choice(NASTY_VALUES)
        body = header.get("body")
        if isinstance(body, list) and body and self.rng.random() < 0.8:
            target = body
            while True:  # walk down a random path, replace what is there
                key = (self.rng.randrange(len(target)) if isinstance(target, list)
                       else self.rng.choice(list(target)))
                child = target[key]
                if not child or not isinstance(child, (list, dict)) or self.rng.random() < 0.4:
                    target[key] = value
                    break
                target = child
        else:
            header[self.rng.choice(("v", "id", "op", "body", "tensors", "error"))] = value
        return self._dump(frames, header)

    def set_shape(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        specs = header.get("tensors") if header else None
        if not specs or not isinstance(specs, list):
            return frames
        spec = specs[self.rng.randrange(len(specs))]
        if isinstance(spec, list) and len(spec) == 2:
            spec[1] = self.rng.choice(BAD_SHAPES)
        return self._dump(frames, header)

    def set_dtype(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        specs = header.get("tensors") if header else None
        if not specs or not isinstance(specs, list):
            return frames
        spec = specs[self.rng.randrange(len(specs))]
        if isinstance(spec, list) and len(spec) == 2:
            spec[0] = self.rng.choice(BAD_DTYPES)
        return self._dump(frames, header)

    def set_operation(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        if header is None:
            return frames
        header["op"] = self.rng.choice(
            [*wire.OPS, "system", "__init__", "", None, 1, ["push"], "save"]
        )
        return self._dump(frames, header)

    def deep_body(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        if header is None:
            return frames
        costly = self.rng.random() < COSTLY_SHARE
        depth = 100_000 if costly else self.rng.choice((7, 20, 25, 1000))
        inner = json.dumps(header.pop("body", None))
        brackets = self.rng.choice(("[]", "[]", "{}"))
        if brackets == "{}":
            text = '{"$d":[[0,' * depth + inner + "]]}" * depth
        else:
            text = nested(depth, inner)
        head = json.dumps(header)
        frames[0] = (head[:-1] + ', "body": ' + text + "}").encode(errors="surrogatepass")
        return frames

    def huge_integer_field(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        if header is None:
            return frames
        field_name = self.rng.choice(("id", "v", "body"))
        marker = 123454321
        if field_name == "body" and isinstance(header.get("body"), list) and header["body"]:
            header["body"][self.rng.randrange(len(header["body"]))] = marker
        else:
            header[field_name] = marker
        text = json.dumps(header).replace(str(marker), self.rng.choice(HUGE_INTEGERS), 1)
        frames[0] = text.encode(errors="surrogatepass")
        return frames

    def drop_field(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        if header:
            header.pop(self.rng.choice(list(header)))
            return self._dump(frames, header)
        return frames

    def header_of_another_kind(self, frames: list[bytes]) -> list[bytes]:
        header = self._header(frames)
        kind = self.rng.choice(("list", "string", "number", "null", "ids"))
        if kind == "list":
            frames[0] = json.dumps(list((header or {}).items())).encode(errors="surrogatepass")
        elif kind == "string":
            frames[0] = json.dumps(frames[0].decode(errors="replace")).encode()
        elif kind == "number":
            frames[0] = b"1e5"
        elif kind == "null":
            frames[0] = b"null"
        else:
            frames = frames[1:] or [b""]  # tensor bytes where the header belongs
        return frames

    def splice_messages(self, frames: list[bytes]) -> list[bytes]:
        other = self.rng.choice(self.seeds)
        return frames[:1] + list(other[1:])


# -- the key holder ------------------------------------------------------------------


@dataclass
class FuzzCounts:
    """What a fuzz run sent and got back."""

    sent: int = 0
    error_replies: int = 0
    result_replies: int = 0
    liveness_checks: int = 0
    slowest_liveness_s: float = 0.0
    reconnects: int = 0
    error_types: dict[str, int] = field(default_factory=dict)


class ServerDied(AssertionError):
    """The target stopped answering legitimate requests (or exited)."""


class KeyHolder:
    """A worker-keyed DEALER that sends raw frames and reads replies."""

    def __init__(
        self, endpoint: str, counts: FuzzCounts, key: str = FUZZ_KEY, send_timeout_s: float = 20
    ) -> None:
        keys = transport.CurveKeys.from_job_key(key)
        self.endpoint = endpoint
        self.counts = counts
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.linger = 0
        self._socket.sndtimeo = int(send_timeout_s * 1000)  # a server that stops reading
        self._socket.curve_serverkey = keys.server_public
        self._socket.curve_publickey = keys.worker_public
        self._socket.curve_secretkey = keys.worker_secret
        self._socket.connect(f"tcp://{endpoint}")
        self._liveness_ids = itertools.count(10**12)
        self._describe = None

    def send(self, frames: list[bytes]) -> None:
        try:
            self._socket.send_multipart(frames)
        except zmq.Again:
            raise ServerDied(
                f"the server at {self.endpoint} took no message for "
                f"{self._socket.sndtimeo / 1000:g}s: it stopped reading"
            ) from None
        self.counts.sent += 1

    def drain(self, wait_ms: int = 0) -> list[dict]:
        """Reads the replies waiting (their headers, decoded as JSON)."""
        headers = []
        while self._socket.poll(wait_ms):
            wait_ms = 0
            reply = self._socket.recv_multipart()
            header = json.loads(reply[0])
            headers.append(header)
            error = header.get("error")
            if error is None:
                self.counts.result_replies += 1
            else:
                self.counts.error_replies += 1
                kind = str(error.get("type"))
                self.counts.error_types[kind] = self.counts.error_types.get(kind, 0) + 1
        return headers

    def check_alive(self, timeout: float = 15) -> float:
        """Asks ``describe`` and waits for its answer; the seconds it took.

        Raises:
            ServerDied: no answer within ``timeout`` seconds.
        """
        request_id = next(self._liveness_ids)
        header = {"v": wire.PROTOCOL_VERSION, "id": request_id, "op": "describe"}
        started = time.monotonic()
        self.send([bytes(frame) for frame in wire.encode(header, [])])
        self.counts.sent -= 1  # not a fuzzed message
        deadline = started + timeout
        while (left := deadline - time.monotonic()) > 0:
            for reply in self.drain(wait_ms=int(min(left, 0.5) * 1000)):
                if reply.get("id") == request_id:
                    if reply.get("error") is not None or "body" not in reply:
                        raise ServerDied(f"describe failed on a live server: {reply}")
                    took = time.monotonic() - started
                    self.counts.liveness_checks += 1
                    self.counts.slowest_liveness_s = max(self.counts.slowest_liveness_s, took)
                    return took
        raise ServerDied(
            f"the server at {self.endpoint} did not answer a legitimate describe "
            f"within {timeout:g}s after {self.counts.sent} fuzzed messages"
        )

    def close(self) -> None:
        self._socket.close(linger=0)
        self._context.term()


def fuzz(
    endpoint: str, seed: int, messages: int, seconds: float, batch: int,
    on_batch: Callable[[FuzzCounts], None] | None = None,
) -> FuzzCounts:
    """Sends mutated messages in batches of ``batch`` until ``messages`` were
    sent or ``seconds`` passed, checking after each batch that the server
    answers a legitimate request (``ServerDied`` otherwise)."""
    counts = FuzzCounts()
    mutator = Mutator(random.Random(seed), seed_messages())
    holder = KeyHolder(endpoint, counts)
    try:
        holder.check_alive(timeout=30)  # connected and handshaken
        deadline = time.monotonic() + seconds
        while counts.sent < messages and time.monotonic() < deadline:
            for i in range(min(batch, messages - counts.sent)):
                holder.send(mutator.mutate())
                if i % 64 == 63:
                    holder.drain()
            holder.check_alive()
            if on_batch is not None:
                on_batch(counts)
        holder.drain(wait_ms=200)
    finally:
        holder.close()
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serving = commands.add_parser("serve")
    serving.add_argument("endpoint")
    serving.add_argument("--open-files", type=int, default=None)
    serving.add_argument("--refuse", action="append", default=[], help="an operation to refuse")
    fuzzing = commands.add_parser("fuzz")
    fuzzing.add_argument("--messages", type=int, default=100_000)
    fuzzing.add_argument("--seconds", type=float, default=60.0)
    fuzzing.add_argument("--seed", type=int, default=1)
    fuzzing.add_argument("--batch", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args.endpoint, args.open_files, tuple(args.refuse))
        return
    import tempfile

    from support import reserved_ports

    with tempfile.TemporaryDirectory() as scratch, reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        with running_target(endpoint, Path(scratch) / "target.log") as target:
            started = time.monotonic()
            counts = fuzz(endpoint, args.seed, args.messages, args.seconds, args.batch)
            took = time.monotonic() - started
            print(json.dumps({**counts.__dict__, "seconds": round(took, 1),
                              "target_rss_mib": round(target.rss_mib(), 1)}))


if __name__ == "__main__":
    main()
