"""Tests of the generators package: text, checks, run loop, processes, import.

The oracle is ``paddle_generator_oracle``, a plain-Python model of Paddle's
classes: for every sample Paddle accepts, fleetfeed must write the same bytes.
Real Paddle is the judge of a fixed set of cases (``paddle_generator_cases``,
the Criteo reader among them): its output, recorded from Paddle 3.3.1 in
``tests/data/paddle_generators/``, is compared with fleetfeed's and the
oracle's on every run; where Paddle is installed, also with a fresh recording.
"""

from __future__ import annotations

import functools
import io
import json
import math
import os
import pickle
import random
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, cast

import paddle_generator_cases as paddle_cases
import paddle_generator_oracle as oracle
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import generators
from datafeed.config.errors import add_note
from generators import (
    DataGenerator,
    MultiSlotDataGenerator,
    MultiSlotStringDataGenerator,
    SampleError,
    SampleFormatter,
)
from generators._shortest_float import float_repr
from generators.data_generator import BLOCK_SIZE

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests" / "helpers"
CRITEO_READER = REPO / "benchmarks" / "readers" / "criteo_reader.py"
CRITEO_RAW = REPO / "examples" / "data" / "real" / "criteo_raw.tsv"
PYTHON = sys.executable


def find_paddle_python() -> Path | None:
    """Paddle's interpreter: $FLEETFEED_PADDLE_PYTHON, else .venv-paddle (``make
    record-paddle-fixtures`` builds it), else /opt/paddle-venv; None if none is there."""
    candidates = [
        os.environ.get("FLEETFEED_PADDLE_PYTHON", ""),
        str(REPO / ".venv-paddle" / "bin" / "python"),
        "/opt/paddle-venv/bin/python",
    ]
    return next((Path(c) for c in candidates if c and Path(c).exists()), None)


PADDLE_PYTHON = find_paddle_python()

# Slow machines and shared CI runners: no per-example deadline.
HYPOTHESIS = settings(
    deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow]
)


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]))
    env.pop("PYTHONUNBUFFERED", None)
    env.update(extra)
    return env


def numeric_line(sample: Any) -> bytes:
    """The line fleetfeed's MultiSlotDataGenerator writes for one sample."""
    return MultiSlotDataGenerator()._gen_str(sample).encode()


def oracle_line(sample: Any) -> bytes:
    return oracle.MultiSlotDataGenerator()._gen_str(sample).encode()


def run_to_bytes(
    generator: Any, stdin_text: str | None, monkeypatch: pytest.MonkeyPatch
) -> bytes:
    """Runs ``run_from_stdin`` (or ``run_from_memory`` when stdin_text is None)
    with stdin and stdout replaced, and returns what reached stdout."""
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
    monkeypatch.setattr(sys, "stdout", stdout)
    if stdin_text is None:
        generator.run_from_memory()
    else:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin_text))
        generator.run_from_stdin()
    stdout.flush()
    return raw.getvalue()


# --------------------------------------------------------------------------
# The package surface


def test_public_names_are_sorted_and_complete() -> None:
    assert generators.__all__ == [
        "DataGenerator",
        "MultiSlotDataGenerator",
        "MultiSlotStringDataGenerator",
        "SampleError",
        "SampleFormatter",
    ]
    assert issubclass(SampleError, ValueError)
    assert SampleError.__module__ == "generators"


def test_sample_error_keeps_its_attributes_through_pickle() -> None:
    error = SampleError("slot 'a' of sample 3 is empty", "a", 3, [])
    add_note(error, "in the samples of input line 2: 'x'")  # error.add_note on 3.11+
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.slot, copy.sample, copy.value) == (
        "slot 'a' of sample 3 is empty",
        "a",
        3,
        [],
    )
    assert copy.__notes__ == ["in the samples of input line 2: 'x'"]


