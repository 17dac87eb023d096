"""The candidate transports for the parameter server, bare: gRPC (insecure and
TLS) against ZeroMQ (NULL and CURVE), on the byte sizes of a wide&deep step.

Each contender runs a server and a client in this process; the client makes
``--calls`` pairs of requests shaped as a PS step's pull (40 KB out, 160 KB
back) and push (264 KB out, 64 KB back), raw bytes with no encoding on top, so
that only the transport differs. Contenders alternate in blocks; reported are
median wall and CPU (both ends) microseconds per call. gRPC is not a
dependency of fleetfeed: ``pip install grpcio`` to run it.

Usage: python benchmarks/bench_transport_candidates.py [--calls 200] [--blocks 4]
Results go to benchmarks/results/transport_candidates.md unless --no-write.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "transport_candidates.md"
# (request bytes, reply bytes) of a pull and of a push of 5,000 ids x dim 8.
CALLS = [(40_000, 160_000), (264_000, 64_000)]


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replies() -> dict[int, bytes]:
    """Reply bodies by request size (the server answers with the paired size)."""
    return {out: os.urandom(back) for out, back in CALLS}


def zmq_contender(curve: bool) -> Callable[[int], None]:
    """A ZeroMQ ROUTER server thread and a DEALER client; returns run(calls)."""
    import zmq

    ctx = zmq.Context()
    port = free_port()
    answers = replies()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    if curve:
        import zmq.auth.thread

        auth = zmq.auth.thread.ThreadAuthenticator(ctx)
        auth.start()
        client_public, client_secret = zmq.curve_keypair()
        server_public, server_secret = zmq.curve_keypair()
        # Any client key: the handshake and the encryption cost the same.
        auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        router.curve_server = True
        router.curve_secretkey, router.curve_publickey = server_secret, server_public
        dealer.curve_serverkey = server_public
        dealer.curve_publickey, dealer.curve_secretkey = client_public, client_secret
    router.bind(f"tcp://127.0.0.1:{port}")
    dealer.connect(f"tcp://127.0.0.1:{port}")
    stop = threading.Event()

    def serve() -> None:
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        while not stop.is_set():
            if poller.poll(50):
                who, body = router.recv_multipart(copy=False)
                router.send_multipart([who, answers[len(body.buffer)]], copy=False)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    requests = [os.urandom(out) for out, _ in CALLS]

    def run(calls: int) -> None:
        if calls < 0:
            stop.set()
            thread.join()
            router.close(0)
            dealer.close(0)
            if curve:
                auth.stop()
            ctx.term()
            return
        for _ in range(calls):
            for request in requests:
                dealer.send(request, copy=False)
                dealer.recv(copy=False)

    return run


def grpc_contender(tls: bool) -> Callable[[int], None]:
    """A gRPC server (raw bytes, no protobuf) and a client; returns run(calls)."""
    import grpc

    answers = replies()

    def handler(request: bytes, context: object) -> bytes:
        return answers[len(request)]

    port = free_port()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(4), options=[
        ("grpc.max_receive_message_length", 1 << 30)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "ps", {"call": grpc.unary_unary_rpc_method_handler(handler)})])
    options = [("grpc.max_receive_message_length", 1 << 30)]
    if tls:
        tmp = tempfile.mkdtemp(prefix="bench-grpc-")
        key, cert = f"{tmp}/key.pem", f"{tmp}/cert.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        pem_key, pem_cert = Path(key).read_bytes(), Path(cert).read_bytes()
        server.add_secure_port(f"127.0.0.1:{port}",
                               grpc.ssl_server_credentials([(pem_key, pem_cert)]))
        channel = grpc.secure_channel(
            f"127.0.0.1:{port}", grpc.ssl_channel_credentials(root_certificates=pem_cert), options)
    else:
        server.add_insecure_port(f"127.0.0.1:{port}")
        channel = grpc.insecure_channel(f"127.0.0.1:{port}", options)
    server.start()
    call = channel.unary_unary("/ps/call")
    requests = [os.urandom(out) for out, _ in CALLS]

    def run(calls: int) -> None:
        if calls < 0:
            channel.close()
            server.stop(0)
            return
        for _ in range(calls):
            for request in requests:
                call(request, timeout=30)

    return run


CONTENDERS: dict[str, Callable[[], Callable[[int], None]]] = {
    "ZeroMQ NULL": lambda: zmq_contender(False),
    "ZeroMQ CURVE": lambda: zmq_contender(True),
    "gRPC insecure": lambda: grpc_contender(False),
    "gRPC TLS": lambda: grpc_contender(True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="pull+push pairs per block")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for block in range(args.blocks):
        for name in names if block % 2 == 0 else reversed(names):
            run = CONTENDERS[name]()
            run(5)  # connect, handshake, warm up
            wall, cpu = time.perf_counter(), time.process_time()
            run(args.calls)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            run(-1)
            calls = 2 * args.calls
            got[name].append((1e6 * wall / calls, 1e6 * cpu / calls))
            print(f"{name:14s} {got[name][-1][0]:8.1f} us/call wall "
                  f"{got[name][-1][1]:8.1f} us/call CPU", flush=True)
    lines = ["| transport | us/call wall (median) | us/call CPU, both ends (median) |",
             "|---|---:|---:|"]
    for name in names:
        lines.append(f"| {name} | {statistics.median(w for w, _ in got[name]):.1f} | "
                     f"{statistics.median(c for _, c in got[name]):.1f} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if not args.no_write:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            "# PS transport candidates, bare\n\n"
            f"A pull (40 KB out, 160 KB back) and a push (264 KB out, 64 KB back) per pair, "
            f"{args.calls} pairs per block, {args.blocks} blocks per contender alternating, "
            "client and server in one process. "
            "`python benchmarks/bench_transport_candidates.py`.\n\n" + table
        )


if __name__ == "__main__":
    main()
