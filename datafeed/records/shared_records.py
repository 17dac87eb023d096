"""Records in shared memory, for trainer processes that outlive a pass.

Hogwild trainer processes (trainer/loop/hogwild_workers.py) are forked once and
train pass after pass, while the dataset in the calling process is shuffled
or loaded again between passes. The records of each pass reach them through
one memory file (``memfd``): ``share_store`` copies a store's arrays into it
and returns the store rebuilt as views of it (the private arrays can then be
freed, so sharing takes no memory beyond the copy's moment), with a
``SharedRecords`` handle. A shuffle gives a store a new order of the same
chunks, so shared records stay shared across shuffles; the order (8 bytes per
record) goes to the processes with each pass in a memory file of its own
(``share_order``, ``attach_order``), which they all map. A process given the
file descriptors, layout and order rebuilds the same store with
``attach_store``, copying no record.

The records' file lives while its handle or any of its arrays does in this
process (its descriptor closes with the last) and while another process maps
it.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

from ..config.slots import SlotSchema
from .columns import RecordChunk, SlotColumn
from .store import RecordStore

__all__ = ["SharedRecords", "attach_order", "attach_store", "share_order", "share_store"]

_ALIGN = 64  # each array starts on a cache line


class SharedRecords:
    """The memory file a shared store's arrays are in: ``fd`` (open while this
    handle or any of the arrays is alive) and ``layout``, the plain
    description (JSON) from which ``attach_store`` rebuilds the store."""

    def __init__(
        self, fd: int, layout: dict[str, Any], store: RecordStore, memory: mmap.mmap
    ) -> None:
        self.fd = fd
        self.layout = layout
        self._memory = memory  # a store of no records holds no array of it
        self._chunks = [weakref.ref(chunk) for chunk in store.chunks]

    def holds(self, store: RecordStore) -> bool:
        """Whether ``store``'s chunks are the shared ones, in any order (not when
        records were loaded since: they are appended as chunks of their own)."""
        return len(store.chunks) == len(self._chunks) and all(
            ref() is c for ref, c in zip(self._chunks, store.chunks, strict=True)
        )


def share_store(store: RecordStore) -> tuple[RecordStore, SharedRecords]:
    """``store``'s records copied into a new memory file: the same records as
    views of it, and its handle.

    Raises:
        TypeError: a column whose values are not plain numbers.
    """
    arrays = [a for chunk in store.chunks for column in chunk.columns
              for a in (column.values, column.offsets) if a is not None]
    for array in arrays:
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"records with {array.dtype} values cannot be shared between processes"
            )
    file = _MemoryFile(sum(_room(a.nbytes) for a in arrays))
    try:
        chunks = []
        for chunk in store.chunks:
            columns = tuple(
                SlotColumn(
                    file.copy(column.values),
                    None if column.offsets is None else file.copy(column.offsets),
                    column.width,
                )
                for column in chunk.columns
            )
            chunks.append(RecordChunk(columns, chunk.rows))
    except BaseException:
        os.close(file.fd)
        raise
    return file.share(RecordStore(store.schema, chunks, store.order))


def _placed(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _room(nbytes: int) -> int:
    """What an array of ``nbytes`` takes of a memory file (an empty one too)."""
    return _placed(max(nbytes, 1))


class _MemoryFile:
    """A new memory file of ``size`` bytes, filled with arrays one after the
    other (``empty``, ``copy``; from several threads), each 64-byte aligned."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self.fd = os.memfd_create("fleetfeed-records", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.size)
            self._memory = mmap.mmap(self.fd, self.size)  # MAP_SHARED
        except BaseException:
            os.close(self.fd)
            raise
        self._places: list[list] = []  # [offset, dtype, count] per array
        self._used = 0
        self._lock = threading.Lock()

    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
        """A new uninitialised array here."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape))
        with self._lock:
            offset = _placed(self._used)
            if offset + count * dtype.itemsize > self.size:
                raise MemoryError(
                    f"records' memory file: {count * dtype.itemsize} bytes more do not fit "
                    f"its {self.size} (at {offset})"
                )
            # An empty array takes a byte too: ``share`` finds arrays by their place.
            self._used = offset + max(count * dtype.itemsize, 1)
            self._places.append([offset, dtype.str, count])
        return np.frombuffer(self._memory, dtype=dtype, count=count, offset=offset).reshape(shape)

    def copy(self, array: np.ndarray) -> np.ndarray:
        out = self.empty(array.shape, array.dtype)
        out[...] = array
        return out

    def share(self, store: RecordStore) -> tuple[RecordStore, SharedRecords]:
        """``store`` (its arrays all made here) and its handle; the file's
        descriptor closes with the last of them."""
        base = np.frombuffer(self._memory, dtype=np.uint8, count=1).ctypes.data
        index = {offset: i for i, (offset, _, _) in enumerate(self._places)}

        def place(array: np.ndarray | None) -> int | None:
            return None if array is None else index[array.ctypes.data - base]

        chunks = [
            {"rows": chunk.rows, "columns": [
                {"values": place(c.values), "offsets": place(c.offsets), "width": c.width}
                for c in chunk.columns
            ]}
            for chunk in store.chunks
        ]
        layout = {"size": max(self._used, 1), "arrays": self._places, "chunks": chunks}
        # The handle and every array here hold the mapping: the last one gone
        # closes the file.
        weakref.finalize(self._memory, os.close, self.fd)
        return store, SharedRecords(self.fd, layout, store, self._memory)


def share_order(order: np.ndarray) -> int:
    """A new memory file holding ``order`` (int64): its descriptor, which the
    caller closes once the processes have theirs."""
    file = _MemoryFile(order.nbytes)
    try:
        file.copy(np.ascontiguousarray(order, dtype=np.int64))
    except BaseException:
        os.close(file.fd)
        raise
    return file.fd


def attach_order(fd: int, rows: int) -> np.ndarray:
    """The order in the memory file ``fd`` (``share_order``), ``rows`` long, as
    a read-only view of it (the caller may close ``fd``)."""
    memory = mmap.mmap(fd, max(rows * 8, 1), prot=mmap.PROT_READ)  # MAP_SHARED
    return np.frombuffer(memory, dtype=np.int64, count=rows)


def attach_store(
    schema: SlotSchema, fd: int, layout: dict[str, Any], order: np.ndarray | None = None
) -> RecordStore:
    """The store that ``layout`` describes, as views of the memory file ``fd``
    (which the caller may close: the mapping stays while the store lives), in
    ``order`` (the shared store's ``order``)."""
    store = _rebuild(schema, layout, _views(fd, layout))
    return store if order is None else RecordStore(schema, store.chunks, order)


def _views(fd: int, layout: dict[str, Any]) -> list[np.ndarray]:
    memory = mmap.mmap(fd, max(layout["size"], 1))  # MAP_SHARED
    return [
        np.frombuffer(memory, dtype=np.dtype(dtype), count=count, offset=offset)
        for offset, dtype, count in layout["arrays"]
    ]


def _rebuild(schema: SlotSchema, layout: dict[str, Any], views: list[np.ndarray]) -> RecordStore:
    chunks = []
    for chunk in layout["chunks"]:
        columns = tuple(
            SlotColumn(
                views[c["values"]], None if c["offsets"] is None else views[c["offsets"]],
                c["width"],
            )
            for c in chunk["columns"]
        )
        chunks.append(RecordChunk(columns, chunk["rows"]))
    return RecordStore(schema, chunks)