def test_import_is_fast_and_light() -> None:
    # A generator process starts once per input file: importing generators
    # must stay cheap and pull in none of the heavy dependencies.
    code = textwrap.dedent(
        """
        import json, sys, time
        start = time.perf_counter()
        import generators
        elapsed = time.perf_counter() - start
        heavy = sorted(m for m in ("torch", "numpy", "pyarrow", "datafeed")
                       if m in sys.modules)
        print(json.dumps({"seconds": elapsed, "heavy": heavy}))
        """
    )
    result = subprocess.run(
        [PYTHON, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=child_env(),
    )
    report = json.loads(result.stdout)
    assert report["heavy"] == []
    # Typically ~2 ms; the bound leaves room for a loaded machine.
    assert report["seconds"] < 0.3, report


# --------------------------------------------------------------------------
# Text: byte-identical to Paddle's


def test_example_from_paddle_docs() -> None:
    sample = [("words", [1, 2, 3]), ("label", [1])]
    assert numeric_line(sample) == b"3 1 2 3 1 1\n" == oracle_line(sample)


SPECIAL_VALUES = paddle_cases.SPECIAL_VALUES  # also a recorded Paddle case


@pytest.mark.parametrize("value", SPECIAL_VALUES, ids=repr)
def test_every_value_is_written_as_str(value: object) -> None:
    line = numeric_line([("v", [value])])
    assert line == f"1 {value}\n".encode()
    assert line == oracle_line([("v", [value])])


@given(st.integers())
@HYPOTHESIS
def test_integers_are_written_as_str(value: int) -> None:
    assert numeric_line([("v", [value, -value])]) == f"2 {value} {-value}\n".encode()


@given(st.floats())
@HYPOTHESIS
def test_floats_are_written_as_str(value: float) -> None:
    assert numeric_line([("v", [value, -value])]) == f"2 {value} {-value}\n".encode()


def test_float_repr_equals_repr_on_edges_and_random_doubles() -> None:
    # The formatter writes finite floats with its own shortest-repr code
    # (Ryu); it must agree with CPython's repr everywhere.
    edges = [
        0.0,
        -0.0,
        5e-324,
        1e-323,
        2.225073858507201e-308,
        2.2250738585072014e-308,
        1.7976931348623157e308,
    ]
    edges += [math.ldexp(1.0, exponent) for exponent in range(-1074, 1024)]
    edges += [math.ldexp(1.0, exponent) * 3 for exponent in range(-1074, 1022)]
    for anchor in (1e16, 1e-4, 1e-5, 1e15, 2.0**53, 1.0, 0.1, 1e22, 1e23):
        value = anchor
        for _ in range(4):
            edges += [value, -value]
            value = math.nextafter(value, math.inf)
        value = anchor
        for _ in range(4):
            value = math.nextafter(value, 0.0)
            edges.append(value)
    edges += [float(integer) for integer in range(-1000, 1000)]
    edges += [integer / 1000 for integer in range(-5000, 5000)]
    rng = random.Random(20240601)
    randoms: list[float] = []
    while len(randoms) < 200_000:
        (value,) = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))
        if math.isfinite(value):
            randoms.append(value)
    values = edges + randoms
    mismatches = [(v, float_repr(v)) for v in values if float_repr(v) != repr(v)]
    assert mismatches == []
    # And through the formatter's buffer path, all in one line.
    line = SampleFormatter().format([("v", values)]).decode()
    assert line == " ".join([str(len(values))] + [repr(v) for v in values]) + "\n"


@given(st.floats(allow_nan=False, allow_infinity=False))
@HYPOTHESIS
def test_float_repr_equals_repr(value: float) -> None:
    assert float_repr(value) == repr(value)


NAMES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters=" \n"),
    min_size=1,
    max_size=8,
)
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(),
    st.booleans(),
)


@st.composite
def numeric_samples(draw: st.DrawFn) -> list[list[tuple[str, list]]]:
    """A few samples with one schema, as a Paddle reader would yield them."""
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    count = draw(st.integers(min_value=1, max_value=5))
    return [
        [(name, draw(st.lists(NUMBERS, min_size=1, max_size=6))) for name in names]
        for _ in range(count)
    ]


@given(numeric_samples())
@HYPOTHESIS
def test_numeric_text_equals_the_oracle(samples: list) -> None:
    ours = MultiSlotDataGenerator()
    theirs = oracle.MultiSlotDataGenerator()
    for sample in samples:
        assert ours._gen_str(sample).encode() == theirs._gen_str(sample).encode()
    assert ours._proto_info == theirs._proto_info


@given(numeric_samples(), st.integers(min_value=1, max_value=4))
@HYPOTHESIS
def test_run_from_stdin_equals_the_oracle(samples: list, batch_size: int) -> None:
    # One input line per sample; the reader looks the sample up by line.
    def reader(base: type) -> Any:
        class Reader(base):  # type: ignore[misc, valid-type]
            def generate_sample(self, line: Any) -> Any:
                def local_iter() -> Iterator[Any]:
                    yield samples[int(line)]
                    yield None  # skipped by both

                return local_iter

        generator = Reader()
        generator.set_batch(batch_size)
        return generator

    stdin_text = "".join(f"{index}\n" for index in range(len(samples)))
    with pytest.MonkeyPatch.context() as monkeypatch:
        ours = run_to_bytes(reader(MultiSlotDataGenerator), stdin_text, monkeypatch)
        theirs = run_to_bytes(
            reader(oracle.MultiSlotDataGenerator), stdin_text, monkeypatch
        )
    assert ours == theirs
    assert ours.count(b"\n") == len(samples)


TEXTS = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters=" \n"), max_size=6
)


@given(st.lists(st.tuples(NAMES, st.lists(TEXTS, max_size=4)), min_size=1, max_size=5))
@HYPOTHESIS
def test_string_text_equals_the_oracle(sample: list) -> None:
    ours = MultiSlotStringDataGenerator()._gen_str(sample)
    assert ours == oracle.MultiSlotStringDataGenerator()._gen_str(sample)


def test_string_generator_writes_values_as_they_are() -> None:
    generator = MultiSlotStringDataGenerator()
    assert generator._gen_str([("words", ["1926", "08", "17"]), ("label", ["1"])]) == (
        "3 1926 08 17 1 1\n"
    )
    # As Paddle: an empty list is written as 0, tuples and any name are fine.
    assert generator._gen_str([(5, ("a", "ü")), ("b", [])]) == "2 a ü 0\n"
    assert generator._gen_str(zip(["x", "y"], [["1"], ["2", "3"]], strict=True)) == "1 1 2 2 3\n"
    assert generator._proto_info is None


