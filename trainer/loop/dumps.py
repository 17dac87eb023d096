"""Per-instance dumps, as Paddle's ``dump_fields`` and ``dump_param``.

``DistributedStrategy.trainer_desc_configs`` names a folder
(``dump_fields_path``, on any ``pyarrow.fs`` filesystem), the model outputs to
dump per instance (``dump_fields``) and the parameters to dump per batch
(``dump_param``). Each ``train_from_dataset`` / ``infer_from_dataset`` call
writes one text file per worker, ``<dump_fields_path>/part-<worker:03d>-00000``
(Paddle's ``part-<rank>-<thread>``), replacing the previous call's, as Paddle
does. Its lines are Paddle's:

- per instance: the instance id, a tab, its content (empty unless
  ``parse_content``), then for each field a tab and ``name:count:v1:...:vN``
  (the instance's row of that output; floats as C++ prints them, 6
  significant digits; integers as unsigned 64-bit, as Paddle prints int64);
- per batch and dumped parameter: ``(batch number,name):v1:...:vN``.

Formatting text costs about as much CPU as a small model's step, so it does
not happen in the training process: the training threads hand each batch's
values, as raw bytes, to a writer thread, which pipes them to a child
process (this file run as a script, started per call: it imports numpy, not
torch) that formats and writes the file on another core. A batch waits only
when ``MAX_QUEUED`` batches are in flight (bounded memory). A child that fails
fails the call, with its error.
"""

from __future__ import annotations

import json
import os
import posixpath
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["MAX_QUEUED", "FieldDumper", "format_lines"]

# Batches waiting for the writer before a training thread waits for it.
MAX_QUEUED = 64
_STOP = object()
_LENGTH = struct.Struct("<I")  # each message: its header's length, header, raw arrays
_KEEP_STDERR = 8192  # the end of a failed child's stderr, for the error


class FieldDumper:
    """Writes the dumps of one call of one worker (see the module docstring).

    Args:
        folder: ``dump_fields_path``, local or a URI (``hdfs://``, ``s3://``, ...).
        fields: model outputs dumped per instance, in this order.
        params: ``(name, parameter)`` pairs dumped per batch.
        worker: this worker's index (the file's name).

    Raises:
        OSError: the folder cannot be made.
    """

    def __init__(
        self, folder: str, fields: Sequence[str], params: Sequence[tuple[str, Any]], worker: int,
    ) -> None:
        from datafeed.source import fs  # pyarrow: not at import trainer

        filesystem, base = fs.resolve(folder)
        filesystem.create_dir(base, recursive=True)  # a bad folder fails the call now
        self.path = posixpath.join(folder, f"part-{worker:03d}-00000")
        self.fields = list(fields)
        self.params = list(params)
        self._queue: queue.Queue = queue.Queue(MAX_QUEUED)
        self._error: BaseException | None = None
        self._batches = 0
        self._lock = threading.Lock()  # the batch numbers of concurrent trainers
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        # This file as a script: the child imports numpy (and pyarrow for a URI),
        # not the trainer package, so it is up before the first batch is.
        self._child = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
        )
        self._writer = threading.Thread(target=self._write, name="fleetfeed-dump", daemon=True)
        self._writer.start()

    def add(self, batch: Any, outputs: Mapping[str, Any]) -> None:
        """Queues one batch's values (called by the training threads)."""
        if self._error is not None:
            raise RuntimeError(f"writing the dump {self.path} failed: {self._error}")
        size = int(getattr(batch, "size", 0) or _rows_of(outputs, self.fields))
        columns = []
        for name in self.fields:
            if name not in outputs:
                raise KeyError(
                    f"dump_fields names {name!r}, which the model's outputs lack (they are "
                    f"{sorted(outputs)})"
                )
            columns.append((name, _plain(outputs[name].detach().to("cpu").reshape(size, -1))))
        with self._lock:
            number = self._batches
            self._batches += 1
        params = [(name, _plain(p.detach().to("cpu").reshape(1, -1))) for name, p in self.params]
        self._queue.put(_message(
            number, size, getattr(batch, "ins_ids", None), getattr(batch, "contents", None),
            columns, params,
        ))

    def close(self) -> None:
        """Waits until every line is written and the child has ended; raises
        its error, or the pipe's."""
        self._queue.put(_STOP)
        self._writer.join()  # the pipe is closed: the child writes its last lines and ends
        stderr = self._child.stderr.read()  # until the child exits (it writes little there)
        self._child.stderr.close()
        self._child.wait()
        if self._child.returncode != 0:
            tail = stderr[-_KEEP_STDERR:].decode(errors="replace").strip()
            raise RuntimeError(
                f"writing the dump {self.path} failed: its writer process exited "
                f"{self._child.returncode}: {tail or self._error}"
            )
        if self._error is not None:
            raise RuntimeError(f"writing the dump {self.path} failed: {self._error}")

    def _write(self) -> None:
        pipe = self._child.stdin
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    break
                if self._error is None:
                    try:
                        pipe.write(item)  # the GIL is released while the pipe takes it
                    except OSError as error:  # the child died: close() says why
                        self._error = error
        finally:
            try:
                pipe.close()
            except OSError as error:
                self._error = self._error or error


