"""Type stubs for the compiled sample checks (generators/_sample_checks.pyx)."""

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