def test_string_generator_rejects_a_value_that_is_not_str() -> None:
    generator = MultiSlotStringDataGenerator()
    with pytest.raises(
        SampleError,
        match=r"^slot 'words' of sample 1: expected a str, found 17 \(int\)$",
    ) as caught:
        generator._gen_str([("words", ["1926", 17])])
    assert (caught.value.slot, caught.value.sample, caught.value.value) == (
        "words",
        1,
        17,
    )
    # Paddle would split a bare str into characters ("3 a b c"): refuse it.
    with pytest.raises(
        SampleError,
        match=r"values must be a list or tuple of str, found 'abc' \(str\); "
        r"wrap a single value in a list: \['abc'\]",
    ):
        generator._gen_str([("words", "abc")])


# --------------------------------------------------------------------------
# Checks: Paddle's rules, with messages that say where and what


def formatted(samples: Iterable[Any]) -> MultiSlotDataGenerator:
    """A generator that has already written the given samples."""
    generator = MultiSlotDataGenerator()
    for sample in samples:
        generator._gen_str(sample)
    return generator


def test_sample_that_is_not_a_list() -> None:
    with pytest.raises(
        SampleError,
        match=r"^sample 1 must be a list or tuple of \(name, \[values\]\) pairs, "
        r"found \{'a': \[1\]\} \(dict\)$",
    ) as caught:
        MultiSlotDataGenerator()._gen_str({"a": [1]})
    assert caught.value.slot is None and caught.value.sample == 1


def test_sample_without_slots() -> None:
    with pytest.raises(SampleError, match=r"^sample 1 has no slots"):
        MultiSlotDataGenerator()._gen_str([])


def test_item_that_is_not_a_pair() -> None:
    with pytest.raises(
        SampleError,
        match=r"^item 2 of sample 1 must be a \(name, \[values\]\) pair, "
        r"found \('b', \[1\], 2\) \(tuple\)$",
    ):
        MultiSlotDataGenerator()._gen_str([("a", [1]), ("b", [1], 2)])


def test_slot_name_that_is_not_str() -> None:
    with pytest.raises(
        SampleError, match=r"^slot name 7 \(int\) of sample 1 must be a str$"
    ):
        MultiSlotDataGenerator()._gen_str([(7, [1])])


def test_tuple_of_values_is_rejected_as_paddle_does() -> None:
    with pytest.raises(
        SampleError,
        match=r"^slot 'b' of sample 1: values must be a list, found \(1, 2\) \(tuple\); "
        r"MultiSlotDataGenerator takes only lists, as Paddle's does: "
        r"convert it with list\(\.\.\.\)$",
    ):
        MultiSlotDataGenerator()._gen_str([("a", [1]), ("b", (1, 2))])
    with pytest.raises(
        ValueError, match=r"elements<class 'tuple'> must be in list type"
    ):
        oracle.MultiSlotDataGenerator()._gen_str([("a", [1]), ("b", (1, 2))])


def test_single_value_and_array_get_a_hint() -> None:
    with pytest.raises(
        SampleError, match=r"found 3 \(int\); wrap a single value in a list: \[3\]$"
    ):
        MultiSlotDataGenerator()._gen_str([("a", 3)])
    numpy = pytest.importorskip("numpy")
    with pytest.raises(
        SampleError, match=r"\(ndarray\); convert it with \.tolist\(\)$"
    ):
        MultiSlotDataGenerator()._gen_str([("a", numpy.arange(3))])


def test_empty_slot() -> None:
    generator = formatted([[("a", [1]), ("b", [2])]] * 3)
    with pytest.raises(
        SampleError, match=r"^slot 'b' of sample 4 is empty: pad it in generate_sample$"
    ) as caught:
        generator._gen_str([("a", [1]), ("b", [])])
    assert (caught.value.slot, caught.value.sample, caught.value.value) == ("b", 4, [])


def test_value_that_is_not_a_number() -> None:
    schema = [f"C{index}" for index in range(1, 5)]
    generator = formatted([[(name, [index]) for name in schema] for index in range(11)])
    bad: list[tuple[str, list[object]]] = [(name, [3]) for name in schema]
    bad[2] = ("C3", ["12"])
    with pytest.raises(
        SampleError,
        match=r"^slot 'C3' of sample 12: expected an int or float, found '12' \(str\)$",
    ) as caught:
        generator._gen_str(bad)
    assert (caught.value.slot, caught.value.sample, caught.value.value) == (
        "C3",
        12,
        "12",
    )


def test_other_slot_count_than_the_first_sample() -> None:
    generator = formatted([[("a", [1]), ("b", [2]), ("c", [3])]] * 6)
    with pytest.raises(
        SampleError,
        match=r"^sample 7 has slots \['a', 'b'\] but the first sample had \['a', 'b', 'c'\]$",
    ) as caught:
        generator._gen_str([("a", [1]), ("b", [2])])
    assert caught.value.slot is None


