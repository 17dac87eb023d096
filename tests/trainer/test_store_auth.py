"""The rendezvous stores of a job, attacked from outside.

fleetfeed's own store (``CurveStore``, what every group of a job forms through
under fleetrun or a cluster's launcher): an outsider completes no handshake, so
it reads, writes, deletes and lists nothing, and what anyone can make the store
hold is bounded. Under another launcher's torchrun the ranks can only use its
agent's TCPStore (``KeyedStore``): an outsider there finds none of the job's
entries and cannot forge or replay one.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import wire_fuzz
from support import reserved_ports

from trainer.job import store as store_module
from trainer.job.bind import KeyedStore
from trainer.job.errors import WorkerFailedError
from trainer.job.store import CurveStore

KEY = "store-tests-job-key-0123456789abcdef"
TIMEOUT = datetime.timedelta(seconds=5)


@pytest.fixture
def stores():
    """The job's keyed view of a store on 127.0.0.1, and an outsider's plain client."""
    with reserved_ports(1) as (port,):
        server = dist.TCPStore("127.0.0.1", port, None, True, TIMEOUT)
        outsider = dist.TCPStore("127.0.0.1", port, None, False, TIMEOUT)
        yield KeyedStore(server, KEY), outsider, server


def test_an_outsider_finds_no_entry_of_the_job(stores):
    job, outsider, _ = stores
    job.set("rank0/address", b"10.0.0.1:4000")
    job.add("barrier", 1)
    assert job.get("rank0/address") == b"10.0.0.1:4000" and job.check(["rank0/address"])
    # The names the job uses mean nothing to the outsider: they are not there.
    assert not outsider.check(["rank0/address"]) and not outsider.check(["barrier"])
    assert outsider.num_keys() >= 2  # what it can learn: that entries exist


def test_a_forged_or_replayed_entry_is_refused(stores):
    job, outsider, server = stores
    job.set("rank0/address", b"10.0.0.1:4000")
    # A round trip on the job's own connection: its set (which gets no answer)
    # has landed before the outsider writes, and cannot land after the forgery.
    assert job.get("rank0/address") == b"10.0.0.1:4000"
    # Even with the hidden name (as a sniffer of the plain-text store traffic
    # would have it), the outsider cannot write a value the job accepts...
    hidden = job._name("rank0/address")
    outsider.set(hidden, b"\0" * 32 + b"6.6.6.6:4000")
    outsider.get(hidden)  # a round trip: TCPStore's set gets no answer of its own
    with pytest.raises(WorkerFailedError, match="does not carry this job's signature"):
        job.get("rank0/address")
    # ...nor move a signed value to another name.
    job.set("rank1/address", b"10.0.0.2:4000")
    assert job.get("rank1/address") == b"10.0.0.2:4000"  # landed, as above
    outsider.set(hidden, server.get(job._name("rank1/address")))
    outsider.get(hidden)
    with pytest.raises(WorkerFailedError, match="signature"):
        job.get("rank0/address")


def test_compare_set_keeps_its_meaning_through_the_signatures(stores):
    job, _, _ = stores
    assert job.compare_set("leader", "", b"rank0") == b"rank0"  # absent: set
    assert job.compare_set("leader", b"rank1", b"rank2") == b"rank0"  # mismatch: unchanged
    assert job.compare_set("leader", b"rank0", b"rank3") == b"rank3"
    assert job.get("leader") == b"rank3"
    assert job.delete_key("leader") and not job.check(["leader"])


def test_a_keyed_group_forms_and_reduces(tmp_path):
    """Two ranks join a gloo group through keyed stores (the path init_collective takes)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import datetime, sys, torch, torch.distributed as dist
        from trainer.job.bind import rendezvous_store
        rank, port = int(sys.argv[1]), int(sys.argv[2])
        timeout = datetime.timedelta(seconds=60)
        store = rendezvous_store("127.0.0.1", port, rank, 2, timeout, {KEY!r})
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)
        print(value.item(), flush=True)
        dist.destroy_process_group()
    """)
    with reserved_ports(1) as (port,):
        procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(2)]
        try:
            outputs = [p.communicate(timeout=120)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert [o.strip().splitlines()[-1] for o in outputs] == ["3.0", "3.0"]


def test_an_outsider_who_lists_the_store_reads_no_value(stores):
    """TCPStore answers ``list_keys`` to anyone: the outsider gets every name and
    every stored value, and finds the job's address in none of them."""
    job, outsider, _ = stores
    job.set("rank0/address", b"10.0.0.1:4000")
    assert job.get("rank0/address") == b"10.0.0.1:4000"  # landed (a round trip)
    names = outsider.list_keys()
    assert any(name.endswith("/rank0/address") for name in names), names
    for name in names:
        value = outsider.get(name)
        assert b"10.0.0.1" not in value and b"4000" not in value, (name, value)


