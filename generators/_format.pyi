"""Type stubs for the compiled sample formatter (generators/_format.pyx)."""

from collections.abc import Callable, Iterable
from typing import Any

class SampleError(ValueError):
    """A sample that cannot be written as MultiSlot text."""

    slot: Any
    sample: int | None
    value: Any
    def __init__(
        self,
        message: str,
        slot: Any = None,
        sample: int | None = None,
        value: Any = None,
    ) -> None: ...

class SampleFormatter:
    """Checks samples and appends their MultiSlot text to a buffer."""

    @property
    def strings(self) -> bool: ...
    @property
    def samples(self) -> int: ...
    @property
    def proto_info(self) -> list[tuple[str, str]] | None: ...
    def __init__(self, *, strings: bool = False) -> None: ...
    def __len__(self) -> int: ...
    def append(self, sample: Any) -> None: ...
    def extend(self, samples: Iterable[Any]) -> int: ...
    def format(self, sample: Any) -> bytes: ...
    def append_text(self, text: str) -> None: ...
    def take(self) -> bytes: ...

def float_repr(value: float) -> str: ...
def run_generator(
    lines: Iterable[str | None],
    generate_sample: Callable[[Any], Callable[[], Iterable[Any]]],
    generate_batch: Callable[[list[Any]], Callable[[], Iterable[Any]]] | None,
    batch_size: int,
    formatter: SampleFormatter,
    gen_str: Callable[[Any], str] | None,
    write: Callable[[bytes], object],
    block_size: int,
) -> None: ...
