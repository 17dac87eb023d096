"""Paddle's instance ids, content fields, batch reader and merge by line id (issue 16).

Readers here are written the way PaddleRec writes its slot_dnn, wide_deep
(lineid) and dssm readers: a ``MultiSlotStringDataGenerator`` whose first
outputs are the instance id (and the content), so each line starts with
``1 <ins_id>`` (``1 <content>``) before the slots, as Paddle's in-memory feed
reads them with ``parse_ins_id`` / ``parse_content``. Datasets are built with
their drivers' calls in their order; one epoch yields one record per line.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support import PYTHON, REPO

from datafeed import CacheError, InMemoryDataset, ParseError, QueueDataset, SchemaError, Slot
from datafeed.config.slots import SlotSchema
from datafeed.parse.parsing import parse_bytes
from generators import MultiSlotStringDataGenerator

BIG_ID = 13144622806274600496  # >= 2**63, as slot_dnn's feature ids are


def paddle_var(name: str, dtype: str = "int64", shape=(None, 1), lod_level: int = 1):
    """What ``paddle.static.data(name, shape, dtype, lod_level)`` hands to use_var."""
    return SimpleNamespace(name=name, dtype=dtype, shape=list(shape), lod_level=lod_level)


def in_memory(tmp_path: Path, reader: str, lines: list[str], inputs, batch_size: int,
              **distributed) -> InMemoryDataset:
    """PaddleRec's InMemoryDataset driver: its calls, in its order."""
    data = tmp_path / "part-0"
    text = "".join(line + "\n" for line in lines)
    if not data.exists() or data.read_text() != text:  # unchanged: a cache stays fresh
        data.write_text(text)
    script = tmp_path / "reader.py"
    script.write_text(reader)
    dataset = InMemoryDataset()
    dataset._set_use_ps_gpu(False)
    dataset.init(
        use_var=inputs, pipe_command=f"PYTHONPATH={REPO} {PYTHON} {script}",
        batch_size=batch_size, thread_num=1, fs_name="", fs_ugi="",
    )
    dataset.set_filelist([str(data)])
    dataset.update_settings(parse_ins_id=True, parse_content=False)
    if distributed:
        dataset._init_distributed_settings(**distributed)
    return dataset


# -- the line format -------------------------------------------------------------------


def test_generators_write_the_ins_id_and_content_paddle_reads_before_the_slots():
    class Reader(MultiSlotStringDataGenerator):
        def generate_sample(self, line):
            def records():
                yield [("insid", ["q-7"]), ("content", ["hello"]), ("ids", ["3", "4"])]
            return records

    line = Reader()._gen_str(next(Reader().generate_sample("")()))
    assert line == "1 q-7 1 hello 2 3 4\n"
    schema = SlotSchema([Slot("ids", "uint64")]).with_text_fields(True, True)
    chunk = parse_bytes(schema, line.encode() * 2)
    assert chunk.rows == 2
    assert chunk.columns[0].values.tolist() == [3, 4, 3, 4]
    assert bytes(chunk.columns[1].values) == b"q-7q-7"
    assert bytes(chunk.columns[2].values) == b"hellohello"


@pytest.mark.parametrize(
    "text, message",
    [
        (b"2 a b 1 5\n", re.escape(
            "f.txt, line 1, instance id: expected the instance id as '1 <ins_id>' before the "
            "slots (parse_ins_id=True), found b'2'")),
        (b"1 a 1 5\n1\n", "line 2, instance id: .* found the end of the line"),
        (b"x a 1 5\n", "line 1, instance id: .* found b'x'"),
        (b"1 5\n", "line 1, slot 'ids': expected a value count, found the end of the line "
                   r"\(after 0 of 1 slots\)"),
    ],
)
def test_a_line_without_its_instance_id_is_a_parse_error_naming_it(text, message):
    schema = SlotSchema([Slot("ids", "uint64")]).with_text_fields(True, False)
    with pytest.raises(ParseError, match=message):
        parse_bytes(schema, text, "f.txt")


def test_skip_mode_counts_lines_without_their_instance_id():
    from datafeed.parse.parsing import ChunkParser

    schema = SlotSchema([Slot("ids", "uint64")]).with_text_fields(True, False)
    parser = ChunkParser(schema, "f", skip_bad_lines=True)
    parser.feed_final(b"1 a 1 5\n3 b 1 6\n1 c 1 7\n")
    assert (parser.records, parser.skipped_reasons) == (2, {"bad_text_field": 1})
    chunk = parser.take_chunk()
    assert bytes(chunk.columns[1].values) == b"ac"