def test_a_value_from_another_attempt_is_refused(stores):
    """A value captured in attempt 0 of a --max_restarts job, replayed into
    attempt 1 under attempt 1's name, does not open there."""
    _, outsider, server = stores
    first = KeyedStore(server, KEY, attempt=0)
    second = KeyedStore(server, KEY, attempt=1)
    first.set("rank0/address", b"10.0.0.1:4000")
    assert first.get("rank0/address") == b"10.0.0.1:4000"
    assert not second.check(["rank0/address"])  # another attempt's names
    captured = server.get(first._name("rank0/address"))
    outsider.set(second._name("rank0/address"), captured)
    outsider.get(second._name("rank0/address"))  # landed
    with pytest.raises(WorkerFailedError, match="or by another attempt of the job"):
        second.get("rank0/address")


# -- fleetfeed's own store: CurveStore -----------------------------------------------


# The threads a store's server and clients run: none may outlive its test
# (a later test forks Hogwild processes only when no other thread runs).
STORE_THREADS = ("ps-client-io", "ps-server-io", "ps-zap", "ps-call", "store-reaper")


def _store_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(STORE_THREADS)]


@pytest.fixture(autouse=True)
def no_store_thread_left():
    yield
    _until(lambda: not _store_threads(), timeout=10)


@pytest.fixture
def curve_store():
    """A CurveStore served in this process on 127.0.0.1, and its port."""
    with reserved_ports(1) as (port,):
        server = CurveStore("127.0.0.1", port, KEY, True, TIMEOUT)
        try:
            yield server, port
        finally:
            server.close()


def test_the_curve_store_keeps_tcpstores_semantics(curve_store):
    server, port = curve_store
    client = CurveStore("127.0.0.1", port, KEY, False, TIMEOUT)
    try:
        server.set("rank0/address", b"10.0.0.1:4000")
        assert client.get("rank0/address") == b"10.0.0.1:4000"
        assert client.add("members", 1) == 1 and server.add("members", 2) == 3
        assert client.get("members") == b"3"  # a counter reads as its decimal text
        assert client.compare_set("leader", "", b"rank0") == b"rank0"  # absent: set
        assert client.compare_set("leader", b"rank1", b"rank2") == b"rank0"  # unchanged
        assert client.compare_set("absent", b"x", b"y") == b"x"  # TCPStore's answer
        assert not client.check(["absent"])
        assert client.multi_get(["leader", "members"]) == [b"rank0", b"3"]
        assert client.num_keys() == 3
        assert client.delete_key("leader") and not client.delete_key("leader")
        assert not client.check(["leader"]) and client.check(["members", "rank0/address"])
        with pytest.raises(dist.DistStoreError, match="timed out after 0.3s"):
            client.wait(["never"], datetime.timedelta(seconds=0.3))
        with pytest.raises(dist.DistStoreError, match="not a counter"):
            client.add("rank0/address", 1)
    finally:
        client.close()


