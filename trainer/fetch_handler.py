"""Paddle's ``FetchHandler``: called every ``period_secs`` with current values.

``Executor.train_from_dataset(..., fetch_handler=FetchHandler(...))`` starts a
monitor thread, as Paddle's ``FetchHandlerMonitor`` does: every
``period_secs`` it reads the variables of ``var_dict`` and calls
``handler(res_dict)`` with ``{key: numpy array}`` (``None`` for a variable
with no value yet). For a torch model a variable is a name: a key of the
dict the model returns (``"loss"``, ``"prob"``, ...) or a dense slot of the
batch, each as of the last batch. The thread stops, and is joined, when the
pass ends, whether it succeeded or failed; an error the handler raised is
raised by ``train_from_dataset`` after the pass. Unlike Paddle, the first call
comes ``period_secs`` after the start (Paddle counts whole seconds) and a
fraction of a second is a valid period.

This module does not import torch.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["FetchHandler"]


class FetchHandler:
    """Paddle's periodic fetch handler; subclass it and override ``handler``.

    Args:
        var_dict: ``{key: variable}``; a variable is an output name of the
            model's dict or a dense slot name (or an object with a ``.name``).
        period_secs: seconds between two calls of ``handler``.
    """

    def __init__(self, var_dict: Mapping[str, Any] | None = None, period_secs: float = 60) -> None:
        if var_dict is None:
            raise ValueError("FetchHandler needs var_dict: {key: output or slot name}")
        self.var_dict = var_dict
        self.period_secs = period_secs

    def handler(self, res_dict: Mapping[str, Any]) -> None:
        """Called every ``period_secs`` with ``{key: numpy array or None}``; by
        default prints the first value of each array, as Paddle's does."""
        for key, value in res_dict.items():
            if hasattr(value, "reshape") and getattr(value, "size", 0):
                sys.stdout.write(f"{key}[0]: {value.reshape(-1)[0]} ")
        sys.stdout.write("\n")

    @staticmethod
    def help() -> None:
        """Prints how to write a handler (Paddle has the same helper)."""
        print(
            "class Handler(FetchHandler):\n"
            "    def handler(self, res_dict):\n"
            "        print(res_dict['loss'])\n"
            "exe.train_from_dataset(model, dataset, optimizer,\n"
            "    fetch_handler=Handler(var_dict={'loss': 'loss'}, period_secs=30))"
        )


def is_periodic(fetch_handler: Any) -> bool:
    """Whether ``fetch_handler`` is a Paddle-style handler object (rather than a
    function called after every batch)."""
    return all(hasattr(fetch_handler, a) for a in ("handler", "var_dict", "period_secs"))


class FetchMonitor:
    """The thread that calls ``fetch_handler.handler`` every ``period_secs``.

    Args:
        fetch_handler: a ``FetchHandler`` (or an object with ``var_dict``,
            ``period_secs`` and ``handler``).
        read: returns the current value of a variable name (a tensor or array),
            or None when it has none.
    """

    def __init__(self, fetch_handler: Any, read: Callable[[str], Any]) -> None:
        period = fetch_handler.period_secs
        if isinstance(period, bool) or not isinstance(period, (int, float)) or period <= 0:
            raise ValueError(f"FetchHandler.period_secs must be seconds > 0, got {period!r}")
        self._names = {key: _name(key, var) for key, var in fetch_handler.var_dict.items()}
        self._handler = fetch_handler
        self._read = read
        self._period = float(period)
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="trainer-fetch", daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self._period):
            try:
                names = self._names.items()
                self._handler.handler({key: _as_array(n, self._read(n)) for key, n in names})
            except BaseException as error:  # noqa: BLE001 - raised after the pass
                self.error = error
                return

    def __enter__(self) -> FetchMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._thread.join()

    def raise_error(self) -> None:
        """Raises what the handler (or reading its variables) raised, if anything."""
        if self.error is not None:
            raise self.error


def _name(key: str, var: Any) -> str:
    name = var if isinstance(var, str) else getattr(var, "name", None)
    if not isinstance(name, str):
        raise TypeError(
            f"FetchHandler.var_dict[{key!r}] must be an output or slot name (or have a "
            f".name), got {var!r}"
        )
    return name


def _as_array(name: str, value: Any) -> Any:
    if value is None:
        return None
    if hasattr(value, "offsets") and hasattr(value, "values"):  # a datafeed.Ragged
        raise ValueError(
            f"FetchHandler: {name!r} is a sparse slot with a value count per record; "
            "Paddle refuses such (LoD) tensors too: fetch a dense slot or a model output"
        )
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return value
