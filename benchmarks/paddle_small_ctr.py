"""Paddle's side of benchmarks/bench_small_ctr.py: the small CTR model of issue 14, one process.

Runs in Paddle's own interpreter and imports nothing from fleetfeed. Two uses:

* local (``"mode": "local"``, Paddle 3.3.1, ``.venv-paddle``): one process,
  ``paddle.distributed.InMemoryDataset`` on the MultiSlot files of
  benchmarks/make_small_ctr.py, ``Executor.train_from_dataset(thread=N)``
  with N reader/trainer threads, Adagrad lr 0.1 on every parameter;
* parameter server (``"mode"``: ``async``, ``geo``, ``sync``; Paddle 3.0.0,
  ``.venv-paddle30``, the last CPU build with the PS runtime): one server or
  worker of a 1 server + 2 workers job, started by bench_small_ctr.py, which
  also stops the server (Paddle 3.0.0's server only ends when told to), as
  benchmarks/paddle_ps.py does for wide&deep.

The model as a static program (the old IR, ``FLAGS_enable_pir_api=0``: under
PIR the dataset marks every slot dense and the PS passes are missing): the
dense slot (4 floats) concatenated with three sparse slots, each through
``paddle.static.nn.embedding(is_sparse=True)`` of width 4 and a sum
``sequence_pool`` (u: one id, i: 1-3 ids, c: one id), into fc 16 ReLU, fc 1;
sigmoid cross-entropy. The files are read as written: the ids are offset per
slot (u from 1, i from 10,001, c from 20,001), so each table has max id + 1
rows (3,001, 15,001, 20,051); rows below an offset are never read.

Optimizers: local: ``paddle.optimizer.Adagrad(0.1)`` (sparse rows updated
from SelectedRows gradients). PS: Paddle's PS takes only SGD or Adam for dense
parameters, so the MLP uses Adam (``dense_lr``); the tables use
``SparseAdaGradSGDRule`` on the server (one squared-gradient sum per row,
unlike torch's per-coordinate Adagrad: lr and initial_g2sum are set apart,
see paddle_ps.py); GEO trains local copies with the program's own optimizer
ops and pushes deltas every k steps.

Timing: the sum of the ``train_from_dataset`` calls, one per epoch; loading
and ``local_shuffle`` are not timed. Held-out AUC: the trained program's
forward part (``clone(for_test=True)``) plus Paddle's ``auc`` op over
heldout.txt, read from the op's persistent histograms (PS: on worker 0 after
both workers trained). The result is one JSON object: the last stdout line
(local) or ``<out>.<worker index>`` (PS).

Usage: paddle_small_ctr.py '<json config>' (bench_small_ctr.py builds it)
"""

from __future__ import annotations

import json
import os
import sys
import time

from paddle_ps import set_role_environment as ps_role_environment
from paddle_ps import sparse_table_config, wait_for_files, wait_for_port

DIM = 4
# Rows per table: the largest id of each slot + 1 (make_small_ctr.py's offsets).
TABLE_ROWS = {"u": 1 + 3000, "i": 10_001 + 5000, "c": 20_001 + 50}


def set_role_environment(config: dict) -> None:
    """The variables Paddle reads: the old IR always; in PS mode the job's shape
    for PaddleCloudRoleMaker (``paddle_ps.set_role_environment``)."""
    # Paddle 3's PIR lacks the PS passes and marks lod_level=1 slots dense.
    os.environ["FLAGS_enable_pir_api"] = "0"  # noqa: SIM112 (Paddle reads this exact name)
    if config["mode"] != "local":
        ps_role_environment(config)


def auc_from_histograms(positives, negatives) -> float:
    """The AUC of the auc op's persistent counts of positives and negatives per
    score bucket."""
    positives, negatives = positives.astype(float), negatives.astype(float)
    above = positives.sum() - positives.cumsum()  # positives in higher buckets
    pairs = positives.sum() * negatives.sum()
    return float((negatives * (above + positives / 2)).sum() / pairs)


def sigmoid(paddle, x):
    """A sigmoid op appended to the current program: Paddle 3.3.1's
    ``paddle.nn.functional.sigmoid`` takes only PIR values, even under the
    old IR's guard."""
    helper = paddle.base.layer_helper.LayerHelper("sigmoid")
    out = helper.create_variable_for_type_inference(x.dtype)
    helper.append_op(type="sigmoid", inputs={"X": [x]}, outputs={"Out": [out]})
    return out


def build(paddle, config: dict):
    """The static graph; returns (input variables in slot order, loss, probability, label)."""
    dense = paddle.static.data("dense", shape=[-1, 4], dtype="float32", lod_level=0)
    sparse = {
        name: paddle.static.data(name, shape=[-1, 1], dtype="int64", lod_level=1)
        for name in TABLE_ROWS
    }
    label = paddle.static.data("label", shape=[-1, 1], dtype="int64", lod_level=0)
    init = paddle.nn.initializer.Uniform(-config["init_scale"], config["init_scale"])
    pooled = []
    for name, ids in sparse.items():
        rows = paddle.static.nn.embedding(
            input=ids, size=[TABLE_ROWS[name], DIM], is_sparse=True,
            param_attr=paddle.ParamAttr(name=f"emb_{name}", initializer=init),
        )
        # [ids, 1, DIM] rows summed per record, then [records, DIM].
        summed = paddle.static.nn.sequence_lod.sequence_pool(rows, pool_type="sum")
        pooled.append(paddle.reshape(summed, [-1, DIM]))
    hidden = paddle.static.nn.fc(paddle.concat([dense, *pooled], axis=1), 16, activation="relu")
    logit = paddle.static.nn.fc(hidden, 1)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(
        logit, paddle.cast(label, "float32")))
    prob = sigmoid(paddle, logit)
    return [dense, *sparse.values(), label], loss, prob, label