def test_other_slot_names_than_the_first_sample() -> None:
    generator = formatted([[("a", [1]), ("b", [2])]])
    with pytest.raises(
        SampleError,
        match=r"^sample 2 has slots \['a', 'x'\] but the first sample had \['a', 'b'\]$",
    ) as caught:
        generator._gen_str([("a", [1]), ("x", [2])])
    assert caught.value.slot == "x"


def test_every_value_is_checked_even_after_a_float() -> None:
    # Paddle stops checking a slot once a float has made it a float slot and
    # writes the str that follows; fleetfeed keeps checking.
    samples = [[("a", [1])], [("a", [1.5, "x"])]]
    assert oracle_lines(samples) == ["1 1\n", "2 1.5 x\n"]
    generator = formatted(samples[:1])
    with pytest.raises(
        SampleError, match=r"^slot 'a' of sample 2: expected an int or float, found 'x'"
    ):
        generator._gen_str(samples[1])


def oracle_lines(samples: list) -> list[str]:
    generator = oracle.MultiSlotDataGenerator()
    return [generator._gen_str(sample) for sample in samples]


def test_a_failed_sample_changes_nothing() -> None:
    formatter = SampleFormatter()
    formatter.append([("a", [1]), ("b", [2])])
    with pytest.raises(SampleError, match="sample 2"):
        formatter.append([("a", [1.5, 2**80]), ("b", ["no"])])
    # No partial line, the float seen in 'a' is not recorded, and the next
    # sample takes the failed one's number.
    assert formatter.take() == b"1 1 1 2\n"
    assert formatter.proto_info == [("a", "uint64"), ("b", "uint64")]
    with pytest.raises(SampleError, match="of sample 2:"):
        formatter.append([("a", [1]), ("b", [None])])
    assert formatter.samples == 1


def test_a_failed_first_sample_fixes_no_schema() -> None:
    # Paddle keeps the slots before the failure as the schema; fleetfeed
    # keeps none, so the next sample is checked as a first sample.
    generator = MultiSlotDataGenerator()
    with pytest.raises(SampleError):
        generator._gen_str([("a", [1]), ("b", [])])
    assert generator._proto_info is None
    assert generator._gen_str([("x", [2])]) == "1 2\n"


def test_proto_info_follows_paddle() -> None:
    samples = [
        [("a", [1]), ("b", [2]), ("c", [0.5])],
        [("a", [1]), ("b", [2.5]), ("c", [1])],
    ]
    generator = formatted(samples)
    reference = oracle.MultiSlotDataGenerator()
    for sample in samples:
        reference._gen_str(sample)
    assert (
        generator._proto_info
        == reference._proto_info
        == [
            ("a", "uint64"),
            ("b", "float"),
            ("c", "float"),
        ]
    )
    generator._proto_info = None
    assert generator._proto_info is None
    with pytest.raises(ValueError, match="can only be reset to None"):
        generator._proto_info = [("a", "uint64")]


def test_zip_and_tuple_samples() -> None:
    sample = zip(["ids", "label"], [[3, 4], [1]], strict=True)
    assert numeric_line(sample) == b"2 3 4 1 1\n"
    assert numeric_line((("ids", [3]), ["label", [0]])) == b"1 3 1 0\n"


def test_numpy_scalars_are_numbers() -> None:
    numpy = pytest.importorskip("numpy")
    values = [
        numpy.int64(-5),
        numpy.uint64(2**64 - 1),
        numpy.int8(7),
        numpy.int32(2**31 - 1),
        numpy.float64(0.1),
        numpy.float32(0.1),
        numpy.float16(0.5),
        numpy.longdouble(0.25),
    ]
    generator = MultiSlotDataGenerator()
    line = generator._gen_str([("ids", values[:4]), ("dense", values[4:])])
    assert line == "4 -5 18446744073709551615 7 2147483647 4 0.1 0.1 0.5 0.25\n"
    assert generator._proto_info == [("ids", "uint64"), ("dense", "float")]
    # Paddle rejects numpy.int64 and numpy.float32 (they are no int or float).
    with pytest.raises(ValueError, match=r"element<class 'numpy.int64'>"):
        oracle.MultiSlotDataGenerator()._gen_str([("ids", [numpy.int64(1)])])
    with pytest.raises(
        SampleError, match=r"expected an int or float, found .*\(bool\)$"
    ):
        MultiSlotDataGenerator()._gen_str([("flag", [numpy.bool_(True)])])


def test_other_integer_types_and_rejected_numbers() -> None:
    class Index:
        def __index__(self) -> int:
            return 9

        def __str__(self) -> str:
            return "9"

    assert numeric_line([("a", [Index(), True])]) == b"2 9 True\n"
    from decimal import Decimal
    from fractions import Fraction

    for value in (Decimal("1.5"), Fraction(1, 2), None, 1j, b"1"):
        with pytest.raises(SampleError, match="expected an int or float"):
            numeric_line([("a", [value])])


def test_formatter_extend_and_take() -> None:
    formatter = SampleFormatter()
    assert formatter.extend([[("a", [1])], [("a", [2, 3])]]) == 2
    assert len(formatter) == len(b"1 1\n2 2 3\n")
    assert formatter.format([("a", [4])]) == b"1 4\n"  # not kept in the buffer
    assert formatter.take() == b"1 1\n2 2 3\n"
    assert formatter.take() == b""
    assert formatter.samples == 3


