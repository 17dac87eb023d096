"""Paddle's dataset API surface, called the way Paddle code calls it.

The calls, their order and the data layouts follow what PaddleRec's dataset
drivers and readers and Paddle's own dataset unit tests do (issue 16): the
InMemoryDataset driver calls ``_set_use_ps_gpu`` first, then ``init`` with
Paddle-style variables, ``set_filelist`` and ``update_settings(parse_ins_id=...,
parse_content=...)``; Paddle's tests build datasets with ``cat`` over MultiSlot
files, assign ``thread_num`` directly and shuffle without a fleet.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support import PYTHON, REPO

from datafeed import DatasetFactory, InMemoryDataset, QueueDataset, SchemaError, Slot
from trainer import Executor, FetchHandler

BIG_ID = 13144622806274600496  # >= 2**63: a uint64 feature id, as slot_dnn writes them
TOP_ID = 2**64 - 1


def paddle_var(name: str, dtype: str = "int64", shape=(None, 1), lod_level: int = 1):
    """What ``paddle.static.data(name, shape, dtype, lod_level)`` hands to use_var."""
    return SimpleNamespace(name=name, dtype=dtype, shape=list(shape), lod_level=lod_level)


# -- a PaddleRec-style reader, run through the InMemoryDataset driver's calls -----------

READER = '''
import sys

from generators import MultiSlotDataGenerator

SLOTS = ["slot_a", "slot_b", "slot_c"]


class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def records():
            label, *features = line.split()
            by_slot = {name: [] for name in SLOTS}
            for feature in features:
                slot, value = feature.split(":")
                by_slot[slot].append(int(value))
            out = [("click", [int(label)])]
            for name in SLOTS:
                out.append((name, by_slot[name] or [0]))  # an empty slot is padded with 0
            yield out
        return records


if __name__ == "__main__":
    Reader().run_from_stdin()
'''


def raw_lines(count: int, start: int = 0) -> list[str]:
    lines = []
    for i in range(start, start + count):
        features = [f"slot_a:{i}", f"slot_a:{BIG_ID + i}", f"slot_b:{TOP_ID - i}"]
        if i % 3:
            features.append(f"slot_c:{7 * i}")
        lines.append(f"{i % 2} " + " ".join(features))
    return lines


def write_raw(tmp_path: Path) -> tuple[list[str], str]:
    files = []
    for part, start in enumerate((0, 5)):
        path = tmp_path / f"part-{part}"
        path.write_text("\n".join(raw_lines(5, start)) + "\n")
        files.append(str(path))
    reader = tmp_path / "reader.py"
    reader.write_text(READER)
    return files, f"PYTHONPATH={REPO} {PYTHON} {reader}"


def driver_dataset(tmp_path: Path, batch_size: int = 4) -> InMemoryDataset:
    """The InMemoryDataset driver's calls, in its order."""
    files, pipe_command = write_raw(tmp_path)
    inputs = [paddle_var("click", lod_level=0)] + [
        paddle_var(name) for name in ("slot_a", "slot_b", "slot_c")
    ]
    dataset = InMemoryDataset()
    dataset._set_use_ps_gpu(False)
    dataset.init(
        use_var=inputs, pipe_command=pipe_command, batch_size=batch_size, thread_num=2,
        fs_name="", fs_ugi="",
    )
    dataset.set_filelist(files)
    dataset.update_settings(parse_ins_id=False, parse_content=False)
    return dataset


def as_uint64(values: torch.Tensor) -> list[int]:
    return values.numpy().view(np.uint64).tolist()