def test_text_fields_are_not_slots():
    with pytest.raises(SchemaError, match="use_var takes slots"):
        SlotSchema(SlotSchema([Slot("a", "uint64")]).with_text_fields(True, False))
    schema = SlotSchema([Slot("a", "uint64")])
    assert schema.with_text_fields(False, False) is schema
    assert schema.with_text_fields(True, True).slots_only == schema


# -- slot_dnn: instance ids and uint64 ids through the InMemoryDataset driver -------------

SLOT_DNN_READER = '''
from generators import MultiSlotStringDataGenerator

SLOTS = [str(i) for i in range(1, 4)]


class Reader(MultiSlotStringDataGenerator):
    def line_process(self, line):
        ins_id, features = line.strip().split("\\t")
        output = [(slot, []) for slot in SLOTS]
        for feature in features.split(" "):
            feasign, slot = feature.split(":")
            if slot in SLOTS:
                output[SLOTS.index(slot)][1].append(feasign)
        output = [(slot, values or ["0"]) for slot, values in output]  # padding
        return [("ins_id", [ins_id]), ("click", ["1"])] + output

    def generate_sample(self, line):
        def reader():
            yield self.line_process(line)
        return reader


if __name__ == "__main__":
    Reader().run_from_stdin()
'''


def slot_dnn_lines(count: int) -> list[str]:
    return [
        f"ins-{i}\t{BIG_ID + i}:1 {i}:2" + (f" {7 * i + 1}:3" if i % 2 else "")
        for i in range(count)
    ]


def test_slot_dnn_records_keep_their_instance_ids_through_one_epoch(tmp_path):
    inputs = [paddle_var("click", lod_level=0)] + [paddle_var(s) for s in ("1", "2", "3")]
    dataset = in_memory(tmp_path, SLOT_DNN_READER, slot_dnn_lines(10), inputs, batch_size=4)
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 10  # records = lines
    batches = list(dataset)
    assert [b.size for b in batches] == [4, 4, 2]
    assert [i for b in batches for i in b.ins_ids] == [f"ins-{i}" for i in range(10)]
    assert all(b.contents is None for b in batches)
    assert sorted(batches[0]) == ["1", "2", "3", "click"]  # the id is not a slot
    ids = torch.cat([b["1"].values for b in batches]).numpy().view(np.uint64)
    assert ids.tolist() == [BIG_ID + i for i in range(10)]
    assert [v for b in batches for v in b["3"].tolist()] == [
        [7 * i + 1] if i % 2 else [0] for i in range(10)
    ]


def test_instance_ids_follow_their_records_through_shuffles_cache_and_state(tmp_path):
    inputs = [paddle_var("click", lod_level=0)] + [paddle_var(s) for s in ("1", "2", "3")]
    dataset = in_memory(tmp_path, SLOT_DNN_READER, slot_dnn_lines(12), inputs, batch_size=5)
    dataset.load_into_memory()
    dataset.local_shuffle(seed=3)
    dataset.slots_shuffle(["3"], seed=4)
    dataset.global_shuffle(seed=5)  # no fleet: a local shuffle

    def rows(ds):
        return [(i, s2[0]) for b in ds for i, s2 in zip(b.ins_ids, b["2"].tolist(), strict=True)]

    shuffled = rows(dataset)
    assert sorted(shuffled) == sorted((f"ins-{i}", i) for i in range(12))
    assert [r for r, _ in shuffled] != [f"ins-{i}" for i in range(12)]
    state = dataset.state_dict()
    cache = tmp_path / "c.arrow"
    dataset.save_cache(cache)
    again = in_memory(tmp_path, SLOT_DNN_READER, slot_dnn_lines(12), inputs, batch_size=5)
    again.load_cache(cache)
    assert rows(again) == shuffled
    replayed = in_memory(tmp_path, SLOT_DNN_READER, slot_dnn_lines(12), inputs, batch_size=5)
    replayed.load_into_memory()
    replayed.load_state_dict(state)
    assert rows(replayed) == shuffled
    assert "__ins_id__" in dataset.to_arrow().column_names


def test_a_cache_with_instance_ids_is_refused_without_parse_ins_id(tmp_path):
    inputs = [paddle_var("click", lod_level=0)] + [paddle_var(s) for s in ("1", "2", "3")]
    dataset = in_memory(tmp_path, SLOT_DNN_READER, slot_dnn_lines(3), inputs, batch_size=5)
    dataset.load_into_memory()
    cache = tmp_path / "c.arrow"
    dataset.save_cache(cache)
    without = in_memory(tmp_path, SLOT_DNN_READER, slot_dnn_lines(3), inputs, batch_size=5)
    without.update_settings(parse_ins_id=False)
    with pytest.raises(CacheError, match=r"it holds slots \[.*__ins_id__:text\] but use_var"):
        without.load_cache(cache)