def test_long_samples_grow_the_buffer() -> None:
    values = list(range(-100_000, 100_000))
    line = SampleFormatter().format([("a", values), ("b", [1.5])])
    assert line == (" ".join(map(str, [len(values), *values])) + " 1 1.5\n").encode()


# --------------------------------------------------------------------------
# The run loop


class ListReader(MultiSlotDataGenerator):
    """Each line 'a,b,c' becomes the sample [('ids', [a, b, c])]."""

    def generate_sample(self, line: Any) -> Any:
        def local_iter() -> Iterator[Any]:
            yield [("ids", [int(value) for value in line.split(",")])]

        return local_iter


class OracleListReader(oracle.MultiSlotDataGenerator):
    generate_sample = ListReader.generate_sample


def test_run_from_stdin_writes_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run_to_bytes(ListReader(), "1,2\n3\n-4,5,6\n", monkeypatch) == (
        b"2 1 2\n1 3\n3 -4 5 6\n"
    )


def test_batches_reach_generate_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    def batching(base: type) -> Any:
        class Batching(base):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.sizes: list[int] = []

            def generate_sample(self, line: Any) -> Any:
                def local_iter() -> Iterator[Any]:
                    yield [("ids", [int(line)])]

                return local_iter

            def generate_batch(self, samples: list) -> Any:
                self.sizes.append(len(samples))

                def local_iter() -> Iterator[Any]:
                    yield from reversed(samples)
                    yield [("ids", [len(samples)])]

                return local_iter

        generator = Batching()
        generator.set_batch(3)
        return generator

    stdin_text = "".join(f"{index}\n" for index in range(7))
    ours, theirs = (
        batching(MultiSlotDataGenerator),
        batching(oracle.MultiSlotDataGenerator),
    )
    output = run_to_bytes(ours, stdin_text, monkeypatch)
    assert output == run_to_bytes(theirs, stdin_text, monkeypatch)
    assert output == b"1 2\n1 1\n1 0\n1 3\n1 5\n1 4\n1 3\n1 3\n1 6\n1 1\n"
    assert ours.sizes == theirs.sizes == [3, 3, 1]


def test_none_samples_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    class Sparse(MultiSlotDataGenerator):
        def generate_sample(self, line: Any) -> Any:
            def local_iter() -> Iterator[Any]:
                yield None
                if line.strip() != "skip":
                    yield [("v", [len(line)])]
                yield None

            return local_iter

    assert run_to_bytes(Sparse(), "ab\nskip\nabcd\n", monkeypatch) == b"1 3\n1 5\n"


def test_run_from_memory_passes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    class Memory(MultiSlotDataGenerator):
        def generate_sample(self, line: Any) -> Any:
            def local_iter() -> Iterator[Any]:
                for index in range(3):
                    yield [("line", [repr(line) == "None"]), ("index", [index])]

            return local_iter

    assert run_to_bytes(Memory(), None, monkeypatch) == (
        b"1 True 1 0\n1 True 1 1\n1 True 1 2\n"
    )


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True, "3", None])
def test_set_batch_needs_a_positive_int(batch_size: object) -> None:
    with pytest.raises(ValueError, match=r"the batch size must be an int >= 1, got "):
        ListReader().set_batch(batch_size)  # type: ignore[arg-type]


def test_batch_size_set_directly_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = ListReader()
    generator.batch_size_ = 0
    with pytest.raises(ValueError, match=r"got 0$"):
        run_to_bytes(generator, "1\n", monkeypatch)


def test_base_class_messages_are_paddles(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        NotImplementedError, match=r"^Please rewrite this function to return"
    ):
        MultiSlotDataGenerator().generate_sample("1\n")

    class NoFormat(DataGenerator):
        generate_sample = ListReader.generate_sample

    with pytest.raises(NotImplementedError) as caught:
        run_to_bytes(NoFormat(), "1\n", monkeypatch)
    # Paddle's message, and a note naming the input line, as for any error of the loop.
    assert str(caught.value) == "pls use MultiSlotDataGenerator or PairWiseDataGenerator"
    assert caught.value.__notes__ == ["in the samples of input line 1: '1\\n'"]


def test_own_gen_str_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    class PairWise(DataGenerator):
        generate_sample = ListReader.generate_sample

        def _gen_str(self, line: Any) -> str:
            return "pair " + ",".join(map(str, line[0][1])) + "\n"

    assert run_to_bytes(PairWise(), "1,2\n3\n", monkeypatch) == b"pair 1,2\npair 3\n"


def test_own_gen_str_on_top_of_the_built_in_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Tagged(ListReader):
        def _gen_str(self, line: Any) -> str:
            return "tag " + super()._gen_str(line)

    generator = Tagged()
    assert run_to_bytes(generator, "1,2\n3\n", monkeypatch) == b"tag 2 1 2\ntag 1 3\n"
    assert generator._proto_info == [("ids", "uint64")]
    with pytest.raises(SampleError, match=r"^slot 'ids' of sample 3: expected"):
        generator._gen_str([("ids", ["x"])])