def test_the_inmemory_driver_loads_and_iterates_one_epoch(tmp_path):
    dataset = driver_dataset(tmp_path)
    assert dataset.use_ps_gpu is False
    assert [str(s) for s in dataset.schema] == [
        "click:int64:1", "slot_a:uint64", "slot_b:uint64", "slot_c:uint64",
    ]
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 10  # records = lines
    batches = list(dataset)
    assert [b.size for b in batches] == [4, 4, 2]
    slot_a = [ids for b in batches for ids in b["slot_a"].tolist()]
    slot_b = [ids for b in batches for ids in b["slot_b"].tolist()]
    slot_c = [ids for b in batches for ids in b["slot_c"].tolist()]
    # thread_num=2 reads the two files at once; each file's records keep their order
    # and the files follow their filelist order.
    assert [ids[0] for ids in slot_a] == list(range(10))
    # uint64 ids are delivered as int64 tensors with the same bits.
    values = torch.cat([b["slot_a"].values for b in batches])
    assert values.dtype == torch.int64
    assert as_uint64(values) == [v for i in range(10) for v in (i, BIG_ID + i)]
    assert [ids[0] for ids in slot_b] == [TOP_ID - i - 2**64 for i in range(10)]
    assert list(slot_c) == [[0] if i % 3 == 0 else [7 * i] for i in range(10)]
    assert [b["click"].reshape(-1).tolist() for b in batches] == [
        [0, 1, 0, 1], [0, 1, 0, 1], [0, 1],
    ]


def test_the_driver_dataset_trains_through_the_executor(tmp_path):
    dataset = driver_dataset(tmp_path, batch_size=5)
    dataset.load_into_memory()
    model = TinyModel()
    summary = Executor().train_from_dataset(
        model, dataset, torch.optim.SGD(model.parameters(), lr=0.1), print_period=100
    )
    assert (summary.batches, summary.records) == (2, 10)


# -- Paddle-style variables --------------------------------------------------------------


