"""Per-instance dumps, as Paddle's ``dump_fields`` and ``dump_param``.

``DistributedStrategy.trainer_desc_configs`` names a folder
(``dump_fields_path``, on any ``pyarrow.fs`` filesystem), the model outputs to
dump per instance (``dump_fields``) and the parameters to dump per batch
(``dump_param``). Each ``train_from_dataset`` / ``infer_from_dataset`` call
writes one text file per worker, ``<dump_fields_path>/part-<worker:03d>-00000``
(Paddle's ``part-<rank>-<thread>``), replacing the previous call's, as Paddle
does. Unlike Paddle's, a file appears whole or not at all: it is written under
a hidden name and renamed when the call has ended well, so a call that fails,
or a process killed in the middle, leaves no partial dump behind. Its lines
are those of Paddle 2.x and 3.x (``device_worker.cc``):

- per instance: with instance ids (``parse_ins_id``), the id, a tab and the
  content (empty unless ``parse_content``); then for each field a tab and
  ``name:count:v1:...:vN``, the instance's row of that output (``[batch, k]``
  or ``[batch]``); floats as ``%.9g``, int64 as unsigned 64-bit, int32 and
  int16 as signed;
- per batch and dumped parameter: ``(batch number,name):v1:...:vN``.

Formatting text costs about as much CPU as a small model's step, so the
training process does not do it: the training threads hand each batch's
values, as raw bytes, to a writer thread, which pipes them to a child process
(this file, loaded by path: it imports numpy, not torch or the trainer
package) that formats and writes the file on another core. A batch waits only
when ``MAX_QUEUED_BYTES`` are in flight. A child that fails fails the call
with its error.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

__all__ = ["MAX_QUEUED_BYTES", "FieldDumper", "format_lines"]

# Bytes of batches waiting for the child before a training thread waits for it.
MAX_QUEUED_BYTES = 64 << 20
_STOP = None
_LENGTH = struct.Struct("<I")  # each message: its header's length, header, raw arrays
_END = _LENGTH.pack(0)  # a header of length 0: the dump is complete
_KEEP_STDERR = 8192  # the end of a failed child's stderr, for the error
# The child: this file loaded by path (not ``-m``: that would import the trainer
# package and torch), with the checkout appended to sys.path for its file writes
# (datafeed.source.fs); -I keeps the user's folders off sys.path.
_CHILD = (
    "import importlib.util, sys\n"
    "sys.path.append(sys.argv[2])\n"
    "spec = importlib.util.spec_from_file_location('fleetfeed_dump_writer', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module.serve(sys.argv[3])\n"
)


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
        self.path = _join(folder, f"part-{worker:03d}-00000")
        self.fields = list(fields)
        self.params = list(params)
        self._queue: queue.Queue = queue.Queue()
        self._room = threading.Condition()
        self._queued_bytes = 0
        self._error: BaseException | None = None
        self._batches = 0
        # A file, as a pipe nobody reads would block a child that logs much; closed by close().
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self._child = subprocess.Popen(
            [sys.executable, "-I", "-c", _CHILD, os.path.abspath(__file__), root, self.path],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._stderr,
        )
        self._writer = threading.Thread(target=self._write, name="fleetfeed-dump", daemon=True)
        self._writer.start()

    def add(self, batch: Any, outputs: Mapping[str, Any], size: int) -> None:
        """Queues one batch of ``size`` records (called by the training threads)."""
        self._raise_if_failed()
        columns = []
        for name in self.fields:
            if name not in outputs:
                raise KeyError(
                    f"dump_fields names {name!r}, which the model's outputs lack (they are "
                    f"{sorted(outputs)})"
                )
            value = outputs[name]
            shape = tuple(value.shape)
            if not (len(shape) in (1, 2) and shape[0] == size):
                raise ValueError(
                    f"dump_fields: output {name!r} has shape {list(shape)}; a dumped field "
                    f"is [batch, k] or [batch] (this batch holds {size} records)"
                )
            columns.append((name, _plain(value.reshape(size, -1))))
        params = [(name, _plain(p.reshape(1, -1))) for name, p in self.params]
        with self._room:
            number = self._batches
            self._batches += 1
        ids, contents = getattr(batch, "ins_ids", None), getattr(batch, "contents", None)
        message = _message(number, size, ids, contents, columns, params)  # copies the values
        with self._room:
            while self._queued_bytes > MAX_QUEUED_BYTES and self._error is None:
                self._room.wait(1.0)
            self._queued_bytes += len(message)
        self._raise_if_failed()
        self._queue.put(message)

    def close(self, complete: bool = True) -> None:
        """Waits until every line is written and the child has ended; raises
        its error, or the pipe's.

        Args:
            complete: False when the call failed: the child then removes what
                it wrote rather than putting a partial dump in place.
        """
        if complete:
            with self._room:
                self._queued_bytes += len(_END)
            self._queue.put(_END)
        self._queue.put(_STOP)
        self._writer.join()  # the pipe is closed: the child writes its last lines and ends
        self._child.wait()
        failure = self._failure()
        self._stderr.close()
        if failure is not None:
            raise failure

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            self._child.wait()  # it ended (the pipe broke): its own error says why
            raise self._failure() or RuntimeError(self.path)

    def _failure(self) -> RuntimeError | None:
        if self._child.returncode == 0 and self._error is None:
            return None
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - _KEEP_STDERR))
        tail = self._stderr.read().decode(errors="replace").strip()
        return RuntimeError(
            f"writing the dump {self.path} failed: its writer process exited "
            f"{self._child.returncode}: {tail or self._error}"
        )

    def _write(self) -> None:
        pipe = self._child.stdin
        try:
            while True:
                message = self._queue.get()
                if message is _STOP:
                    break
                if self._error is None:
                    try:
                        pipe.write(message)  # the GIL is released while the pipe takes it
                    except BaseException as error:  # noqa: BLE001 - add() and close() raise it
                        self._error = error
                        with contextlib.suppress(OSError):
                            pipe.close()  # the child sees the end and exits
                with self._room:
                    self._queued_bytes -= len(message)
                    self._room.notify_all()
        finally:
            try:
                pipe.close()
            except OSError as error:
                self._error = self._error or error


def _join(folder: str, name: str) -> str:
    """``folder/name``, for a local folder or a URI (whose query stays last)."""
    if "://" not in folder:
        return os.path.join(folder, name)
    parts = urlsplit(folder)
    return urlunsplit(parts._replace(path=posixpath.join(parts.path or "/", name)))


def _plain(tensor: Any) -> np.ndarray:
    """A tensor's values as a C-contiguous 2-D numpy array (a view where it can)."""
    tensor = tensor.detach().to("cpu")
    if tensor.dtype.is_complex:
        raise TypeError(f"dump_fields cannot print {tensor.dtype} values")
    if tensor.dtype.is_floating_point and tensor.element_size() < 4:  # bfloat16, float16
        tensor = tensor.float()
    values = np.ascontiguousarray(tensor.numpy())
    return values.astype(np.int64) if values.dtype == bool else values