def test_init_without_super_still_works(monkeypatch: pytest.MonkeyPatch) -> None:
    class Forgetful(ListReader):
        def __init__(self) -> None:
            self.note = "no super().__init__()"

    assert run_to_bytes(Forgetful(), "5\n", monkeypatch) == b"1 5\n"


def test_sample_error_notes_the_input_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        SampleError, match=r"^slot 'ids' of sample 2 is empty"
    ) as caught:
        run_to_bytes(EmptyOnBlank(), "1\n\n3\n", monkeypatch)
    assert caught.value.__notes__ == ["in the samples of input line 2: '\\n'"]


class RaisesOnLine3(MultiSlotDataGenerator):
    """A reader whose own code fails on the third input line."""

    def __init__(self) -> None:
        super().__init__()
        self.lines = 0

    def generate_sample(self, line: Any) -> Any:
        self.lines += 1
        if self.lines == 3:
            raise ValueError("the reader's own error")

        def local_iter() -> Iterator[Any]:
            yield [("ids", [int(line)])]

        return local_iter


def test_the_readers_own_error_notes_the_input_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under a pipe command this note, under the traceback on stderr, is where
    # datafeed's ReaderError finds the line.
    with pytest.raises(ValueError) as caught:
        run_to_bytes(RaisesOnLine3(), "1\n2\n3\n4\n", monkeypatch)
    assert str(caught.value) == "the reader's own error"
    assert caught.value.__notes__ == ["in the samples of input line 3: '3\\n'"]


def test_a_failed_write_is_not_noted_as_an_input_lines_error() -> None:
    def write(block: bytes) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="^disk full") as caught:
        ListReader().write_multislot(["1\n", "2\n"], write, block_size=1)
    assert not hasattr(caught.value, "__notes__")


class EmptyOnBlank(MultiSlotDataGenerator):
    def generate_sample(self, line: Any) -> Any:
        def local_iter() -> Iterator[Any]:
            yield [("ids", [int(v) for v in line.split()])]

        return local_iter


def test_write_multislot_writes_what_run_from_stdin_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stdin_text = "1,2\n3\n-4,5,6\n"
    generator = ListReader()
    blocks: list[bytes] = []
    generator.write_multislot(io.StringIO(stdin_text), blocks.append, block_size=6)
    assert blocks == [b"2 1 2\n", b"1 3\n3 -4 5 6\n"]
    assert b"".join(blocks) == run_to_bytes(ListReader(), stdin_text, monkeypatch)
    # run_from_stdin's own formatter (and its schema) is left alone.
    assert generator._proto_info is None


def test_write_multislot_starts_a_fresh_formatter_each_time() -> None:
    generator = EmptyOnBlank()
    for _ in range(2):
        blocks: list[bytes] = []
        with pytest.raises(SampleError, match=r"^slot 'ids' of sample 2 is empty") as caught:
            generator.write_multislot(["1\n", "\n"], blocks.append)
        assert caught.value.__notes__ == ["in the samples of input line 2: '\\n'"]
        assert blocks == []


def test_write_multislot_checks_the_batch_size() -> None:
    generator = ListReader()
    generator.batch_size_ = 0
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        generator.write_multislot(["1\n"], [].append)


def test_which_classes_use_the_built_in_format() -> None:
    class Batching(ListReader):
        def generate_batch(self, samples: list) -> Any:
            return super().generate_batch(samples)

    class OwnText(ListReader):
        def _gen_str(self, line: Any) -> str:
            return "text\n"

    class OwnFormatter(ListReader):
        def _new_formatter(self) -> SampleFormatter:
            return SampleFormatter(strings=True)

    class Strings(MultiSlotStringDataGenerator):
        pass

    expected = {
        DataGenerator: (False, False),
        MultiSlotDataGenerator: (True, True),
        ListReader: (True, True),
        Batching: (True, False),
        OwnText: (False, False),
        OwnFormatter: (True, False),
        MultiSlotStringDataGenerator: (True, False),
        Strings: (True, False),
    }
    found = {
        cls: (cls.uses_builtin_format(), cls.writes_samples_as_given()) for cls in expected
    }
    assert found == expected
    assert ListReader().writes_samples_as_given() is True


class RecordingStdout:
    """A stdout whose binary layer records the size of every write."""

    def __init__(self, chunk_limit: int | None = None) -> None:
        self.buffer = RecordingBuffer(chunk_limit)

    def flush(self) -> None:
        pass


class RecordingBuffer:
    def __init__(self, chunk_limit: int | None) -> None:
        self.data = bytearray()
        self.writes: list[int] = []
        self.chunk_limit = chunk_limit

    def write(self, block: bytes | memoryview) -> int:
        # Like a raw FileIO under PYTHONUNBUFFERED: it may take only part.
        taken = bytes(block[: self.chunk_limit] if self.chunk_limit else block)
        self.data += taken
        self.writes.append(len(taken))
        return len(taken)