# -- dssm: instance id and content -------------------------------------------------------

DSSM_READER = '''
from generators import MultiSlotStringDataGenerator

NEG_NUM = 1


class Reader(MultiSlotStringDataGenerator):
    def line_process(self, line):
        data = line.rstrip("\\n").split("\\t")
        ins_id, content, features = [data[0]], [data[1]], data[2:]
        docs = [features[i].split(",") for i in range(2 + NEG_NUM)]
        return [ins_id, content] + docs

    def generate_sample(self, line):
        def reader():
            names = ["insid", "content", "query", "pos_doc"]
            names += [f"neg_doc_{i}" for i in range(NEG_NUM)]
            yield zip(names, self.line_process(line))
        return reader


if __name__ == "__main__":
    Reader().run_from_stdin()
'''


def test_dssm_records_carry_instance_id_and_content(tmp_path):
    lines = [f"q{i}\tquery-{i}\t{i},{i + 1}\t{i + 2}\t{i + 3},{i + 4},{i + 5}" for i in range(7)]
    inputs = [paddle_var(n) for n in ("query", "pos_doc", "neg_doc_0")]
    dataset = in_memory(tmp_path, DSSM_READER, lines, inputs, batch_size=3)
    dataset.update_settings(parse_ins_id=True, parse_content=True)
    dataset.load_into_memory()
    batches = list(dataset)
    assert sum(b.size for b in batches) == 7
    assert [i for b in batches for i in b.ins_ids] == [f"q{i}" for i in range(7)]
    assert [c for b in batches for c in b.contents] == [f"query-{i}" for i in range(7)]
    assert [q for b in batches for q in b["neg_doc_0"].tolist()] == [
        [i + 3, i + 4, i + 5] for i in range(7)
    ]


# -- wide_deep (lineid): merge by line id --------------------------------------------------

WIDE_DEEP_READER = '''
from generators import MultiSlotStringDataGenerator


class Reader(MultiSlotStringDataGenerator):
    def line_process(self, line):
        data = line.rstrip("\\n").split("\\t")
        lineid, label, c1, c2, dense = data
        return [[lineid], [label], [c1], [c2], dense.split(",")]

    def generate_sample(self, line):
        def reader():
            names = ["insid", "label", "C1", "C2", "dense_input"]
            yield zip(names, self.line_process(line))
        return reader


if __name__ == "__main__":
    Reader().run_from_stdin()
'''
WIDE_DEEP_INPUTS = [
    paddle_var("label", lod_level=0), paddle_var("C1"), paddle_var("C2"),
    paddle_var("dense_input", "float32", (None, 2), lod_level=0),
]


def test_wide_deep_lineid_records_iterate_one_per_line(tmp_path):
    lines = [f"line-{i}\t{i % 2}\t{10 + i}\t{20 + i}\t0.5,{i}" for i in range(6)]
    dataset = in_memory(tmp_path, WIDE_DEEP_READER, lines, WIDE_DEEP_INPUTS, batch_size=4)
    dataset.load_into_memory()
    batches = list(dataset)
    assert [i for b in batches for i in b.ins_ids] == [f"line-{i}" for i in range(6)]
    assert torch.cat([b["dense_input"] for b in batches]).tolist() == [
        [0.5, float(i)] for i in range(6)
    ]


MERGE_LINES = [
    # Two halves of one instance each: the join side (label, C1) and the update
    # side (C2, a dense value); the other side's sparse slot is padded with 0.
    "a\t1\t11\t0\t0,0",
    "b\t0\t12\t0\t0,0",
    "a\t0\t0\t21\t0.5,1",
    "b\t0\t0\t22\t0,0",
    "c\t1\t13\t0\t1,1",       # alone: dropped (merge_size=2)
    "d\t1\t14\t24\t0,0",
    "d\t0\t15\t0\t0,0",       # C1 in both records of d: dropped (a conflict)
    "e\t1\t16\t0\t0,0",
    "e\t1\t0\t26\t0,0",
    "e\t1\t0\t0\t0,0",        # three records of e: dropped (merge_size=2)
]


