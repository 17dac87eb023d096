"""A slow, plain-Python model of Paddle's data generator base classes.

Written from a record of Paddle's generator semantics (Paddle's
``paddle.distributed.fleet.data_generator``, read as a specification) and from probing Paddle 3.3.1,
not from Paddle's code. It is the oracle of ``tests/generators/test_generators.py``: for
every sample Paddle accepts, fleetfeed's generators must write the same bytes.
It also stands in for Paddle's base class in ``benchmarks/bench_generator.py``.

Paddle's behaviour is reproduced on purpose, bugs included:

* the error messages are Paddle's, word for word;
* ``numpy.int64`` values are rejected (not an ``int``); ``numpy.float64`` is a
  ``float`` subclass and passes; ``numpy.float32`` is rejected;
* the first sample builds ``_proto_info`` slot by slot, so a first sample that
  fails half-way leaves a partial ``_proto_info`` behind;
* in later samples a slot's values are type-checked only while the slot is
  still ``"uint64"``: the first ``float`` upgrades it to ``"float"`` and every
  value after that, in this sample or a later one, is written unchecked;
* ``run_from_stdin`` writes each sample with ``sys.stdout.write`` and never
  flushes explicitly.
"""

# Paddle raises ValueError for values of the wrong type; so must its model.
# ruff: noqa: TRY004

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

Sample = Any  # a list or tuple of (name, [values]) pairs, or a zip of them
SampleSource = Callable[[], Iterable[Sample]]


class DataGenerator:
    """Paddle's ``DataGenerator``: the run loop, without a text format."""

    def __init__(self) -> None:
        self._proto_info: list[tuple[str, str]] | None = None
        self.batch_size_ = 32

    def set_batch(self, batch_size: int) -> None:
        """Sets how many samples are grouped before ``generate_batch``."""
        self.batch_size_ = batch_size

    def run_from_memory(self) -> None:
        """Runs ``generate_sample(None)`` and writes its samples to stdout."""
        self._run_lines([None])

    def run_from_stdin(self) -> None:
        """Runs ``generate_sample`` on every stdin line, samples to stdout."""
        self._run_lines(sys.stdin)

    def _run_lines(self, lines: Iterable[str | None]) -> None:
        batch_samples: list[Sample] = []
        for line in lines:
            line_iter = self.generate_sample(line)
            for user_parsed_line in line_iter():
                if user_parsed_line is None:
                    continue
                batch_samples.append(user_parsed_line)
                if len(batch_samples) == self.batch_size_:
                    self._write_batch(batch_samples)
                    batch_samples = []
        if len(batch_samples) > 0:
            self._write_batch(batch_samples)

    def _write_batch(self, batch_samples: list[Sample]) -> None:
        for sample in self.generate_batch(batch_samples)():
            sys.stdout.write(self._gen_str(sample))

    def _gen_str(self, line: Sample) -> str:
        raise NotImplementedError(
            "pls use MultiSlotDataGenerator or PairWiseDataGenerator"
        )

    def generate_sample(self, line: str | None) -> SampleSource:
        """Must be overridden: returns a callable that yields samples."""
        raise NotImplementedError(
            "Please rewrite this function to return a list or tuple: "
            "[(name, [feasign, ...]), ...] or ((name, [feasign, ...]), ...)"
        )

    def generate_batch(self, samples: list[Sample]) -> SampleSource:
        """Returns a callable that yields the samples of a batch unchanged."""

        def local_iter() -> Iterator[Sample]:
            yield from samples

        return local_iter


def _field_text(elements: Any) -> str:
    # One field: the value count, then every value through str().
    return " ".join([str(len(elements))] + [str(element) for element in elements])


class MultiSlotStringDataGenerator(DataGenerator):
    """Paddle's string generator: no checks, values must already be str."""

    def _gen_str(self, line: Sample) -> str:
        if isinstance(line, zip):
            line = list(line)
        if not isinstance(line, (list, tuple)):
            raise ValueError(
                "the output of process() must be in list or tuple type"
                "Examples: [('words', ['1926', '08', '17']), ('label', ['1'])]"
            )
        fields = []
        for _name, elements in line:
            # str.join raises Paddle's raw TypeError for a value that is not str.
            fields.append(" ".join([str(len(elements))] + list(elements)))
        return " ".join(fields) + "\n"


class MultiSlotDataGenerator(DataGenerator):
    """Paddle's numeric generator with its first-sample ``_proto_info`` checks."""

    def _gen_str(self, line: Sample) -> str:
        if isinstance(line, zip):
            line = list(line)
        if not isinstance(line, (list, tuple)):
            raise ValueError(
                "the output of process() must be in list or tuple type"
                "Example: [('words', [1926, 08, 17]), ('label', [1])]"
            )
        if self._proto_info is None:
            return self._first_sample_text(line)
        return self._later_sample_text(line)

    def _first_sample_text(self, line: list | tuple) -> str:
        # _proto_info is assigned before the loop, so a failure half-way
        # leaves the slots seen so far behind (Paddle's behaviour).
        self._proto_info = []
        fields = []
        for name, elements in line:
            _check_name_and_elements(name, elements)
            # The slot is recorded before its values are checked, and every
            # value of the first sample is checked, even after a float.
            self._proto_info.append((name, "uint64"))
            for element in elements:
                if isinstance(element, float):
                    self._proto_info[-1] = (name, "float")
                elif not isinstance(element, int):
                    raise ValueError(
                        f"the type of element{type(element)} must be in int or float"
                    )
            fields.append(_field_text(elements))
        return " ".join(fields) + "\n"

    def _later_sample_text(self, line: list | tuple) -> str:
        proto_info = self._proto_info
        if proto_info is None:
            raise RuntimeError("_later_sample_text needs the first sample's slots")
        if len(line) != len(proto_info):
            raise ValueError(
                "the complete field set of two given line are inconsistent."
            )
        fields = []
        for index, (name, elements) in enumerate(line):
            _check_name_and_elements(name, elements)
            expected_name, slot_type = proto_info[index]
            if name != expected_name:
                raise ValueError(
                    "the field name of two given line are not match: "
                    f"require<{expected_name}>, get<{name}>."
                )
            if slot_type == "uint64":
                for element in elements:
                    if isinstance(element, float):
                        # The upgrade ends the checks, for the rest of this
                        # list too: later values are not looked at.
                        proto_info[index] = (expected_name, "float")
                        break
                    if not isinstance(element, int):
                        raise ValueError(
                            f"the type of element{type(element)} must be in int or float"
                        )
            fields.append(_field_text(elements))
        return " ".join(fields) + "\n"


def _check_name_and_elements(name: Any, elements: Any) -> None:
    if not isinstance(name, str):
        raise ValueError(f"name{type(name)} must be in str type")
    if not isinstance(elements, list):
        raise ValueError(f"elements{type(elements)} must be in list type")
    if not elements:
        raise ValueError(
            "the elements of each field can not be empty, "
            "you need padding it in process()."
        )