def test_a_get_waits_for_the_value_another_process_sets(curve_store):
    server, port = curve_store
    setter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import datetime, time
        from trainer.job.store import CurveStore
        time.sleep(0.5)
        store = CurveStore("127.0.0.1", {port}, {KEY!r}, False, datetime.timedelta(seconds=30))
        store.set("late", b"arrived")
        store.close()
    """)])
    try:
        server.set_timeout(datetime.timedelta(seconds=60))  # the setter imports torch
        assert server.get("late") == b"arrived"
    finally:
        assert setter.wait(timeout=60) == 0


def test_a_peer_without_the_key_reaches_no_entry(curve_store):
    """Another job's key, the right key of another attempt, and torch's own
    TCPStore client: none of them reads, writes, lists or deletes anything."""
    server, port = curve_store
    server.set("rank0/address", b"10.0.0.1:4000")
    short = datetime.timedelta(seconds=1)
    others = [
        CurveStore("127.0.0.1", port, "another-jobs-key-0123456789", False, short),
        CurveStore("127.0.0.1", port, KEY, False, short, attempt=1),
    ]
    try:
        for other in others:
            with pytest.raises(dist.DistStoreError, match="lacks the job.s key for this attempt"):
                other.delete_key("rank0/address")
            with pytest.raises(dist.DistStoreError, match="lacks the job.s key for this attempt"):
                other.set("rank0/address", b"6.6.6.6:4000")
    finally:
        for other in others:
            other.close()
    with pytest.raises(Exception):  # noqa: B017 - torch raises several types here
        outsider = dist.TCPStore("127.0.0.1", port, None, False, short)
        outsider.list_keys()
    assert server.get("rank0/address") == b"10.0.0.1:4000" and server.num_keys() == 1


def test_what_a_key_holder_can_make_the_store_hold_is_bounded(curve_store, monkeypatch):
    server, _ = curve_store
    value = b"x" * (1 << 20)
    written = 0
    with pytest.raises(dist.DistStoreError, match="would pass its limit of 67108864"):
        for i in range(100):
            server.set(f"flood/{i}", value)
            written += 1
    assert written == 63  # 64 MiB, names included, is the bound
    assert server.get("flood/0") == value  # what it holds stays readable
    for i in range(written):
        assert server.delete_key(f"flood/{i}")
    server.set("after/the/flood", b"fits again")
    monkeypatch.setattr(store_module, "MAX_ENTRIES", 5)
    for i in range(4):
        server.set(f"entry/{i}", b"")
    with pytest.raises(dist.DistStoreError, match="maximum of 5 entries"):
        server.set("entry/4", b"")
    # Names count in UTF-8 bytes (1,200 here for 600 characters), values to a frame.
    with pytest.raises(dist.DistStoreError, match="at most 1024 bytes .UTF-8., found 1200"):
        server.set("é" * 600, b"")
    with pytest.raises(dist.DistStoreError, match="a value of at most 1048576 bytes"):
        server.set("big", b"x" * ((1 << 20) + 1))
    with pytest.raises(dist.DistStoreError, match="at most 64 names in one call, found 65"):
        server.wait([f"n{i}" for i in range(65)], datetime.timedelta(seconds=1))
    # Each connection's unread replies are bounded (ZeroMQ's default holds 1,000).
    assert server._server._router.sndhwm == store_module.MAX_QUEUED_REPLIES


def _blocked(store: CurveStore, names: list[str], seconds: float) -> threading.Thread:
    """A thread blocked in ``store.wait(names)`` (its timeout ends it)."""
    def wait() -> None:
        with contextlib.suppress(dist.DistStoreError):
            store.wait(names, datetime.timedelta(seconds=seconds))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def _until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.02)


def test_blocked_calls_are_bounded_in_number_and_time(curve_store, monkeypatch):
    server, port = curve_store
    entries = server._entries
    monkeypatch.setattr(store_module, "MAX_WAITERS", 3)
    clients = [CurveStore("127.0.0.1", port, KEY, False, TIMEOUT) for _ in range(4)]
    try:
        threads = [_blocked(c, [f"never/{i}"], 20) for i, c in enumerate(clients[:3])]
        _until(lambda: entries._waiting == 3)
        with pytest.raises(dist.DistStoreError, match="maximum of blocked calls .3 of 3"):
            clients[3].wait(["never/3"], datetime.timedelta(seconds=20))
        # A blocked call that asks for years waits at most MAX_WAIT_S.
        monkeypatch.setattr(store_module, "MAX_WAITERS", 4)
        threads.append(_blocked(clients[3], ["never/4"], 10**9))
        _until(lambda: entries._waiting == 4)
        assert max(d for d, _, _ in entries._deadlines) <= (
            time.monotonic() + store_module.MAX_WAIT_S + 1
        )
    finally:
        for client in clients:
            client.close()  # the blocked calls fail at once
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_a_blocked_wait_ends_when_all_its_names_exist_at_once(curve_store):
    server, port = curve_store
    client = CurveStore("127.0.0.1", port, KEY, False, datetime.timedelta(seconds=30))
    try:
        waiting = _blocked(client, ["a", "b"], 30)
        _until(lambda: server._entries._waiting == 1)
        server.set("a", b"1")
        server.delete_key("a")  # gone again before "b" comes
        server.set("b", b"2")
        time.sleep(0.3)
        assert waiting.is_alive() and server._entries._waiting == 1
        server.set("a", b"3")
        waiting.join(timeout=30)
        assert not waiting.is_alive() and server._entries._waiting == 0
        assert client.multi_get(["a", "b"]) == [b"3", b"2"]
        clone = client.clone()
        try:
            assert clone.get("b") == b"2"
        finally:
            clone.close()
    finally:
        client.close()


def test_a_client_waits_for_a_server_that_starts_late(monkeypatch):
    """A rank whose rank 0 is slow to start keeps trying for the store's
    timeout, as TCPStore's client does (a short round-trip slack failed it)."""
    monkeypatch.setattr(store_module, "_SLACK_S", 0.5)
    with reserved_ports(1) as (port,):
        client = CurveStore("127.0.0.1", port, KEY, False, datetime.timedelta(seconds=60))
        late: list[CurveStore] = []
        starter = threading.Timer(2.0, lambda: late.append(
            CurveStore("127.0.0.1", port, KEY, True, datetime.timedelta(seconds=60))
        ))
        starter.start()
        try:
            client.set("early", b"written once the server is up")
            starter.join()
            assert late[0].get("early") == b"written once the server is up"
        finally:
            starter.join()
            client.close()
            for server in late:
                server.close()