def load(paddle, inputs, files: list[str], batch_size: int, threads: int):
    """An InMemoryDataset of ``files``, loaded."""
    dataset = paddle.distributed.InMemoryDataset()
    dataset.init(batch_size=batch_size, thread_num=threads, use_var=inputs, pipe_command="cat")
    dataset.set_filelist(files)
    dataset.load_into_memory()
    return dataset


def heldout_auc(paddle, exe, main_program, inputs, prob, label, config: dict,
                threads: int = 1) -> float:
    """AUC over the held-out file of the trained program's forward part.
    ``threads``: the training's (Paddle 3.3.1 refuses a reader count other than
    the one its first dataset had: "pool.size() 2 != thread_num_ 1")."""
    import numpy as np

    test_program = main_program.clone(for_test=True)
    auc_startup = paddle.static.Program()
    with paddle.static.program_guard(test_program, auc_startup):
        block = test_program.global_block()
        positive = block.var(prob.name)
        both = paddle.concat([1 - positive, positive], axis=1)  # the auc op reads column 1
        _, _, (_, _, positives, negatives) = paddle.static.auc(
            both, block.var(label.name), num_thresholds=2**16 - 1, slide_steps=0
        )
    exe.run(auc_startup)
    test = load(paddle, inputs, [config["heldout"]], 1024, threads)
    exe.infer_from_dataset(test_program, test, thread=threads)
    scope = paddle.static.global_scope()
    return auc_from_histograms(*(
        np.array(scope.find_var(v.name).get_tensor()).reshape(-1) for v in (positives, negatives)
    ))


def train(exe, main_program, dataset, epochs: int, threads: int) -> float:
    """Seconds of ``epochs`` timed train_from_dataset calls, each after an untimed shuffle."""
    seconds = 0.0
    for _ in range(epochs):
        dataset.local_shuffle()
        started = time.perf_counter()
        exe.train_from_dataset(main_program, dataset, thread=threads, debug=False)
        seconds += time.perf_counter() - started
    return seconds


def run_local(config: dict) -> dict:
    """One local run: load, train ``epochs`` passes with ``threads`` threads, evaluate."""
    import paddle

    paddle.enable_static()
    # Paddle 3.3.1 builds PIR programs despite FLAGS_enable_pir_api=0; the guard
    # keeps the old IR (as benchmarks/paddle_engine.py does).
    with paddle.pir_utils.OldIrGuard():
        return _run_local(paddle, config)


def _run_local(paddle, config: dict) -> dict:
    paddle.seed(config["seed"])
    main_program, startup = paddle.static.default_main_program(), paddle.static.Program()
    with paddle.static.program_guard(main_program, startup):
        inputs, loss, prob, label = build(paddle, config)
        paddle.optimizer.Adagrad(learning_rate=config["lr"]).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    threads = config["threads"]
    dataset = load(paddle, inputs, config["files"], config["batch_size"], threads)
    loaded = int(dataset.get_memory_data_size())
    seconds = train(exe, main_program, dataset, config["epochs"], threads)
    records = loaded * config["epochs"]
    return {
        "version": paddle.__version__, "threads": threads, "records": records,
        "seconds": seconds, "records_per_s": records / seconds,
        "auc": heldout_auc(paddle, exe, main_program, inputs, prob, label, config, threads),
    }


def run_ps(config: dict) -> None:
    """One process of a PS job; a worker writes its result to ``<out>.<index>``."""
    import paddle
    from paddle.distributed import fleet

    paddle.enable_static()
    paddle.seed(config["seed"])
    fleet.init(fleet.PaddleCloudRoleMaker())
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = config["mode"] != "sync"
    if config["mode"] == "geo":
        strategy.a_sync_configs = {"k_steps": config["k"]}
    strategy.sparse_table_configs = {
        f"emb_{name}": sparse_table_config(f"emb_{name}", config) for name in TABLE_ROWS
    }
    inputs, loss, prob, label = build(paddle, config)
    dense_optimizer = paddle.optimizer.Adam(learning_rate=config["dense_lr"])
    fleet.distributed_optimizer(dense_optimizer, strategy).minimize(loss)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()  # returns only when stopped: the harness kills this process
        return
    index = config["index"]
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    # The server itself (a latency relay in between accepts before it listens).
    wait_for_port(config.get("server_listening", config["servers"][0]), 60)
    fleet.init_worker()
    main_program = paddle.static.default_main_program()
    dataset = load(paddle, inputs, config["worker_files"][index], config["batch_size"], 1)
    records = int(dataset.get_memory_data_size()) * config["epochs"]
    seconds = train(exe, main_program, dataset, config["epochs"], 1)
    out = {"records": records, "seconds": seconds, "version": paddle.__version__}
    done = [f"{config['out']}.trained.{i}" for i in range(config["workers"])]
    open(done[index], "w").close()
    wait_for_files(done, 600)
    if index == 0:
        out["auc"] = heldout_auc(paddle, exe, main_program, inputs, prob, label, config)
    fleet.stop_worker()
    with open(f"{config['out']}.{index}", "w") as f:
        json.dump(out, f)


def main(config: dict) -> None:
    """Runs the configured process: see the module's docstring."""
    set_role_environment(config)
    if config["mode"] == "local":
        print(json.dumps(run_local(config)), flush=True)
    else:
        run_ps(config)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
