"""The generator cases recorded from Paddle 3.3.1 into ``tests/data/paddle_generators/``.

Each case is a reader (a subclass of one of the three base classes) and its
input. The same cases run on three sets of base classes: Paddle's real ones
(``tests/generators/record_paddle_fixtures.py``, in Paddle's own venv),
fleetfeed's and the oracle's (``tests/generators/test_generators.py``).

This module imports neither Paddle nor fleetfeed at import time: Paddle's venv
has no fleetfeed, and the project's venv has no Paddle. It runs on Python 3.10+.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data" / "paddle_generators"
MANIFEST = FIXTURES / "cases.json"
CRITEO_READER = REPO / "benchmarks" / "readers" / "criteo_reader.py"
CRITEO_RAW = REPO / "examples" / "data" / "real" / "criteo_raw.tsv"
PADDLE_VERSION = "3.3.1"
BASE_NAMES = ("paddle", "fleetfeed", "oracle")

# Values whose text is easy to get wrong: int64/uint64 edges and beyond,
# bools, signed zeros, shortest float reprs at the exponent switch, inf, nan.
SPECIAL_VALUES = [
    0,
    1,
    -1,
    7,
    -42,
    2**31,
    -(2**31),
    2**63 - 1,
    -(2**63),
    2**63,
    -(2**63) - 1,
    2**64,
    2**64 + 1,
    -(2**64),
    10**30,
    -(10**40),
    True,
    False,
    0.0,
    -0.0,
    0.1 + 0.2,
    1e-07,
    1e16,
    1e15,
    1e-4,
    1e-5,
    5e-324,
    2.2250738585072014e-308,
    1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    1.5,
    -2.25,
    123456.789,
    1e22,
    1e23,
    9007199254740993.0,
]

# Samples Paddle writes but fleetfeed refuses with a SampleError, on purpose
# (test_generators.py's checks say why): their recorded bytes check the oracle.
STRICTER_IN_FLEETFEED = frozenset(
    {
        "numeric_sample_without_slots",
        "numeric_str_after_a_float",
        "string_bare_str_values",
    }
)


@dataclass(frozen=True)
class GeneratorCase:
    """A reader and its input: ``stdin_text`` None runs ``run_from_memory``."""

    name: str
    make_reader: Callable[[SimpleNamespace], Any]
    stdin_text: str | None


CASES: dict[str, GeneratorCase] = {}


def base_classes(base_name: str) -> SimpleNamespace:
    """DataGenerator, MultiSlotDataGenerator and MultiSlotStringDataGenerator of
    ``paddle``, ``fleetfeed`` or ``oracle`` (``paddle_generator_oracle``)."""
    if base_name == "paddle":
        from paddle.distributed.fleet.data_generator import data_generator as module
    elif base_name == "fleetfeed":
        import generators as module
    elif base_name == "oracle":
        import paddle_generator_oracle as module
    else:
        raise ValueError(f"base_name must be one of {BASE_NAMES}, got {base_name!r}")
    return SimpleNamespace(
        name=base_name,
        DataGenerator=module.DataGenerator,
        MultiSlotDataGenerator=module.MultiSlotDataGenerator,
        MultiSlotStringDataGenerator=module.MultiSlotStringDataGenerator,
    )


def run_case(case: GeneratorCase, bases: SimpleNamespace) -> dict[str, Any]:
    """Runs one case; returns ``{"output": bytes, "proto_info": ...}`` or, when
    the generator raises, ``{"error": {"type": ..., "message": ...}}``.

    The reader is built before stdout is replaced, so that whatever an import
    prints (Paddle warns at import) stays out of the output."""
    reader = case.make_reader(bases)
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
    saved = sys.stdin, sys.stdout
    try:
        sys.stdout = stdout
        if case.stdin_text is None:
            reader.run_from_memory()
        else:
            sys.stdin = io.StringIO(case.stdin_text)
            reader.run_from_stdin()
        stdout.flush()
    except Exception as error:  # the error is the result
        # Only the type and message: the output written before the error
        # depends on buffering, where fleetfeed and Paddle differ on purpose.
        return {"error": {"type": type(error).__name__, "message": str(error)}}
    finally:
        sys.stdin, sys.stdout = saved
    proto_info = getattr(reader, "_proto_info", None)
    return {
        "output": raw.getvalue(),
        "proto_info": None if proto_info is None else [list(slot) for slot in proto_info],
    }


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------
# The recording: cases.json, and one <case>.txt of exact bytes per case that writes


def write_recording(
    results: dict[str, dict[str, Any]], directory: Path, recorded_with: dict[str, str]
) -> None:
    """Writes ``results`` (of ``run_all``) as ``directory/cases.json`` and its .txt files."""
    directory.mkdir(parents=True, exist_ok=True)
    cases: dict[str, Any] = {}
    for name, result in results.items():
        if "error" in result:
            cases[name] = {"error": result["error"]}
            continue
        output_file = f"{name}.txt"
        (directory / output_file).write_bytes(result["output"])
        cases[name] = {
            "output_file": output_file,
            "bytes": len(result["output"]),
            "sha256": sha256(result["output"]),
            "proto_info": result["proto_info"],
        }
    for stale in set(directory.glob("*.txt")) - {directory / f"{name}.txt" for name in cases}:
        stale.unlink()
    manifest = {"recorded_with": recorded_with, "cases": cases}
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    # A (name, type) pair of proto_info on one line, not four.
    text = re.sub(r'\[\s+("[^"\\]*"),\s+("[^"\\]*")\s+\]', r"[\1, \2]", text)
    (directory / "cases.json").write_text(text, encoding="utf-8")


def read_recording(directory: Path) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """``recorded_with`` and the results, in ``run_case``'s shape, of a recording.

    Each output file must still have the sha256 it was recorded with: an editor
    that strips trailing blanks, or a checkout that converts line ends, would
    otherwise change the expected bytes unnoticed."""
    manifest = json.loads((directory / "cases.json").read_text(encoding="utf-8"))
    results: dict[str, dict[str, Any]] = {}
    for name, entry in manifest["cases"].items():
        if "error" in entry:
            results[name] = {"error": entry["error"]}
            continue
        path = directory / entry["output_file"]
        output = path.read_bytes()
        if sha256(output) != entry["sha256"]:
            raise ValueError(
                f"{path}: its sha256 is not the recorded {entry['sha256']}: the file "
                "changed after recording; restore it or re-record it (README.md beside it)"
            )
        results[name] = {"output": output, "proto_info": entry["proto_info"]}
    return manifest["recorded_with"], results


# --------------------------------------------------------------------------
# Readers


@dataclass(frozen=True)
class ZipOf:
    """A sample yielded as ``zip(names, values)``, as Paddle allows: a zip is
    used up once read, so every run makes its own."""

    names: tuple[Any, ...]
    values: tuple[Any, ...]


def samples_reader(base: type, lines: list[list[Any]]) -> Any:
    """A reader whose input line ``i`` yields the samples ``lines[i]``."""

    class SamplesReader(base):  # type: ignore[misc, valid-type]
        def generate_sample(self, line: Any) -> Any:
            def local_iter() -> Iterator[Any]:
                for sample in lines[int(line)]:
                    if isinstance(sample, ZipOf):
                        sample = zip(sample.names, sample.values, strict=True)
                    yield sample

            return local_iter

    return SamplesReader()


def batching_reader(bases: SimpleNamespace) -> Any:
    """Groups samples by 3; generate_batch reverses each group and adds its size."""

    class Batching(bases.MultiSlotDataGenerator):  # type: ignore[misc, name-defined]
        def generate_sample(self, line: Any) -> Any:
            def local_iter() -> Iterator[Any]:
                yield [("ids", [int(line)])]

            return local_iter

        def generate_batch(self, samples: list) -> Any:
            def local_iter() -> Iterator[Any]:
                yield from reversed(samples)
                yield [("ids", [len(samples)])]

            return local_iter

    reader = Batching()
    reader.set_batch(3)
    return reader


def memory_reader(bases: SimpleNamespace) -> Any:
    """run_from_memory calls generate_sample(None) once."""

    class Memory(bases.MultiSlotDataGenerator):  # type: ignore[misc, name-defined]
        def generate_sample(self, line: Any) -> Any:
            def local_iter() -> Iterator[Any]:
                for index in range(3):
                    yield [("line_is_none", [line is None]), ("index", [index, 0.5 * index])]

            return local_iter

    return Memory()


def no_format_reader(bases: SimpleNamespace) -> Any:
    """A DataGenerator subclass without _gen_str: Paddle's NotImplementedError."""

    class NoFormat(bases.DataGenerator):  # type: ignore[misc, name-defined]
        def generate_sample(self, line: Any) -> Any:
            def local_iter() -> Iterator[Any]:
                yield [("ids", [int(line)])]

            return local_iter

    return NoFormat()