def test_ranks_of_torchruns_restarts_keep_to_their_own_names(curve_store, monkeypatch):
    """Under fleetrun's torchrun agent the store outlives torchrun's restarts,
    keyed for its start: restart N's ranks use those keys, under their own prefix."""
    from trainer.job import bind

    server, port = curve_store
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv(bind.AGENT_STORE_ENV, "curve")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    monkeypatch.delenv("FLEETFEED_RESTART_COUNT", raising=False)
    rank = bind.rendezvous_store("127.0.0.1", port, 1, 2, TIMEOUT, KEY)
    try:
        rank.set("rank1/address", b"10.0.0.2:4000")
        assert server.get("/worker/attempt_1/rank1/address") == b"10.0.0.2:4000"
        assert not rank.check(["/worker/attempt_1/rank1/address"])  # its names only
    finally:
        rank.close()


def test_the_agent_refuses_a_rendezvous_whose_store_it_cannot_replace():
    result = subprocess.run(
        [sys.executable, "-m", "trainer.job.bind", "--rdzv-backend", "c10d", "job.py"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode != 0
    assert "--rdzv-backend asks for a rendezvous whose TCPStore this agent cannot" in (
        result.stderr
    ), result.stderr


_STORE_HOST = textwrap.dedent("""
    import datetime, json, os, sys
    from trainer.job.store import CurveStore
    store = CurveStore("127.0.0.1", int(sys.argv[1]), sys.argv[2], True,
                       datetime.timedelta(seconds=30))
    print(json.dumps({"pid": os.getpid()}), flush=True)
    sys.stdin.read()
    store.close()
""")


@pytest.mark.slow
@pytest.mark.distributed
def test_a_store_flood_costs_its_host_little(tmp_path):
    """An outsider's 20 connections announcing 2 GiB each, and a key holder
    writing until refused: rank 0, which serves the store, grows by what the
    bounds allow and keeps serving. (TCPStore grew by 364 MB for 350 MiB.)"""
    with reserved_ports(1) as (port,), open(tmp_path / "host.log", "wb") as log:
        host = subprocess.Popen(
            [sys.executable, "-c", _STORE_HOST, str(port), KEY],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
        )
        target = wire_fuzz.Target(host, f"127.0.0.1:{port}", tmp_path / "host.log")
        try:
            assert json.loads(host.stdout.readline())["pid"] == host.pid
            job = CurveStore("127.0.0.1", port, KEY, False, TIMEOUT)
            job.set("rank0/address", b"10.0.0.1:4000")
            before = target.rss_mib()
            connections, _ = wire_fuzz.open_announcing_connections(
                "127.0.0.1", port, count=20, announced=2**31, payload_bytes=16 << 20
            )
            try:
                outsider_peak = target.rss_mib()
                assert job.get("rank0/address") == b"10.0.0.1:4000"
            finally:
                for sock in connections:
                    sock.close()
            with pytest.raises(dist.DistStoreError, match="would pass its limit"):
                for i in range(200):
                    job.set(f"flood/{i}", b"y" * (1 << 20))
            holder_peak = target.rss_mib()
            assert job.get("rank0/address") == b"10.0.0.1:4000"
            job.close()
            assert target.alive(), target.log()[-3000:]
        finally:
            target.stop()
            host.stdout.close()
    assert outsider_peak - before <= 64, (before, outsider_peak)
    # 64 MiB of entries, plus the transient copies of the last message or two.
    assert holder_peak - before <= 64 + 32, (before, holder_peak)


def _greeting_mechanism(port: int) -> bytes:
    """The security mechanism a ZMTP server on ``port`` announces (its greeting)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(wire_fuzz.ZMTP_CURVE_GREETING)
        greeting = b""
        while len(greeting) < 64:
            chunk = sock.recv(64 - len(greeting))
            if not chunk:
                break
            greeting += chunk
    return greeting[12:32].rstrip(b"\0")


@pytest.mark.distributed
def test_fleetruns_torchrun_agent_serves_the_bounded_store(tmp_path):
    """``fleetrun --nproc_per_node``: the port the ranks rendezvous on speaks
    CURVE (the agent serves a CurveStore, not a TCPStore), and the group forms."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import os, sys, time, torch
        from trainer import fleet
        fleet.init(is_collective=True)
        flag = sys.argv[1]
        if fleet.worker_index() == 0:
            open(flag + ".ready", "w").close()
        while not os.path.exists(flag + ".go"):
            time.sleep(0.05)
        total = fleet.util.all_reduce(torch.tensor([1.0]), "sum")
        with open(f"{flag}.{fleet.worker_index()}", "w") as out:
            out.write(str(int(total.item())))
    """))
    flag = str(tmp_path / "flag")
    with reserved_ports(1) as (port,):
        job = subprocess.Popen(
            [sys.executable, "-m", "trainer.job.launch", "--nproc_per_node=2",
             f"--master_port={port}", "--log_dir", str(tmp_path / "logs"), str(script), flag],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not Path(flag + ".ready").exists():
                assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
                time.sleep(0.1)
            assert _greeting_mechanism(port) == b"CURVE"
            with pytest.raises(Exception):  # noqa: B017 - torch raises several types here
                dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=1))
            Path(flag + ".go").touch()
            output = job.communicate(timeout=120)[0]
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
    assert job.returncode == 0, output
    assert [Path(f"{flag}.{rank}").read_text() for rank in (0, 1)] == ["2", "2"], output


def test_one_reply_is_bounded_too(curve_store):
    """multi_get answers many values at once: its reply is bounded, so a peer
    that never reads its replies holds at most 16 of MAX_REPLY_BYTES."""
    server, _ = curve_store
    for i in range(5):
        server.set(f"big/{i}", b"v" * (1 << 20))
    assert server.multi_get([f"big/{i}" for i in range(4)])[3] == b"v" * (1 << 20)
    with pytest.raises(dist.DistStoreError, match="at most 4194304 bytes in all for one call"):
        server.multi_get([f"big/{i}" for i in range(5)])
