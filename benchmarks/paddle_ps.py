"""Paddle's own parameter server on the job of benchmarks/bench_ps.py: one process.

Runs under Paddle 3.0.0's interpreter (``make bench-paddle-ps`` builds
``.venv-paddle30``; the registry's CPU builds from 3.1 on lack the PS runtime).
bench_ps.py starts one server and two workers of this script on 127.0.0.1 and
stops the server itself once the workers are done: Paddle 3.0.0's server only
ends when told to, and this script's workers do not tell it.

The model is bench_ps.py's wide&deep as a Paddle static graph (the old IR:
``FLAGS_enable_pir_api=0``, PIR lacks the PS passes): the 26 categorical slots
through two sparse tables on the server ("wide", dim 1, summed into the logit;
"deep", dim 4, concatenated with the 13 dense features into an MLP of 64 and 32
ReLU units), the same batch size.

Optimizers, as close to fleetfeed's side as Paddle allows:
* dense parameters: Adam with the same lr (Paddle's PS servers accept only SGD
  or Adam for dense parameters);
* sparse tables (async, sync): ``SparseAdaGradSGDRule``, the rule Paddle's
  ``sparse_optimizer: "adagrad"`` selects. It keeps one squared-gradient sum per
  row and scales by ``sqrt(initial_g2sum / (initial_g2sum + g2sum))``, unlike
  torch's per-coordinate Adagrad, so its lr and initial_g2sum are set apart
  (``--paddle-sparse-lr``, ``--paddle-initial-g2sum``). Held-out AUC after
  async training, measured here: lr 0.05 / g2sum 3 (its defaults) 0.859,
  lr 0.5 / 3 0.876, lr 0.2 / 0.1 0.895 (the default here); with g2sum 1e-6
  0.730; ``StdAdaGradSGDRule`` (per coordinate) lr 0.05-1.0: 0.64-0.75;
* GEO: the workers train local copies with the program's own optimizer ops
  (Adam) and push deltas; the server's table only adds them.

Data: the same records, converted by bench_ps.py to MultiSlot text with each
distinct id renumbered 0..V-1 (a bijection, so the same learning problem): GEO
keeps a dense local copy of each table on the workers, sized by the
vocabulary, so ids must be below it.

Each worker times ``exe.train_from_dataset`` per epoch (loading and shuffling
are not timed), waits for the other workers' training to end (a file per
worker in the job's directory), and worker 0 then computes the held-out AUC
with the trained program's forward part (``clone(for_test=True)``) and the
counts of Paddle's ``auc`` op. Results go to ``<out>.<worker index>`` as JSON.

Usage (bench_ps.py does this): paddle_ps.py '<json config>'
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

CATEGORICAL = [f"C{i}" for i in range(1, 27)]


def set_role_environment(config: dict) -> None:
    """Paddle's PaddleCloudRoleMaker reads the job's shape from these variables."""
    host, port = config["servers"][0].rsplit(":", 1)
    os.environ.update({
        "PADDLE_PSERVERS_IP_PORT_LIST": ",".join(config["servers"]),
        "PADDLE_TRAINERS_NUM": str(config["workers"]),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(config["worker_endpoints"]),
        # Paddle 3's new static IR (PIR) lacks the parameter-server passes.
        "FLAGS_enable_pir_api": "0",
    })
    if config["role"] == "server":
        os.environ.update({"TRAINING_ROLE": "PSERVER", "POD_IP": host, "PADDLE_PORT": port})
    else:
        host, port = config["worker_endpoints"][config["index"]].rsplit(":", 1)
        os.environ.update({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINER_ID": str(config["index"]),
                           "POD_IP": host, "PADDLE_PORT": port})


def wait_for_port(endpoint: str, timeout: float) -> None:
    """Paddle 3.0.0's init_worker() does not wait for a server still starting."""
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError as error:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no Paddle server listening at {endpoint} after {timeout:.0f}s"
                ) from error
            time.sleep(0.2)


