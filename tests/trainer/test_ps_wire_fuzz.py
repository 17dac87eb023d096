"""A key holder's fuzzed messages against a real parameter server, for a few seconds.

``tests/helpers/wire_fuzz.py`` mutates valid requests (random bytes, huge
integers, deep nesting, bad shapes and dtypes, truncations, wrong frame counts)
and sends them to a server process serving the real handlers; after every
batch the server must answer a legitimate request. ``benchmarks/fuzz_ps_wire.py``
runs the same for millions of messages. ``FLEETFEED_FUZZ_SEED`` picks another seed.
"""

from __future__ import annotations

import os

import pytest
import wire_fuzz
from support import reserved_ports

from trainer.ps import server, wire

FUZZ_SECONDS = 12.0
BATCH = 400


def test_seeds_are_valid_requests_for_every_server_operation():
    # An operation without a seed would only be reached by mutations of others'.
    seeded = []
    for frames in wire_fuzz.seed_messages():
        header, body = wire.decode(frames)  # as the server's endpoint reads a request
        wire.check_args(header.get("op"), body)  # a seed the wire refuses fuzzes nothing
        seeded.append(header["op"])
    missing = sorted(set(server.HANDLERS) - set(seeded))
    assert not missing, (
        f"expected a seed message for every operation of trainer.ps.server.HANDLERS, "
        f"found none for {missing} (add them to wire_fuzz.seed_messages)"
    )


@pytest.mark.slow
@pytest.mark.distributed
def test_fuzzed_messages_from_a_key_holder_never_stop_the_server(tmp_path):
    seed = int(os.environ.get("FLEETFEED_FUZZ_SEED", "25"))
    rss = []
    with reserved_ports(1) as (port,):
        endpoint = f"127.0.0.1:{port}"
        with wire_fuzz.running_target(endpoint, tmp_path / "target.log") as target:
            try:
                counts = wire_fuzz.fuzz(
                    endpoint, seed, messages=10**9, seconds=FUZZ_SECONDS, batch=BATCH,
                    on_batch=lambda _: rss.append(target.rss_mib()),
                )
            except wire_fuzz.ServerDied as died:
                pytest.fail(f"seed {seed}: {died}\nserver log:\n{target.log()[-3000:]}")
            assert target.alive(), f"seed {seed}: the server exited\n{target.log()[-3000:]}"
            log = target.log()
    where = f"seed {seed}, {counts}"
    assert counts.liveness_checks >= 5, where
    # Most mutations are refused with an answer; some stay valid calls that ran.
    assert counts.error_replies > counts.sent // 4, where
    assert counts.result_replies > 0, where
    # Refusals are logged at most once per 10 s (with a count), not per message.
    assert log.count("refused a message") <= 3, log[-3000:]
    # The first batches warm the server up (the table's rows, the allocator).
    assert max(rss) - rss[min(2, len(rss) - 1)] < 64, (where, rss)
