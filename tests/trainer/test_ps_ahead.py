"""An async worker sends the pulls of the batches to come before their forwards
(trainer/embedding/ahead.py) and keeps a bounded number of pushes in flight
(trainer/ps/modes.py), issue 28.

The jobs run ``Executor.train_from_dataset`` against real ``ParameterServer``
objects whose handlers run in this process (``InProcessServers``). The model's
one table has rows of width 1, SGD at lr 1, and a loss that is the sum of the
rows looked up: each push lowers a row by the count of its id in the batch,
whatever the rows were. So the rows a forward sees say exactly which pushes
were applied before its pull, and the final rows say whether every push
arrived once.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pytest
import torch
import zmq
from support import InProcessServers
from torch import nn

from datafeed import Ragged
from trainer import Executor
from trainer.embedding import ahead, pending, stores
from trainer.job.errors import TrainerError
from trainer.job.strategy import DistributedStrategy, async_settings
from trainer.nn import SparseEmbedding
from trainer.ps import DistributedOptimizer, OptimizerSpec
from trainer.ps.modes import AsyncMode, WorkerLink, distributed_mode
from trainer.ps.server import ParameterServer

VOCAB = 6
BATCHES = 12
RECORDS = 8


def make_batches(seed: int = 5) -> list[dict]:
    """Batches of one id per record (slot "a"): every id of 1..6 once, in a
    random order, and two more (so that every push moves every row)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(BATCHES):
        extra = rng.integers(1, VOCAB + 1, RECORDS - VOCAB)
        picks = np.concatenate([np.arange(1, VOCAB + 1), extra])
        ids = torch.from_numpy(rng.permutation(picks).astype(np.int64))
        out.append({"a": Ragged(ids, torch.arange(RECORDS + 1)), "y": torch.zeros(RECORDS)})
    return out


def counts(batch: dict) -> np.ndarray:
    """How many times each id 1..VOCAB is in the batch (a push's step, at lr 1)."""
    return np.bincount(batch["a"].values.numpy(), minlength=VOCAB + 1)[1:].astype(np.float32)


class SumOfRows(nn.Module):
    """Loss = sum of the rows of slot "a"'s ids; records the rows each forward
    saw (per id 1..VOCAB). ``use(batch_number, batch)`` picks the ids tensor
    the table is given (None: the table is not used for that batch)."""

    def __init__(self, name: str, use=None) -> None:
        super().__init__()
        self.emb = SparseEmbedding(1, name, optimizer={"type": "sgd", "lr": 1.0})
        self.bias = nn.Parameter(torch.zeros(1))
        self.use = use or (lambda number, batch: batch["a"])
        self.seen: list[dict[int, float]] = []

    def forward(self, batch: dict) -> dict:
        given = self.use(len(self.seen), batch)
        if given is None:
            self.seen.append({})
            return {"loss": self.bias.sum() * 0.0 + self.bias.sum()}
        rows = self.emb(given)
        ids, values = batch["a"].values.tolist(), rows.detach().reshape(-1).tolist()
        self.seen.append({i: float(r) for i, r in zip(ids, values, strict=True)})
        return {"loss": rows.sum() + self.bias.sum()}


def job(model: SumOfRows, pull_ahead: int | None, servers_cls=InProcessServers,
        max_pushes: int = 16):
    """An async worker of one in-process server: its optimizer and servers
    (``max_pushes``: above the default 2, so that the depth bounds them)."""
    torch_opt = torch.optim.SGD(model.parameters(), lr=1.0)
    spec = OptimizerSpec.from_torch(torch_opt)
    dense = nn.Parameter(torch.zeros(1))
    server = ParameterServer(
        0, 1, 1, "async", {model.emb.name: model.emb.config.make_table(spec)},
        [dense], torch.optim.SGD([dense], lr=1.0),
    )
    mode = AsyncMode(pull_ahead, max_pushes)
    mode.use(torch_opt, [model.bias])
    servers = servers_cls([server])
    stores.install_store(mode.connect(WorkerLink(0, servers, lambda c: c.make_table(spec))))
    return DistributedOptimizer(torch_opt, mode.step), mode, servers, server


@pytest.fixture
def restore_store():
    yield
    stores.install_store(None)
    pending.clear_pending()