@pytest.mark.parametrize("chunk_limit", [None, 1000])
def test_output_goes_out_in_large_blocks(
    monkeypatch: pytest.MonkeyPatch, chunk_limit: int | None
) -> None:
    stdout = RecordingStdout(chunk_limit)
    monkeypatch.setattr(sys, "stdout", stdout)
    lines = [
        ",".join(str(index * 1000 + k) for k in range(50)) for index in range(2000)
    ]
    monkeypatch.setattr(
        sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines))
    )
    ListReader().run_from_stdin()
    expected = b"".join(
        ("50 " + line.replace(",", " ") + "\n").encode() for line in lines
    )
    assert bytes(stdout.buffer.data) == expected
    if chunk_limit is None:
        assert len(stdout.buffer.writes) == len(expected) // BLOCK_SIZE + 1
        assert all(size >= BLOCK_SIZE for size in stdout.buffer.writes[:-1])


def test_text_only_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    stdout = io.StringIO()
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stdin", io.StringIO("1,2\n"))
    ListReader().run_from_stdin()
    assert stdout.getvalue() == "2 1 2\n"


# --------------------------------------------------------------------------
# Real generator processes


READER_SCRIPT = """
from generators import MultiSlotDataGenerator

class Reader(MultiSlotDataGenerator):
    def generate_sample(self, line):
        def local_iter():
            label, *values = line.split()
            yield [("values", [float(v) if "." in v else int(v) for v in values]),
                   ("label", [int(label)])]
        return local_iter

if __name__ == "__main__":
    Reader().run_from_stdin()
"""


def run_reader(
    tmp_path: Path, stdin_text: str, **env: str
) -> subprocess.CompletedProcess[bytes]:
    script = tmp_path / "reader.py"
    script.write_text(READER_SCRIPT)
    data = tmp_path / "input.txt"
    data.write_text(stdin_text)
    with open(data, "rb") as stdin:
        return subprocess.run(
            [PYTHON, str(script)],
            stdin=stdin,
            capture_output=True,
            check=False,  # the tests look at the status
            timeout=60,
            env=child_env(**env),
        )


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_reader_process(tmp_path: Path, unbuffered: str) -> None:
    stdin_text = "".join(
        f"{i % 2} {i} {-i} {i}.5 {10**20 + i}\n" for i in range(30_000)
    )
    env = {"PYTHONUNBUFFERED": unbuffered} if unbuffered else {}
    result = run_reader(tmp_path, stdin_text, **env)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b""
    expected = "".join(
        f"4 {i} {-i} {i}.5 {10**20 + i} 1 {i % 2}\n" for i in range(30_000)
    ).encode()
    assert result.stdout == expected


def test_reader_process_with_a_bad_sample(tmp_path: Path) -> None:
    # The reader's own errors pass through unchanged, the input line noted after them.
    result = run_reader(tmp_path, "1 2 3\n0 4 x5\n")
    assert result.returncode == 1
    assert result.stderr.decode().endswith(
        "ValueError: invalid literal for int() with base 10: 'x5'\n"
        "in the samples of input line 2: '0 4 x5\\n'\n"
    )

    result = run_reader(tmp_path, "1 2 3\n0\n")
    assert result.returncode == 1
    stderr = result.stderr.decode()
    assert (
        "generators.SampleError: slot 'values' of sample 2 is empty: pad it in "
        "generate_sample" in stderr
    )
    assert "in the samples of input line 2: '0\\n'" in stderr


def test_reader_process_stops_cleanly_on_a_closed_pipe(tmp_path: Path) -> None:
    script = tmp_path / "reader.py"
    script.write_text(READER_SCRIPT)
    data = tmp_path / "input.txt"
    data.write_text("".join(f"1 {i} {i}.25\n" for i in range(200_000)))
    # Popen's context manager closes the pipes and waits, also on failure.
    with (
        open(data, "rb") as stdin,
        subprocess.Popen(
            [PYTHON, str(script)],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
        ) as process,
    ):
        stdout = cast(IO[bytes], process.stdout)
        head = stdout.read(100)
        stdout.close()  # like `| head -c 100`
        stderr = cast(IO[bytes], process.stderr).read().decode()
        returncode = process.wait(timeout=60)
    assert head.startswith(b"2 0 0.25 1 1\n2 1 1.25 1 1\n")
    assert returncode == 1
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines == [
        "reader.py: stdout was closed by the process reading it (broken pipe); stopping"
    ]


def criteo_output(python: str, base: str, env_extra: dict[str, str]) -> bytes:
    env = child_env(FLEETFEED_BENCH_BASE=base, **env_extra)
    if base == "paddle":
        env.pop("PYTHONPATH")
    with open(CRITEO_RAW, "rb") as stdin:
        result = subprocess.run(
            [python, str(CRITEO_READER)],
            stdin=stdin,
            capture_output=True,
            check=False,  # asserted below, with the stderr in the message
            timeout=300,
            env=env,
        )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    return result.stdout


def test_criteo_reader_matches_the_oracle() -> None:
    ours = criteo_output(PYTHON, "fleetfeed", {})
    assert ours == criteo_output(PYTHON, "oracle", {})
    assert ours.count(b"\n") == 100
    first = ours.split(b"\n")[0].split()
    assert first[0] == b"13" and len(first) == 14 + 26 * 2 + 2


