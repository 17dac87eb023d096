"""The rendezvous store of a keyed job, attacked from outside: an outsider that
reaches the store's port finds none of the job's entries and cannot forge one."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from support import reserved_ports

from trainer.job.bind import KeyedStore, bound_store
from trainer.job.errors import WorkerFailedError

KEY = "store-tests-job-key-0123456789abcdef"
TIMEOUT = datetime.timedelta(seconds=5)


@pytest.fixture
def stores():
    """The job's keyed view of a store on 127.0.0.1, and an outsider's plain client."""
    with reserved_ports(1) as (port,):
        server = bound_store("127.0.0.1", port, None, True, TIMEOUT)
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