def initial_rows(model: SumOfRows) -> np.ndarray:
    table = model.emb.config.make_table(OptimizerSpec.from_config({"type": "sgd", "lr": 1.0}))
    return table.init_rows(np.arange(1, VOCAB + 1, dtype=np.uint64))[:, 0]


def server_rows(server: ParameterServer, name: str) -> np.ndarray:
    return server.table(name).pull(np.arange(1, VOCAB + 1, dtype=np.uint64), create=False)[:, 0]


def pushes_seen(model: SumOfRows, batches: list[dict], init: np.ndarray) -> list[int]:
    """For each forward, how many of the batches before it had been pushed
    when its rows were pulled (read off the rows it saw)."""
    steps = np.cumsum([np.zeros(VOCAB, np.float32)] + [counts(b) for b in batches], axis=0)
    out = []
    for seen in model.seen:
        ids = np.array(sorted(seen)) - 1
        rows = np.array([seen[i + 1] for i in ids])
        matches = [k for k in range(len(steps)) if np.allclose(rows, init[ids] - steps[k][ids])]
        out.append(matches[-1] if matches else -1)
    return out


def test_pulls_sent_ahead_are_exactly_depth_steps_stale_and_every_push_lands_once(
    restore_store,
):
    model = SumOfRows("ahead_exact")
    opt, _, _, server = job(model, pull_ahead=2)
    batches = make_batches()
    summary = Executor().train_from_dataset(model, batches, opt, thread=1)
    init = initial_rows(model)
    # Batch 0 learns the slot; batches 1 (held while 0 ran) is pulled in its
    # forward; from then on batch i was pulled before the forward of i - 2.
    assert pushes_seen(model, batches, init) == [0, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    total = np.sum([counts(b) for b in batches], axis=0)
    np.testing.assert_allclose(server_rows(server, "ahead_exact"), init - total, rtol=0, atol=1e-5)
    assert summary.pulls_ahead == {"depth": 2, "sent": BATCHES - 2, "taken": BATCHES - 2}


def test_without_pulls_ahead_each_forward_sees_every_push_before_it(restore_store):
    model = SumOfRows("ahead_off")
    opt, _, _, server = job(model, pull_ahead=0)
    batches = make_batches()
    summary = Executor().train_from_dataset(model, batches, opt, thread=1)
    init = initial_rows(model)
    assert pushes_seen(model, batches, init) == list(range(BATCHES))
    assert summary.pulls_ahead is None


def test_ids_the_model_computes_are_pulled_in_the_forward(restore_store):
    # ids + 0 is a new tensor: not a slot of the batch, so nothing is sent ahead.
    model = SumOfRows("ahead_computed", use=lambda n, b: Ragged(b["a"].values + 0, b["a"].offsets))
    opt, _, _, server = job(model, pull_ahead=3)
    batches = make_batches()
    summary = Executor().train_from_dataset(model, batches, opt, thread=1)
    assert pushes_seen(model, batches, initial_rows(model)) == list(range(BATCHES))
    assert summary.pulls_ahead is None


def test_a_pull_its_forward_does_not_take_is_dropped_with_a_warning(restore_store, caplog):
    # The table is used for the first three batches only: the pulls sent for
    # batches 3 and 4 are never taken, and must not train anything.
    model = SumOfRows("ahead_skipped", use=lambda n, b: b["a"] if n < 3 else None)
    opt, _, _, server = job(model, pull_ahead=2)
    batches = make_batches()
    with caplog.at_level(logging.WARNING, logger="trainer.embedding"):
        summary = Executor().train_from_dataset(model, batches, opt, thread=1)
    init = initial_rows(model)
    trained = np.sum([counts(b) for b in batches[:3]], axis=0)
    rows = server_rows(server, "ahead_skipped")
    np.testing.assert_allclose(rows, init - trained, rtol=0, atol=1e-5)
    warnings = [r.getMessage() for r in caplog.records if "ahead_skipped" in r.getMessage()]
    assert len(warnings) == 1 and "slot 'a'" in warnings[0]
    # Sent for batches 2 to 5 (then the source was forgotten); batch 2's was taken.
    assert summary.pulls_ahead == {"depth": 2, "sent": 4, "taken": 1}


def test_ids_changed_in_place_after_their_pull_was_sent_are_pulled_again(restore_store):
    def bump(n, batch):
        if n == 4:  # after its pull was sent: the forward must see ids + 1's rows
            batch["a"].values.add_(1).clamp_(max=VOCAB)
        return batch["a"]

    model = SumOfRows("ahead_inplace", use=bump)
    opt, _, _, server = job(model, pull_ahead=2)
    batches = make_batches()
    Executor().train_from_dataset(model, batches, opt, thread=1)
    init = initial_rows(model)
    # Batch 4's rows are those of its changed ids, pulled in its forward.
    seen = pushes_seen(model, batches, init)
    assert seen[4] == 4 and seen[5] == 3
    total = np.sum([counts(b) for b in batches], axis=0)  # batch 4 counted as changed
    rows = server_rows(server, "ahead_inplace")
    np.testing.assert_allclose(rows, init - total, rtol=0, atol=1e-5)


class SlowServers(InProcessServers):
    """Answers each call ``delay`` seconds after it was sent (a network's
    round trip), from a timer thread; the handler runs at once."""

    def __init__(self, servers: list, delay: float = 0.03) -> None:
        super().__init__(servers)
        self.delay = delay
        self.timers: list[threading.Timer] = []
        self.lock = threading.Lock()
        self.pushes_out = self.most_pushes_out = 0

    def call_async(self, index: int, func, *args, timeout=None) -> Future:
        done = super().call_async(index, func, *args)
        late: Future = Future()
        push = func.__name__ == "push"
        if push:
            with self.lock:
                self.pushes_out += 1
                self.most_pushes_out = max(self.most_pushes_out, self.pushes_out)

        def answer() -> None:
            if push:
                with self.lock:
                    self.pushes_out -= 1
            try:
                late.set_result(done.result(timeout=10))
            except Exception as error:  # noqa: BLE001 - handed to the waiter
                late.set_exception(error)

        timer = threading.Timer(self.delay, answer)
        timer.daemon = True
        self.timers.append(timer)
        timer.start()
        return late


def test_the_depth_follows_the_round_trip_and_bounds_the_pushes_in_flight(restore_store):
    model = SumOfRows("ahead_auto")
    opt, mode, servers, server = job(
        model, pull_ahead=None, servers_cls=lambda s: SlowServers(s, delay=0.15)
    )
    batches = make_batches() * 4  # 48 steps: the depth is chosen every 8
    summary = Executor().train_from_dataset(model, batches, opt, thread=1)
    mode.settle()
    for timer in servers.timers:
        timer.join(timeout=10)
    # A 150 ms round trip over steps of a few ms: several batches ahead (a step
    # would need 75 ms to leave it at 3), never more than the bound. (With a
    # 30 ms round trip, steps of 5-20 ms beside ten busy loops on this 2-core
    # machine left it at 4-5.)
    assert 3 < summary.pulls_ahead["depth"] <= ahead.MAX_DEPTH
    # The pushes went out without waiting for each other, as many as the depth.
    assert 3 < servers.most_pushes_out <= ahead.MAX_DEPTH
    total = np.sum([counts(b) for b in batches], axis=0)
    np.testing.assert_allclose(
        server_rows(server, "ahead_auto"), initial_rows(model) - total, rtol=0, atol=1e-4
    )


class HeldServers(InProcessServers):
    """Answers pushes only when the test releases them, oldest first."""

    def __init__(self, servers: list) -> None:
        super().__init__(servers)
        self.lock = threading.Lock()
        self.held: list[tuple[Future, Future]] = []

    def call_async(self, index: int, func, *args, timeout=None) -> Future:
        done = super().call_async(index, func, *args)
        if func.__name__ != "push":
            return done
        late: Future = Future()
        with self.lock:
            self.held.append((done, late))
        return late

    def release(self) -> bool:
        with self.lock:
            if not self.held:
                return False
            done, late = self.held.pop(0)
        late.set_result(done.result())
        return True


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_a_step_waits_only_when_its_bound_of_pushes_is_in_flight(restore_store):
    model = SumOfRows("ahead_bound")
    opt, mode, servers, server = job(model, pull_ahead=3, servers_cls=HeldServers)
    batches = make_batches()
    errors: list[BaseException] = []

    def train() -> None:
        try:
            Executor().train_from_dataset(model, batches, opt, thread=1)
            mode.settle()
        except BaseException as error:  # noqa: BLE001 - the test reports it
            errors.append(error)

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        # Three pushes go out unanswered; the fourth step waits for the oldest.
        assert wait_until(lambda: len(servers.held) == 3)
        trainer.join(timeout=0.5)
        assert trainer.is_alive() and len(servers.held) == 3
        servers.release()
        assert wait_until(lambda: len(servers.held) == 3 and len(model.seen) == 5)
    finally:
        while trainer.is_alive():
            servers.release()
            trainer.join(timeout=0.01)
    assert not errors
    total = np.sum([counts(b) for b in batches], axis=0)
    rows = server_rows(server, "ahead_bound")
    np.testing.assert_allclose(rows, initial_rows(model) - total, rtol=0, atol=1e-5)
    # The pass is over: a loop of the user's own keeps one push in flight.
    assert ahead.thread_depth() == 1 and mode.pushes_in_flight() == 1


def test_the_push_bound_caps_the_pushes_in_flight(restore_store):
    model = SumOfRows("ahead_cap")
    _, mode, _, _ = job(model, pull_ahead=8)
    pass_of_this_thread = ahead.PullAhead(stores.current_store(), stores.distinct_of)
    assert ahead.thread_depth() == 8 and mode.pushes_in_flight() == 8
    mode.max_pushes = 2
    assert mode.pushes_in_flight() == 2
    pass_of_this_thread.close()
    assert mode.pushes_in_flight() == 1


def test_a_slot_replaced_in_the_forward_is_pulled_for_its_new_ids(restore_store, caplog):
    def replace(n, batch):
        if n >= 3:  # a new tensor under the same slot: every id becomes 1
            batch["a"] = Ragged(torch.ones_like(batch["a"].values), batch["a"].offsets)
        return batch["a"]

    model = SumOfRows("ahead_replaced", use=replace)
    opt, _, _, server = job(model, pull_ahead=2)
    batches = make_batches()
    originals = [b["a"].values.clone() for b in batches]
    with caplog.at_level(logging.WARNING, logger="trainer.embedding"):
        Executor().train_from_dataset(model, batches, opt, thread=1)
    init = initial_rows(model)
    expected = init.copy()
    for number, ids in enumerate(originals):
        trained = ids.numpy() if number < 3 else np.ones_like(ids.numpy())
        expected -= np.bincount(trained, minlength=VOCAB + 1)[1:]
    np.testing.assert_allclose(server_rows(server, "ahead_replaced"), expected, rtol=0, atol=1e-5)
    assert any("ahead_replaced" in r.getMessage() and "replaced" in r.getMessage()
               for r in caplog.records)


def test_two_threads_each_send_their_pulls_and_every_push_lands_once(restore_store):
    model = SumOfRows("ahead_threads")
    opt, _, _, server = job(model, pull_ahead=2)
    batches = make_batches() * 3
    summary = Executor().train_from_dataset(model, batches, opt, thread=2)
    total = np.sum([counts(b) for b in batches], axis=0)
    rows = server_rows(server, "ahead_threads")
    np.testing.assert_allclose(rows, initial_rows(model) - total, rtol=0, atol=1e-4)
    assert summary.batches == len(batches)
    assert summary.pulls_ahead["taken"] == summary.pulls_ahead["sent"] > len(batches) // 2


class FailingServers(InProcessServers):
    """Fails every pull from the ``after``-th on, as a server that lost its table."""

    def __init__(self, servers: list, after: int = 6) -> None:
        super().__init__(servers)
        self.after = after
        self.pulls = 0

    def call_async(self, index: int, func, *args, timeout=None) -> Future:
        if func.__name__ == "pull_step":
            self.pulls += 1
            if self.pulls >= self.after:
                failed: Future = Future()
                failed.set_exception(RuntimeError("server 0 lost its table"))
                return failed
        return super().call_async(index, func, *args)


def test_a_pull_ahead_that_failed_fails_the_pass_and_the_thread_starts_afresh(restore_store):
    model = SumOfRows("ahead_failed")
    opt, mode, _, _ = job(model, pull_ahead=3, servers_cls=FailingServers)
    with pytest.raises(RuntimeError, match="lost its table"):
        Executor().train_from_dataset(model, make_batches(), opt, thread=1)
    assert len(model.seen) < BATCHES
    assert ahead.thread_depth() == 1 and ahead.current() is None


class SerialServers(InProcessServers):
    """Answers one call at a time, each after ``service`` seconds: a server
    that is itself the limit, whatever the network."""

    # The call that stalls (None: none), and for how long: a busy machine.
    stall_at: int | None = None
    stall = 0.200

    def __init__(self, servers: list, service: float = 0.020) -> None:
        super().__init__(servers)
        self.service = service
        self.pool = ThreadPoolExecutor(1)
        self.served = 0

    def call_async(self, index: int, func, *args, timeout=None) -> Future:
        self.served += 1
        stalls = self.served == self.stall_at

        def serve():
            time.sleep(self.service + (self.stall if stalls else 0.0))
            return InProcessServers.call_async(self, index, func, *args).result()

        return self.pool.submit(serve)


class StallingSerialServers(SerialServers):
    stall_at = 9  # a pull of the first window, before any deepening


@pytest.mark.parametrize("servers_cls", [SerialServers, StallingSerialServers])
def test_the_depth_stays_low_when_the_server_is_the_limit(restore_store, servers_cls):
    def slow_step(number, batch):
        time.sleep(0.002)
        return batch["a"]

    # Each step costs the server 40 ms whatever is in flight, and the model
    # about 2.6 ms: were the round trip the limit, a deepening to 16 would
    # cut the ~38 ms waits to nothing, and half that counts as a gain. A
    # busy machine's wake-ups, which a deeper pipeline does hide, moved the
    # median wait by -5 to +9 ms (ten runs beside three busy loops on this
    # 2-core machine; beside a 4 ms server they made some runs stay deep).
    model = SumOfRows("ahead_serial", use=slow_step)
    opt, mode, servers, server = job(model, pull_ahead=None, servers_cls=servers_cls)
    batches = make_batches() * 4
    try:
        summary = Executor().train_from_dataset(model, batches, opt, thread=1)
        mode.settle()
    finally:
        servers.pool.shutdown(wait=True)
    # Deeper did not cut the waits: the depth went back where it was, also
    # when one stall of the first window made its mean wait 29 ms longer
    # (200 ms over 7 waits) than the waits at the deeper depth.
    assert summary.pulls_ahead["depth"] <= 2
    total = np.sum([counts(b) for b in batches], axis=0)
    rows = server_rows(server, "ahead_serial")
    np.testing.assert_allclose(rows, initial_rows(model) - total, rtol=0, atol=1e-4)


def test_the_strategy_carries_pull_ahead_and_the_push_bound():
    strategy = DistributedStrategy()
    assert async_settings(strategy) == (None, 2)
    strategy.a_sync_configs = {"pull_ahead": 0, "send_queue_size": 4, "pushes_in_flight": 8}
    assert async_settings(strategy) == (0, 4)  # send_queue_size caps it
    strategy.a_sync_configs = {"pushes_in_flight": 3}
    mode = distributed_mode("async", 0, *async_settings(strategy))
    assert (mode.pull_ahead, mode.max_pushes) == (0, 3)
    with pytest.raises(ValueError, match=r"pull_ahead.*got 17"):
        strategy.a_sync_configs = {"pull_ahead": 17}
    for key in ("send_queue_size", "pushes_in_flight"):
        with pytest.raises(ValueError, match=rf"{key}.*got 0"):
            strategy.a_sync_configs = {key: 0}
    with pytest.raises(TrainerError, match="pull_ahead"):
        AsyncMode(pull_ahead=-2)


def test_a_dropped_pull_to_a_server_that_never_answers_holds_nothing():
    # A ROUTER that takes requests and never answers: the worker's transport
    # must not keep a call that nobody waits for.
    from support import reserved_ports

    from trainer.ps import server as handlers
    from trainer.ps import transport

    context = zmq.Context()
    with reserved_ports(1) as (port,):
        silent = context.socket(zmq.ROUTER)
        silent.linger = 0
        silent.bind(f"tcp://127.0.0.1:{port}")
        servers = transport.ServerSet([f"127.0.0.1:{port}"], None, timeout=30)
        try:
            ids = torch.zeros(2, dtype=torch.int64)
            future = servers.call_async(0, handlers.pull_tables, ["t"], ids, False)
            assert silent.poll(10_000) and silent.recv_multipart()  # it arrived
            assert not future.done() and len(servers._pending) == 1
            servers.forget(future)
            assert future.cancelled() and not servers._pending
            servers.forget(future)  # twice: nothing to forget
        finally:
            servers.close()
            silent.close()
            context.term()