def test_a_sparse_int64_variable_is_a_uint64_slot_and_ids_above_2_63_parse(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text(f"2 {BIG_ID} {TOP_ID} 1 0.5\n1 5 1 1.5\n")
    dataset = InMemoryDataset()
    dataset.init(
        batch_size=2, thread_num=1, pipe_command="cat",
        use_var=[paddle_var("ids"), paddle_var("weight", "float32", (None, 1), 0)],
    )
    assert list(dataset.schema) == [Slot("ids", "uint64"), Slot("weight", "float32", (1,))]
    dataset.set_filelist([str(path)])
    dataset.load_into_memory()
    (batch,) = list(dataset)
    assert as_uint64(batch["ids"].values) == [BIG_ID, TOP_ID, 5]
    assert batch["ids"].offsets.tolist() == [0, 2, 3]
    assert batch["weight"].reshape(-1).tolist() == [0.5, 1.5]
    # The same mapping through every way use_var is set.
    for setter in ("set_use_var", "_set_use_var"):
        other = QueueDataset()
        getattr(other, setter)([paddle_var("ids")])
        assert list(other.schema) == [Slot("ids", "uint64")]
    other = QueueDataset()
    other.update_settings(use_var=[paddle_var("ids", "paddle.int64")])
    assert list(other.schema) == [Slot("ids", "uint64")]
    # A dense int64 variable (a label) stays int64.
    other = QueueDataset()
    other._set_use_var([paddle_var("label", lod_level=0)])
    assert list(other.schema) == [Slot("label", "int64", (1,))]


# -- the setters ---------------------------------------------------------------------------


def test_the_private_setters_map_onto_the_settings():
    dataset = InMemoryDataset()
    dataset._set_batch_size(32)
    dataset._set_thread(3)
    dataset._set_pipe_command("python reader.py")
    dataset._set_use_var([paddle_var("a")])
    dataset._set_use_var([paddle_var("b", "float32", (None, 2), 0)])  # adds, as in Paddle
    dataset._set_input_type(0)
    dataset._set_hdfs_config("", "")
    dataset._set_download_cmd("cat")
    dataset._set_uid_slot("a")
    dataset._set_shuffle_by_uid(False)
    dataset._set_queue_num(2)
    dataset._set_fleet_send_batch_size(800)
    dataset._set_fleet_send_sleep_seconds(2)
    dataset._set_fea_eval(1000, True)
    dataset._set_parse_ins_id(False)
    dataset._set_parse_content(False)
    dataset._set_feed_type("MultiSlotInMemoryDataFeed")
    dataset._set_trainer_num(4)
    settings = dataset._settings
    assert (dataset.batch_size, dataset.thread_num, settings["pipe_command"]) == (
        32, 3, "python reader.py",
    )
    assert list(dataset.schema) == [Slot("a", "uint64"), Slot("b", "float32", (2,))]
    assert (dataset.queue_num, dataset.fleet_send_batch_size) == (2, 800)
    assert (dataset.fleet_send_sleep_seconds, dataset.fea_eval) == (2, True)
    assert (dataset.candidate_size, dataset.parse_ins_id, dataset.parse_content) == (
        1000, False, False,
    )
    assert (dataset.trainer_num, dataset.merge_by_lineid) == (4, False)
    desc = dataset._desc()
    assert desc.startswith('name: "MultiSlotInMemoryDataFeed"\nbatch_size: 32\n')
    assert 'name: "b"\n    type: "float"\n    is_dense: true' in desc
    assert 'uid_slot: "a"' in desc and 'pipe_command: "python reader.py"' in desc
    assert dataset.desc() == desc


def test_the_fluid_public_setters_map_onto_the_settings():
    dataset = DatasetFactory().create_dataset("InMemoryDataset")
    dataset.set_feed_type("MultiSlotInMemoryDataFeed")
    dataset.set_use_var([paddle_var("ids")])
    dataset.set_batch_size(16)
    dataset.set_thread(2)
    dataset.set_pipe_command("cat")
    dataset.set_hdfs_config("", "")
    dataset.set_download_cmd("cat")
    dataset.set_input_type(0)
    dataset.set_queue_num(2)
    dataset.set_parse_ins_id(False)
    dataset.set_parse_content(False)
    dataset.set_fleet_send_batch_size(64)
    dataset.set_fleet_send_sleep_seconds(0)
    dataset.set_fea_eval(500)
    dataset.set_merge_by_sid(False)
    dataset.set_parse_logkey(False)
    dataset.set_enable_pv_merge(False)
    dataset.set_date("20240501")
    assert (dataset.batch_size, dataset.thread_num, dataset.fleet_send_batch_size) == (16, 2, 64)
    assert (dataset.fea_eval, dataset.candidate_size, dataset.queue_num) == (True, 500, 2)
    with pytest.raises(ValueError, match="'YYYYMMDD', got '2024-05-01'"):
        dataset.set_date("2024-05-01")


def test_init_distributed_settings_follows_paddles_rules():
    dataset = InMemoryDataset()
    dataset.init(batch_size=1, thread_num=2, pipe_command="cat", use_var=[])
    dataset._init_distributed_settings(
        parse_ins_id=False, parse_content=False, fea_eval=True, candidate_size=100,
        fleet_send_batch_size=512, fleet_send_sleep_seconds=1, merge_size=-1,
    )
    assert (dataset.fea_eval, dataset.candidate_size) == (True, 100)
    assert (dataset.fleet_send_batch_size, dataset.fleet_send_sleep_seconds) == (512, 1)
    # Paddle applies the send settings only when truthy, candidate_size only with fea_eval.
    dataset._init_distributed_settings(fleet_send_batch_size=None, candidate_size=7)
    assert (dataset.fleet_send_batch_size, dataset.candidate_size) == (512, 100)
    with pytest.raises(TypeError, match="unexpected keyword argument 'merge_by_sid'"):
        dataset._init_distributed_settings(merge_by_sid=True)


SETTERS = [
    (lambda d: d._init_distributed_settings(parse_ins_id=True), (True, False, False, -1)),
    (lambda d: d._init_distributed_settings(parse_content=True), (False, True, False, -1)),
    # merge_size > 0 turns merging and parse_ins_id on (Paddle's _set_merge_by_lineid).
    (lambda d: d._init_distributed_settings(merge_size=2), (True, False, True, 2)),
    (lambda d: d._set_parse_ins_id(True), (True, False, False, -1)),
    (lambda d: d.set_parse_ins_id(True), (True, False, False, -1)),
    (lambda d: d.set_parse_content(True), (False, True, False, -1)),
    (lambda d: d._set_merge_by_lineid(), (True, False, True, 2)),
    (lambda d: d.set_merge_by_lineid(3), (True, False, True, 3)),
    (lambda d: d.update_settings(parse_ins_id=True), (True, False, False, -1)),
    (lambda d: d.init(parse_ins_id=True), (True, False, False, -1)),
    # In order, as Paddle's update_settings: a later parse_ins_id=False wins.
    (lambda d: d.update_settings(merge_size=2, parse_ins_id=False), (False, False, True, 2)),
    (lambda d: d.update_settings(merge_size=-1), (False, False, False, -1)),
]


@pytest.mark.parametrize("call, expected", SETTERS)
def test_the_parser_format_setters_set_what_paddle_sets(call, expected):
    dataset = InMemoryDataset()
    dataset.init(batch_size=3, use_var=[paddle_var("ids")])
    call(dataset)
    got = (dataset.parse_ins_id, dataset.parse_content, dataset.merge_by_lineid,
           dataset._settings["merge_size"])
    assert got == expected


@pytest.mark.parametrize(
    "setting, value, message",
    [
        ("parse_ins_id", 1, "the 'parse_ins_id' setting must be a bool, got 1"),
        ("merge_size", "2", "the 'merge_size' setting must be an int"),
        ("input_type", 2, "must be 0 .one record per line. or 1 .one batch per line., got 2"),
    ],
)
def test_bad_parser_format_values_are_refused_in_one_place(setting, value, message):
    dataset = InMemoryDataset()
    dataset.init(batch_size=3, use_var=[paddle_var("ids")])
    with pytest.raises(SchemaError, match=message):
        dataset.update_settings(**{setting: value})
    assert dataset._settings[setting] == {"parse_ins_id": False, "merge_size": -1,
                                          "input_type": 0}[setting]


PSGPU = re.escape("Paddle's GPU parameter server (PSGPU / HeterPS), which exists only inside")
BOXPS = re.escape("needs Paddle's BoxPS (pv merging, log keys, training phases), which exists")
PSLIB = re.escape("needs Paddle's pslib parameter server (local tables of unique feature ids)")
NOT_HERE = [
    (lambda d: d._set_use_ps_gpu(True),
     PSGPU + r".*call _set_use_ps_gpu\(False\) or leave it out, and instead train with "
     r"trainer.fleet's parameter server"),
    (lambda d: d._set_heter_ps(True), r"_set_heter_ps\(\) needs " + PSGPU),
    (lambda d: d._set_generate_unique_feasigns(True, 8), PSLIB),
    (lambda d: d.set_generate_unique_feasigns(True), PSLIB),
    (lambda d: d._generate_local_tables_unlock(0, 8, 1, 1, 1), PSLIB),
    (lambda d: d.generate_local_tables_unlock(0, 8, 1, 1, 1), PSLIB),
    (lambda d: d.tdm_sample("t", "p", [1], 1, False, 0, 0),
     r"tdm_sample\(\) needs Paddle's TDM tree sampler.*sample the tree's nodes in the reader"),
    (lambda d: d.set_parse_logkey(True), r"set_parse_logkey\(\) " + BOXPS),
    (lambda d: d.set_enable_pv_merge(True), r"set_enable_pv_merge\(\) " + BOXPS),
    (lambda d: d.set_current_phase(1), r"set_current_phase\(\) " + BOXPS),
    (lambda d: d.preprocess_instance(), r"preprocess_instance\(\) " + BOXPS),
    (lambda d: d.postprocess_instance(), r"postprocess_instance\(\) " + BOXPS),
    (lambda d: d.get_pv_data_size(), r"get_pv_data_size\(\) " + BOXPS),
    (lambda d: d.set_rank_offset("rank_offset"), r"set_rank_offset\(\) " + BOXPS),
    (lambda d: d.set_pv_batch_size(32), r"set_pv_batch_size\(\) " + BOXPS),
    (lambda d: d.set_graph_config({}),
     r"set_graph_config\(\) needs Paddle's GPU graph engine.*write the walks"),
    (lambda d: d.set_pass_id(1), r"set_pass_id\(\) needs Paddle's GPU graph engine"),
    (lambda d: d.set_so_parser_name("parser.so"),
     r"set_so_parser_name\(\) needs a C\+\+ parser library.*parse in a pipe_command"),
    (lambda d: DatasetFactory().create_dataset("BoxPSDataset"),
     "BoxPSDataset needs Paddle's BoxPS; use InMemoryDataset or QueueDataset"),
    (lambda d: DatasetFactory().create_dataset("FileInstantDataset"),
     "FileInstantDataset reads Paddle's binary instant-feed files"),
    (lambda d: QueueDataset().local_shuffle(),
     "QueueDataset does not support local shuffle, please use InMemoryDataset"),
    (lambda d: QueueDataset().global_shuffle(),
     "QueueDataset does not support global shuffle, please use InMemoryDataset"),
]


@pytest.mark.parametrize("call, message", NOT_HERE)
def test_what_needs_paddles_cxx_says_what_to_use_instead(call, message):
    with pytest.raises(NotImplementedError, match=message):
        call(InMemoryDataset())


def test_switching_a_cxx_only_feature_off_is_accepted():
    dataset = InMemoryDataset()
    dataset._set_use_ps_gpu(False)
    dataset._set_use_ps_gpu(0)
    dataset._set_heter_ps(False)
    dataset.set_rank_offset("")
    dataset.set_pv_batch_size(1)
    assert dataset.use_ps_gpu is False


# -- attributes Paddle code assigns, and Paddle's counts ------------------------------------


def cat_dataset(tmp_path: Path, kind: str = "InMemoryDataset") -> InMemoryDataset:
    """Paddle's unit-test layout: four sparse int64 slots, ``cat`` over two files."""
    for name, rows in (("a", 3), ("b", 4)):
        (tmp_path / f"{name}.txt").write_text(
            "".join(f"1 {i} 2 {i} {i + 1} 1 {i} 1 {i}\n" for i in range(rows))
        )
    dataset = DatasetFactory().create_dataset(kind)
    dataset.set_use_var([paddle_var(f"slot{i}") for i in range(1, 5)])
    dataset.set_batch_size(2)
    dataset.set_thread(2)
    dataset.set_pipe_command("cat")
    dataset.set_filelist([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")])
    return dataset


def test_thread_num_is_a_plain_attribute(tmp_path):
    dataset = cat_dataset(tmp_path)
    dataset.thread_num = 0  # as Paddle's tests do: readers fall back to one
    assert dataset.thread_num == 0
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 7
    model = TinyModel()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="You should set thread num first"):
        Executor().train_from_dataset(model, dataset, optimizer)
    summary = Executor().train_from_dataset(model, dataset, optimizer, thread=1)
    assert (summary.batches, summary.records, summary.threads) == (4, 7, 1)
    dataset.thread_num = 2
    dataset.batch_size = 7
    assert Executor().train_from_dataset(model, dataset, optimizer).threads == 2
    assert len(dataset) == 1
    with pytest.raises(SchemaError, match="'thread_num' setting must be an int >= 0, got -1"):
        dataset.thread_num = -1
    dataset.filelist = [str(tmp_path / "a.txt")]
    assert dataset.filelist == [str(tmp_path / "a.txt")]


def test_get_shuffle_data_size_after_a_global_shuffle_without_fleet_is_0(tmp_path):
    dataset = cat_dataset(tmp_path)
    dataset.load_into_memory()
    dataset.global_shuffle()
    # Paddle's count is 0 (it sends the records to a worker 0 that never gets
    # them); here they stay in memory.
    assert dataset.get_shuffle_data_size() == 0
    assert dataset.get_memory_data_size() == 7
    assert sum(batch.size for batch in dataset) == 7
    dataset.local_shuffle(seed=1)
    assert dataset.get_shuffle_data_size() == 7
    dataset.global_shuffle(seed=2)
    dataset.load_into_memory()
    assert dataset.get_shuffle_data_size() == dataset.get_memory_data_size() == 14
    dataset.release_memory()
    assert dataset.get_shuffle_data_size() == 0


def test_check_use_var_with_data_generator(tmp_path):
    import importlib.util

    files, _ = write_raw(tmp_path)
    spec = importlib.util.spec_from_file_location("paddle_surface_reader", tmp_path / "reader.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    inputs = [paddle_var("click", lod_level=0)] + [paddle_var(n) for n in module.SLOTS]
    dataset = InMemoryDataset()
    dataset._check_use_var_with_data_generator(inputs, module.Reader(), files[0])
    with pytest.raises(ValueError, match=r"var_list = 3 vs data_generator = 4 \(.*part-0:1\)"):
        dataset._check_use_var_with_data_generator(inputs[:3], module.Reader(), files[0])
    inputs[1] = paddle_var("slot_a", "float32")
    with pytest.raises(TypeError, match="var name = slot_a, var type in var_list = float"):
        dataset._check_use_var_with_data_generator(inputs, module.Reader(), files[0])


# -- FetchHandler and train_from_dataset's keywords ------------------------------------------


class TinyModel(torch.nn.Module):
    """Loss 0.25 on every batch (a zero weight keeps it fixed); ``delay`` per batch."""

    def __init__(self, delay: float = 0.0, fail_at: int | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.delay, self.fail_at, self.calls = delay, fail_at, 0

    def forward(self, batch):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("the model failed on purpose")
        time.sleep(self.delay)
        first = next(iter(batch.values()))
        rows = first.size if hasattr(first, "offsets") else first.shape[0]
        prob = torch.full((rows,), 0.5) + 0 * self.weight
        return {"loss": (prob * prob).mean(), "prob": prob}


class Recorder(FetchHandler):
    def __init__(self, var_dict, period_secs):
        super().__init__(var_dict=var_dict, period_secs=period_secs)
        self.calls = []

    def handler(self, res_dict):
        self.calls.append(dict(res_dict))


def fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "trainer-fetch"]


def test_fetch_handler_is_called_every_period_with_the_values(tmp_path):
    dataset = cat_dataset(tmp_path)
    dataset.set_batch_size(1)
    dataset.load_into_memory()
    handler = Recorder(
        {"loss": "loss", "p": SimpleNamespace(name="prob"), "missing": "nope"}, period_secs=0.1
    )
    model = TinyModel(delay=0.1)  # 7 batches: about 0.7 s
    started = time.monotonic()
    summary = Executor().train_from_dataset(
        model, dataset, torch.optim.SGD(model.parameters(), lr=0.1),
        thread=1, fetch_handler=handler,
    )
    seconds = time.monotonic() - started
    assert summary.batches == 7 and not fetch_threads()
    # One call per full period of the pass (a loaded machine may lose one or two).
    assert 2 <= len(handler.calls) <= int(seconds / 0.1) + 1
    for res_dict in handler.calls:
        assert set(res_dict) == {"loss", "p", "missing"}
        assert res_dict["missing"] is None
        if res_dict["loss"] is not None:  # a call before the first batch has none
            assert isinstance(res_dict["loss"], np.ndarray) and res_dict["loss"] == 0.25
            assert res_dict["p"].tolist() == [0.5]
    assert sum(r["loss"] is not None for r in handler.calls) >= 2


def test_the_fetch_thread_is_joined_when_the_pass_fails(tmp_path):
    dataset = cat_dataset(tmp_path)
    dataset.set_batch_size(1)
    dataset.load_into_memory()
    handler = Recorder({"loss": "loss"}, period_secs=0.05)
    model = TinyModel(delay=0.05, fail_at=5)
    with pytest.raises(RuntimeError, match="the model failed on purpose"):
        Executor().infer_from_dataset(model, dataset, thread=1, fetch_handler=handler)
    assert not fetch_threads()
    assert len(handler.calls) >= 1


def test_an_error_in_the_handler_is_raised_after_the_pass(tmp_path, capsys):
    class Broken(FetchHandler):
        def handler(self, res_dict):
            raise KeyError("handler bug")

    dataset = cat_dataset(tmp_path)
    dataset.set_batch_size(1)
    dataset.load_into_memory()
    with pytest.raises(KeyError, match="handler bug"):
        Executor().infer_from_dataset(
            TinyModel(delay=0.05), dataset, thread=1,
            fetch_handler=Broken(var_dict={"loss": "loss"}, period_secs=0.05),
        )
    assert not fetch_threads()
    # Paddle's default handler prints the first value of each array.
    FetchHandler(var_dict={}).handler({"loss": np.array(0.25), "none": None})
    assert capsys.readouterr().out == "loss[0]: 0.25 \n"
    with pytest.raises(ValueError, match="FetchHandler needs var_dict"):
        FetchHandler()


def test_train_from_dataset_takes_paddles_keywords(tmp_path, capsys):
    dataset = cat_dataset(tmp_path)
    dataset.load_into_memory()
    model = TinyModel()
    seen = []
    summary = Executor().train_from_dataset(
        program=model, dataset=dataset, scope=object(), thread=2, debug=False,
        fetch_list=["loss"], fetch_info=["cost"], print_period=2,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        fetch_handler=lambda outputs: seen.append(float(outputs["loss"])),
    )
    assert (summary.batches, summary.records, summary.threads) == (4, 7, 2)
    assert seen == [0.25] * 4 and summary.last_fetch == {"cost": [0.25]}
    assert capsys.readouterr().out.count("cost[1]:[0.25]") == 2
    summary = Executor().infer_from_dataset(program=model, dataset=dataset, scope=None)
    assert summary.records == 7
    with pytest.raises(TypeError, match="pass the model once"):
        Executor().infer_from_dataset(model, dataset, program=model)
    with pytest.raises(TypeError, match="fetch_handler must be a FetchHandler"):
        Executor().infer_from_dataset(model, dataset, fetch_handler=42)


def test_paddles_plain_attributes_and_cpp_objects():
    from datafeed import InMemoryDataset, QueueDataset

    ds = InMemoryDataset()
    # Paddle's InMemoryDataset.__init__ defaults.
    assert (ds.is_user_set_queue_num, ds.parse_logkey, ds.merge_by_sid, ds.enable_pv_merge,
            ds.trainer_num, ds.psgpu) == (False, False, True, False, -1, None)
    ds._set_queue_num(4)
    ds.set_merge_by_sid(False)
    assert ds.is_user_set_queue_num is True and ds.queue_num == 4 and ds.merge_by_sid is False
    for dataset in (ds, QueueDataset()):
        for name, what in (("proto_desc", "DataFeedDesc"), ("dataset", "core.Dataset")):
            with pytest.raises(NotImplementedError, match=f"dataset.{name} is Paddle's C.. {what}"):
                getattr(dataset, name)
    for name in ("get_pass_id", "get_epoch_finish", "clear_sample_state"):
        with pytest.raises(NotImplementedError, match="GPU graph engine"):
            getattr(ds, name)()