def wait_for_files(paths: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [p for p in paths if not os.path.exists(p)]
            raise TimeoutError(
                f"the other workers did not finish training within {timeout:.0f}s: {missing}"
            )
        time.sleep(0.1)


def sparse_table_config(name: str, config: dict) -> dict:
    """A server table of plain rows (``SparseAccessor``: no show/click columns)
    updated by Paddle's sparse Adagrad (``SparseAdaGradSGDRule``, the rule its
    ``sparse_optimizer: "adagrad"`` selects)."""
    prefix = f"table_parameters.{name}.accessor"
    table = {f"{prefix}.accessor_class": "SparseAccessor"}
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        table.update({
            f"{prefix}.{part}.name": "SparseAdaGradSGDRule",
            f"{prefix}.{part}.adagrad.learning_rate": config["paddle_sparse_lr"],
            f"{prefix}.{part}.adagrad.initial_g2sum": config["paddle_initial_g2sum"],
            f"{prefix}.{part}.adagrad.initial_range": config["init_scale"],
        })
    return table


def auc_from_histograms(positives, negatives) -> float:
    """The AUC of the auc op's persistent counts of positives and negatives per
    score bucket (read directly: the op's own output lives in a scope that
    infer_from_dataset drops)."""
    positives, negatives = positives.astype(float), negatives.astype(float)
    above = positives.sum() - positives.cumsum()  # positives in higher buckets
    pairs = positives.sum() * negatives.sum()
    return float((negatives * (above + positives / 2)).sum() / pairs)


def build(paddle, config: dict):
    """The static graph; returns (input variables in slot order, loss, probability, label)."""
    dense = paddle.static.data("dense_feature", shape=[-1, 13], dtype="float32")
    slots = [
        paddle.static.data(name, shape=[-1, 1], dtype="int64", lod_level=1)
        for name in CATEGORICAL
    ]
    label = paddle.static.data("label", shape=[-1, 1], dtype="int64")
    vocab, dim = config["vocab"], config["dim"]
    init = paddle.nn.initializer.Uniform(-config["init_scale"], config["init_scale"])

    def embed(ids, name: str, width: int):
        # is_sparse: rows on the server, sparse gradients (PaddleRec's wide&deep).
        # (paddle.static.nn.sparse_embedding trains the same in async mode, but
        # GEO fails with it: "The Variable type must be DenseTensor, but the
        # type it holds is SelectedRows".)
        rows = paddle.static.nn.embedding(
            input=ids, size=[vocab, width], is_sparse=True,
            param_attr=paddle.ParamAttr(name=name, initializer=init),
        )
        # Every record has exactly one id per slot (the reader gives a missing
        # category its column's own id): the rows are already one per record.
        return paddle.reshape(rows, [-1, width])

    wide = paddle.add_n([embed(ids, "wide", 1) for ids in slots])
    deep = paddle.concat([embed(ids, "deep", dim) for ids in slots] + [dense], axis=1)
    hidden = deep
    for size in (64, 32):
        hidden = paddle.static.nn.fc(hidden, size, activation="relu")
    logit = paddle.static.nn.fc(hidden, 1) + wide
    label_f = paddle.cast(label, "float32")
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, label_f))
    prob = paddle.nn.functional.sigmoid(logit)
    return [dense, *slots, label], loss, prob, label


def main(config: dict) -> None:
    set_role_environment(config)
    import numpy as np
    import paddle
    from paddle.distributed import fleet

    paddle.enable_static()
    paddle.seed(0)
    fleet.init(fleet.PaddleCloudRoleMaker())
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = config["mode"] != "sync"
    if config["mode"] == "geo":
        strategy.a_sync_configs = {"k_steps": config["k"]}
    tables = {}
    for name in ("wide", "deep"):
        tables[name] = sparse_table_config(name, config)
    strategy.sparse_table_configs = tables
    inputs, loss, prob, label = build(paddle, config)
    # Paddle's PS takes only SGD or Adam for dense parameters ("The dense optimizer
    # in PS is only supported SGD or Adam!"); the sparse tables' Adagrad is set above.
    dense_optimizer = paddle.optimizer.Adam(learning_rate=config["dense_lr"])
    optimizer = fleet.distributed_optimizer(dense_optimizer, strategy)
    optimizer.minimize(loss)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()  # returns only when stopped: bench_ps.py kills this process
        return

    index = config["index"]
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    # The server itself (a latency relay in between accepts before it listens).
    wait_for_port(config.get("server_listening", config["servers"][0]), 60)
    fleet.init_worker()

    def load(files: list[str]):
        dataset = paddle.distributed.InMemoryDataset()
        dataset.init(
            batch_size=config["batch_size"], thread_num=1, use_var=inputs, pipe_command="cat"
        )
        dataset.set_filelist(files)
        dataset.load_into_memory()
        return dataset

    main_program = paddle.static.default_main_program()
    train = load([config["files"][index]])
    records = int(train.get_memory_data_size()) * config["epochs"]
    seconds = 0.0
    for _ in range(config["epochs"]):
        train.local_shuffle()
        started = time.perf_counter()
        exe.train_from_dataset(main_program, train, thread=1, debug=False)
        seconds += time.perf_counter() - started
    out = {"records": records, "seconds": seconds, "batches": -(-records // config["batch_size"])}

    done = [f"{config['out']}.trained.{i}" for i in range(config["workers"])]
    open(done[index], "w").close()
    wait_for_files(done, 600)
    if index == 0:
        # The forward part of the trained program (sparse rows still come from
        # the server, or GEO's local copy), plus an auc op of its own.
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
        test = load([config["files"][2]])
        exe.infer_from_dataset(test_program, test, thread=1)
        scope = paddle.static.global_scope()
        out["auc"] = auc_from_histograms(
            *(
                np.array(scope.find_var(v.name).get_tensor()).reshape(-1)
                for v in (positives, negatives)
            )
        )
    fleet.stop_worker()
    with open(f"{config['out']}.{index}", "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