def load_criteo_reader(base_name: str) -> ModuleType:
    """``benchmarks/readers/criteo_reader.py`` on the given base, as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"criteo_reader_{base_name}", CRITEO_READER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("FLEETFEED_BENCH_BASE")
    os.environ["FLEETFEED_BENCH_BASE"] = base_name  # read once, at import
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del os.environ["FLEETFEED_BENCH_BASE"]
        else:
            os.environ["FLEETFEED_BENCH_BASE"] = saved
    return module


# --------------------------------------------------------------------------
# The cases


def add_case(name: str, make_reader: Callable[[SimpleNamespace], Any], stdin: str | None) -> None:
    CASES[name] = GeneratorCase(name, make_reader, stdin)


def add_samples_case(name: str, base_kind: str, lines: list[list[Any]]) -> None:
    """A case of ``samples_reader`` on MultiSlotDataGenerator (``base_kind``
    "numeric") or MultiSlotStringDataGenerator ("string")."""
    attribute = {
        "numeric": "MultiSlotDataGenerator",
        "string": "MultiSlotStringDataGenerator",
    }[base_kind]
    stdin_text = "".join(f"{index}\n" for index in range(len(lines)))
    add_case(name, lambda bases: samples_reader(getattr(bases, attribute), lines), stdin_text)


# The reader of the benchmarks on 100 lines of real Criteo data: the case the
# test against a Paddle install used to cover alone.
add_case(
    "criteo_reader",
    lambda bases: load_criteo_reader(bases.name).CriteoReader(),
    CRITEO_RAW.read_text(encoding="utf-8"),
)

add_samples_case("paddle_docs_example", "numeric", [[[("words", [1, 2, 3]), ("label", [1])]]])
add_samples_case(
    "numeric_special_values",
    "numeric",
    [[[("value", [value]), ("negated", [-value])]] for value in SPECIAL_VALUES]
    + [[[("value", SPECIAL_VALUES), ("negated", [-value for value in SPECIAL_VALUES])]]],
)
# A slot becomes "float" at its first float, in the first sample or later.
add_samples_case(
    "numeric_proto_info",
    "numeric",
    [
        [[("a", [1]), ("b", [2]), ("c", [0.5])]],
        [[("a", [1]), ("b", [2.5]), ("c", [1])]],
        [[("a", [3, 4]), ("b", [5]), ("c", [6, 7.25])]],
    ],
)
add_samples_case(
    "numeric_tuple_and_zip_samples",
    "numeric",
    [
        [(("ids", [3]), ["label", [0]])],
        [ZipOf(("ids", "label"), ([3, 4], [1]))],
        [tuple(zip(["ids", "label"], [[5], [0]], strict=True))],
    ],
)
add_samples_case(
    "numeric_none_samples_skipped",
    "numeric",
    [[None, [("v", [1])], None], [None], [[("v", [2])], [("v", [3, 4])]]],
)
add_case("numeric_generate_batch", batching_reader, "".join(f"{i}\n" for i in range(7)))
add_case("numeric_run_from_memory", memory_reader, None)
add_samples_case(
    "string_values",
    "string",
    [
        [[("words", ["1926", "08", "17"]), ("label", ["1"])]],
        [[(5, ("a", "ü")), ("b", [])]],  # any name, tuples and empty lists pass
        [ZipOf(("x", "y"), (["1"], ["2", "3"]))],
        [(("x", ["-0"]), ("y", ["1e5", "nan"]))],
    ],
)

# Accepted by Paddle, refused by fleetfeed (STRICTER_IN_FLEETFEED).
add_samples_case("numeric_sample_without_slots", "numeric", [[[]]])
add_samples_case(
    "numeric_str_after_a_float", "numeric", [[[("a", [1])]], [[("a", [1.5, "x"])]]]
)
add_samples_case("string_bare_str_values", "string", [[[("words", "abc")]]])

# Refused by Paddle: its exception type and message are recorded.
add_samples_case("error_sample_not_a_list", "numeric", [[{"a": [1]}]])
add_samples_case("error_slot_name_not_str", "numeric", [[[(7, [1])]]])
add_samples_case("error_values_tuple", "numeric", [[[("a", [1]), ("b", (1, 2))]]])
add_samples_case("error_empty_slot_in_first_sample", "numeric", [[[("a", [1]), ("b", [])]]])
add_samples_case(
    "error_empty_slot_in_later_sample",
    "numeric",
    [[[("a", [1]), ("b", [2])]]] * 3 + [[[("a", [1]), ("b", [])]]],
)
add_samples_case("error_str_value_in_first_sample", "numeric", [[[("a", [1, "12"])]]])
add_samples_case(
    "error_str_value_in_later_sample",
    "numeric",
    [[[("a", [1]), ("b", [2])]], [[("a", [3]), ("b", ["12"])]]],
)
add_samples_case("error_none_value", "numeric", [[[("a", [None])]]])
add_samples_case(
    "error_other_slot_count",
    "numeric",
    [[[("a", [1]), ("b", [2]), ("c", [3])]], [[("a", [1]), ("b", [2])]]],
)
add_samples_case(
    "error_other_slot_names",
    "numeric",
    [[[("a", [1]), ("b", [2])]], [[("a", [1]), ("x", [2])]]],
)
add_samples_case("error_string_value_not_str", "string", [[[("words", ["1926", 17])]]])
add_samples_case("error_string_sample_not_a_list", "string", [[{"words": ["1"]}]])
add_case("error_data_generator_without_format", no_format_reader, "1\n")


def run_all(base_name: str) -> dict[str, dict[str, Any]]:
    """Every case on one set of base classes, in CASES' order."""
    bases = base_classes(base_name)
    return {name: run_case(case, bases) for name, case in CASES.items()}