def _message(
    number: int, size: int, ids: Sequence[str] | None, contents: Sequence[str] | None,
    columns: Sequence[tuple[str, np.ndarray]], params: Sequence[tuple[str, np.ndarray]],
) -> bytes:
    arrays = [*columns, *params]
    header = json.dumps({
        "number": number, "size": size,
        "ids": None if ids is None else list(ids),
        "contents": None if contents is None else list(contents),
        "arrays": [[name, values.dtype.str, list(values.shape)] for name, values in arrays],
        "columns": len(columns),
    }).encode("utf-8", "surrogateescape")  # ids that were not UTF-8 stay as they were
    return b"".join([_LENGTH.pack(len(header)), header, *(v.tobytes() for _, v in arrays)])


def format_lines(
    number: int, size: int, ids: Sequence[str] | None, contents: Sequence[str] | None,
    columns: Sequence[tuple[str, np.ndarray]], params: Sequence[tuple[str, np.ndarray]],
) -> str:
    """One batch's dump lines (Paddle's format, see the module docstring)."""
    if ids is not None:
        parts = [[f"{ids[i]}\t{contents[i] if contents is not None else ''}"
                  for i in range(size)]]
    else:  # Paddle's line then starts with the first field's tab
        parts = [[""] * size]
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
    """The values as Paddle prints them: floats ``%.9g``, int64 as unsigned
    64-bit, smaller integers signed."""
    flat = values.reshape(-1)
    if np.issubdtype(flat.dtype, np.floating):
        return [_float_text(v) for v in flat.astype(np.float64).tolist()]
    if flat.dtype == np.int64 or flat.dtype == np.uint64:
        return [str(v) for v in flat.astype(np.int64).view(np.uint64).tolist()]
    return [str(v) for v in flat.tolist()]


def _float_text(value: float) -> str:
    if math.isnan(value):  # glibc's printf keeps the sign of a NaN
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return f"{value:.9g}"


def _read(stream: Any, count: int, at_boundary: bool = False) -> bytes | None:
    data = stream.read(count) if count else b""
    if at_boundary and not data:
        return None
    if len(data) != count:
        raise EOFError(f"the dump's pipe ended inside a message ({len(data)} of {count} bytes)")
    return data


def serve(path: str) -> None:
    """The child: formats what the training process pipes in into a hidden
    file beside ``path``, renamed to ``path`` when the end marker arrives. A
    pipe that ends without it (the call failed, or its process died) removes
    that file and fails: a dump that exists is whole."""
    from datafeed.source import fs  # the checkout is on sys.path (_CHILD)

    fs.write_stream_atomically(path, _write_lines)


def _write_lines(out: Any) -> None:
    """Formats the piped batches into the stream ``out`` until the end marker.

    Raises:
        EOFError: the pipe ended before the end marker.
    """
    stdin = sys.stdin.buffer
    while True:
        head = _read(stdin, _LENGTH.size, at_boundary=True)
        if head is None:
            raise EOFError("the training process ended the dump without its end marker")
        length = _LENGTH.unpack(head)[0]
        if length == 0:
            return  # the end marker: every batch is in
        raw = _read(stdin, length)
        header = json.loads(raw.decode("utf-8", "surrogateescape"))
        arrays = []
        for name, dtype, shape in header["arrays"]:
            dtype = np.dtype(dtype)
            data = _read(stdin, int(np.prod(shape)) * dtype.itemsize)
            arrays.append((name, np.frombuffer(data, dtype).reshape(shape)))
        split = header["columns"]
        text = format_lines(
            header["number"], header["size"], header["ids"], header["contents"],
            arrays[:split], arrays[split:],
        )
        out.write(text.encode("utf-8", "surrogateescape"))