def _plain(tensor: Any) -> np.ndarray:
    """A tensor's values as a C-contiguous 2-D numpy array (a copy)."""
    values = np.ascontiguousarray(tensor.numpy())
    return values.astype(np.int64) if values.dtype == bool else values.copy()


def _rows_of(outputs: Mapping[str, Any], fields: Sequence[str]) -> int:
    for name in fields:
        if name in outputs:
            return int(outputs[name].shape[0]) if outputs[name].dim() else 1
    return 0


def _message(
    number: int, size: int, ids: Sequence[str] | None, contents: Sequence[str] | None,
    columns: Sequence[tuple[str, np.ndarray]], params: Sequence[tuple[str, np.ndarray]],
) -> bytes:
    arrays = [*columns, *params]
    header = json.dumps({
        "number": number, "size": size, "ids": list(ids) if ids else None,
        "contents": list(contents) if contents else None,
        "arrays": [[name, values.dtype.str, list(values.shape)] for name, values in arrays],
        "columns": len(columns),
    }).encode()
    return b"".join([_LENGTH.pack(len(header)), header, *(v.tobytes() for _, v in arrays)])


def format_lines(
    number: int, size: int, ids: Sequence[str] | None, contents: Sequence[str] | None,
    columns: Sequence[tuple[str, np.ndarray]], params: Sequence[tuple[str, np.ndarray]],
) -> str:
    """One batch's dump lines (Paddle's format, see the module docstring)."""
    parts = [[
        f"{ids[i] if ids else ''}\t{contents[i] if contents else ''}" for i in range(size)
    ]]
    for name, values in columns:
        texts = _texts(values)
        width = values.shape[1]
        if width == 1:
            parts.append([f"{name}:1:{text}" for text in texts])
        else:
            parts.append([
                f"{name}:{width}:" + ":".join(texts[i * width : (i + 1) * width])
                for i in range(size)
            ])
    lines = ["\t".join(row) for row in zip(*parts, strict=True)]
    for name, values in params:
        lines.append(f"({number},{name}):" + ":".join(_texts(values)))
    return "\n".join(lines) + "\n" if lines else ""


def _texts(values: np.ndarray) -> list[str]:
    """The values as Paddle prints them: floats with C++'s default 6 significant
    digits (``%g``), integers as unsigned 64-bit."""
    flat = values.reshape(-1)
    if np.issubdtype(flat.dtype, np.floating):
        return [f"{v:g}" for v in flat.astype(np.float64).tolist()]
    return [str(v) for v in flat.astype(np.int64).view(np.uint64).tolist()]


def _read_exactly(stream: Any, count: int) -> bytes | None:
    data = stream.read(count)
    if not data:
        return None
    if len(data) != count:
        raise EOFError(f"the dump's pipe ended inside a message ({len(data)} of {count} bytes)")
    return data


def _serve(path: str) -> None:
    """The child: formats what the training process pipes in, into ``path``."""
    if "://" in path:
        from datafeed.source import fs

        filesystem, target = fs.resolve(path)
        output = filesystem.open_output_stream(target, compression=None)
    else:
        output = open(path, "wb")  # noqa: SIM115 - closed by the with below
    stdin = sys.stdin.buffer
    with output as out:
        while True:
            head = _read_exactly(stdin, _LENGTH.size)
            if head is None:
                return
            header = json.loads(_read_exactly(stdin, _LENGTH.unpack(head)[0]) or b"{}")
            arrays = []
            for name, dtype, shape in header["arrays"]:
                dtype = np.dtype(dtype)
                count = int(np.prod(shape)) * dtype.itemsize
                raw = _read_exactly(stdin, count) if count else b""
                arrays.append((name, np.frombuffer(raw or b"", dtype).reshape(shape)))
            split = header["columns"]
            out.write(format_lines(
                header["number"], header["size"], header["ids"], header["contents"],
                arrays[:split], arrays[split:],
            ).encode())


if __name__ == "__main__":
    _serve(sys.argv[1])