def test_merge_by_lineid_after_global_shuffle_as_paddle(tmp_path, caplog):
    dataset = in_memory(
        tmp_path, WIDE_DEEP_READER, MERGE_LINES, WIDE_DEEP_INPUTS, batch_size=10,
        merge_size=2, parse_ins_id=True,
    )
    assert (dataset.merge_by_lineid, dataset.parse_ins_id) == (True, True)
    dataset.load_into_memory()
    assert dataset.get_memory_data_size() == 10
    with caplog.at_level(logging.INFO, logger="datafeed"):
        dataset.global_shuffle(seed=1)
    (batch,) = list(dataset)
    merged = {
        ins_id: (label, c1, c2, dense)
        for ins_id, label, c1, c2, dense in zip(
            batch.ins_ids, batch["label"].reshape(-1).tolist(), batch["C1"].tolist(),
            batch["C2"].tolist(), batch["dense_input"].tolist(), strict=True,
        )
    }
    # Sparse slots from the record that holds them; dense ones from the last
    # record that is not all zeros (else the first).
    assert merged == {"a": (1, [11], [21], [0.5, 1.0]), "b": (0, [12], [22], [0.0, 0.0])}
    assert dataset.get_memory_data_size() == 2
    log = caplog.text
    assert "dropped 4 records in groups of another size than merge_size=2" in log
    assert "dropped 2 records in groups where a sparse slot holds values in two records" in log
    assert "slot 'C1'" in log and "10 records -> 2 merged records" in log


def test_merge_of_any_group_size_and_its_replay(tmp_path):
    dataset = in_memory(tmp_path, WIDE_DEEP_READER, MERGE_LINES, WIDE_DEEP_INPUTS, batch_size=10)
    dataset._set_merge_by_lineid(-1)  # Paddle: any group size
    dataset.load_into_memory()
    dataset.global_shuffle(seed=2)
    (batch,) = list(dataset)
    assert sorted(batch.ins_ids) == ["a", "b", "c", "e"]  # d conflicts
    e = batch.ins_ids.index("e")
    assert (batch["C1"][e].tolist(), batch["C2"][e].tolist()) == ([16], [26])
    state = dataset.state_dict()
    again = in_memory(tmp_path, WIDE_DEEP_READER, MERGE_LINES, WIDE_DEEP_INPUTS, batch_size=10)
    again._set_merge_by_lineid(-1)
    again.load_into_memory()
    again.load_state_dict(state)
    assert next(iter(again)).ins_ids == batch.ins_ids


def test_merge_needs_the_instance_ids(tmp_path):
    dataset = in_memory(tmp_path, WIDE_DEEP_READER, MERGE_LINES, WIDE_DEEP_INPUTS, batch_size=10)
    dataset._set_merge_by_lineid(2)
    dataset._set_parse_ins_id(False)  # as Paddle's own test does next
    dataset.update_settings(pipe_command="cut -f 2- | " + dataset._settings["pipe_command"])
    with pytest.raises(Exception):  # noqa: B017 - the lines no longer start with an id
        dataset.load_into_memory()


# -- input_type=1: one batch per line ----------------------------------------------------


@pytest.mark.parametrize("kind", [InMemoryDataset, QueueDataset])
def test_input_type_1_makes_each_line_a_batch_of_one_value_sequences(tmp_path, kind):
    path = tmp_path / "data.txt"
    path.write_text("3 1 2 3 1 0.5 2 7 8\n1 4 1 1.5 1 9\n")
    dataset = kind()
    dataset.init(
        batch_size=1, thread_num=1, input_type=1, pipe_command="cat",
        use_var=[paddle_var("ids"), paddle_var("w", "float32", (None, 1), 0), paddle_var("x")],
    )
    dataset.set_filelist([str(path)])
    if kind is InMemoryDataset:
        dataset.load_into_memory()
    batches = list(dataset)
    assert [b.size for b in batches] == [1, 1]
    first = batches[0]
    assert first["ids"].offsets.tolist() == [0, 1, 2, 3]  # each value its own sequence
    assert first["ids"].tolist() == [[1], [2], [3]]
    assert first["x"].tolist() == [[7], [8]]
    assert first["w"].tolist() == [[0.5]]  # dense slots as usual
    assert batches[1]["ids"].tolist() == [[4]]


def test_input_type_1_needs_batch_size_1(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("1 1\n1 2\n")
    dataset = InMemoryDataset()
    dataset.init(batch_size=2, input_type=1, use_var=[paddle_var("ids")])
    dataset.set_filelist([str(path)])
    dataset.load_into_memory()  # as in Paddle, loading works; batching does not
    with pytest.raises(SchemaError, match="input_type=1 .one batch per line. needs batch_size=1"):
        list(dataset)