# --------------------------------------------------------------------------
# Real Paddle: its recorded output (tests/data/paddle_generators/README.md)


@functools.cache
def recorded_paddle() -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """What the recording was made with, and Paddle's result for every case.
    Read on first use: a damaged recording fails the tests that use it, no more."""
    return paddle_cases.read_recording(paddle_cases.FIXTURES)


def paddle_mismatches(name: str, paddle: dict[str, Any]) -> list[str]:
    """How fleetfeed and the oracle differ from Paddle's result on case ``name``.

    The oracle must match Paddle exactly, error messages included. fleetfeed
    must write Paddle's bytes and ``_proto_info``; where Paddle raises, it must
    raise too: its own SampleError (messages that say where), or Paddle's
    exception word for word. A few samples that Paddle writes, fleetfeed
    refuses on purpose (``STRICTER_IN_FLEETFEED``)."""
    case = paddle_cases.CASES[name]
    ours = paddle_cases.run_case(case, paddle_cases.base_classes("fleetfeed"))
    model = paddle_cases.run_case(case, paddle_cases.base_classes("oracle"))
    problems = []
    if model != paddle:
        problems.append(f"{name}: the oracle {differs(model, paddle)}")
    if "error" in paddle or name in paddle_cases.STRICTER_IN_FLEETFEED:
        error = ours.get("error")
        fleetfeeds_own = error is not None and error["type"] == "SampleError"
        if not (fleetfeeds_own or error == paddle.get("error")):
            problems.append(f"{name}: fleetfeed {differs(ours, paddle)}")
    elif ours != paddle:
        problems.append(f"{name}: fleetfeed {differs(ours, paddle)}")
    return problems


def differs(result: dict[str, Any], paddle: dict[str, Any]) -> str:
    """Where a result of run_case differs from Paddle's, in a line: a line number
    finds a difference in 50 kB of output sooner than a diff does."""

    def outcome(result: dict[str, Any]) -> str:
        if "error" in result:
            return f"raised {result['error']['type']}: {result['error']['message']}"
        lines = result["output"].count(b"\n")
        return f"wrote {lines} lines"

    if "output" not in result or "output" not in paddle:
        return f"{outcome(result)}; Paddle {outcome(paddle)}"
    if result["proto_info"] != paddle["proto_info"]:
        return f"has _proto_info {result['proto_info']}; Paddle {paddle['proto_info']}"
    ours, theirs = (r["output"].splitlines(keepends=True) for r in (result, paddle))
    for number, (line, paddles) in enumerate(zip(ours, theirs, strict=False), start=1):
        if line != paddles:
            column = next(
                (i for i, (a, b) in enumerate(zip(line, paddles, strict=False)) if a != b),
                min(len(line), len(paddles)),
            )
            start = max(column - 40, 0)
            return (
                f"wrote at line {number}, byte {column + 1}: {line[start : column + 40]!r}; "
                f"Paddle {paddles[start : column + 40]!r}"
            )
    return f"{outcome(result)}; Paddle {outcome(paddle)}"


def test_every_case_is_recorded() -> None:
    recorded_with, recorded = recorded_paddle()
    assert recorded_with["paddlepaddle"] == paddle_cases.PADDLE_VERSION
    # A new or renamed case needs a new recording: make record-paddle-fixtures.
    assert list(recorded) == list(paddle_cases.CASES)


@pytest.mark.parametrize("name", list(paddle_cases.CASES))
def test_generators_match_recorded_paddle(name: str) -> None:
    assert paddle_mismatches(name, recorded_paddle()[1][name]) == []


def test_criteo_reader_process_matches_recorded_paddle() -> None:
    # As a pipe command runs it: a process of its own, stdout a pipe.
    ours = {"output": criteo_output(PYTHON, "fleetfeed", {}), "proto_info": None}
    paddle = dict(recorded_paddle()[1]["criteo_reader"], proto_info=None)  # not seen from outside
    assert ours == paddle, differs(ours, paddle)


@pytest.mark.slow
@pytest.mark.skipif(
    PADDLE_PYTHON is None,
    reason="needs Paddle: make record-paddle-fixtures installs it in .venv-paddle",
)
def test_generators_match_live_paddle(tmp_path: Path) -> None:
    env = child_env()
    env.pop("PYTHONPATH")  # Paddle's venv imports nothing of this checkout but the cases
    recorder = REPO / "tests" / "generators" / "record_paddle_fixtures.py"
    result = subprocess.run(
        [str(PADDLE_PYTHON), str(recorder), "--output-dir", str(tmp_path), "--any-version"],
        capture_output=True,
        check=False,  # asserted below, with the stderr in the message
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    live_with, live = paddle_cases.read_recording(tmp_path)
    assert list(live) == list(paddle_cases.CASES)
    problems = [problem for name in live for problem in paddle_mismatches(name, live[name])]
    assert problems == [], f"against Paddle {live_with['paddlepaddle']}"
    recorded_with, recorded = recorded_paddle()
    if live_with["paddlepaddle"] == recorded_with["paddlepaddle"]:
        stale = [name for name in live if live[name] != recorded[name]]
        assert stale == [], "recorded cases that Paddle no longer writes: re-record them"
