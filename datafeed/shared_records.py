"""Records in shared memory, for trainer processes that outlive a pass.

Hogwild trainer processes (trainer/hogwild_workers.py) are forked once and
train pass after pass, while the dataset in the calling process is shuffled
or loaded again between passes. The records of each pass reach them through
one memory file (``memfd``): ``share_store`` copies a store's arrays into it
and returns the store rebuilt as views of it (the private arrays can then be
freed, so sharing takes no memory beyond the copy's moment), with a
``SharedRecords`` handle; a process given its file descriptor and layout
rebuilds the same store with ``attach_store``, copying nothing.

The file lives while the shared store does in this process (its descriptor
closes with the store) and while another process maps it.
"""

from __future__ import annotations

import mmap
import os
import weakref
from typing import Any

import numpy as np

from .columns import RecordChunk, SlotColumn
from .slots import SlotSchema
from .store import RecordStore

__all__ = ["SharedRecords", "attach_store", "share_store"]

_ALIGN = 64  # each array starts on a cache line


class SharedRecords:
    """The memory file a shared store's arrays are in: ``fd`` (open while the
    store is alive) and ``layout``, the plain description (JSON) from which
    ``attach_store`` rebuilds the store."""

    def __init__(self, fd: int, layout: dict[str, Any], store: RecordStore) -> None:
        self.fd = fd
        self.layout = layout
        self._store = weakref.ref(store)
        self._chunks = [weakref.ref(chunk) for chunk in store.chunks]

    def holds(self, store: RecordStore) -> bool:
        """Whether ``store`` is the shared store, its chunks unchanged (records
        loaded since are appended to it)."""
        return (
            self._store() is store and len(store.chunks) == len(self._chunks)
            and all(ref() is c for ref, c in zip(self._chunks, store.chunks, strict=True))
        )

    @property
    def chunks(self) -> list[RecordChunk]:
        """The shared store's chunks, in the layout's order."""
        store = self._store()
        if store is None:
            raise RuntimeError("the shared records were dropped (a shuffle or load since)")
        return store.chunks


def share_store(store: RecordStore) -> tuple[RecordStore, SharedRecords]:
    """``store``'s records copied into a new memory file: the same records as
    views of it, and its handle.

    Raises:
        TypeError: a column whose values are not plain numbers.
    """
    arrays: list[np.ndarray] = []
    chunks = []
    for chunk in store.chunks:
        columns = []
        for column in chunk.columns:
            described = []
            for array in (column.values, column.offsets):
                if array is None:
                    described.append(None)
                    continue
                if array.dtype.kind not in "biuf":
                    raise TypeError(
                        f"records with {array.dtype} values cannot be shared between processes"
                    )
                described.append(len(arrays))
                arrays.append(array)
            columns.append({"values": described[0], "offsets": described[1],
                            "width": column.width})
        chunks.append({"rows": chunk.rows, "columns": columns})
    places, size = [], 0
    for array in arrays:
        places.append([size, array.dtype.str, int(array.shape[0])])
        size += -(-array.nbytes // _ALIGN) * _ALIGN
    layout = {"size": size, "arrays": places, "chunks": chunks}
    fd = os.memfd_create("fleetfeed-records", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, max(size, 1))
        views = _views(fd, layout)
        for view, array in zip(views, arrays, strict=True):
            view[...] = array
    except BaseException:
        os.close(fd)
        raise
    shared = _rebuild(store.schema, layout, views)
    weakref.finalize(shared, os.close, fd)
    return shared, SharedRecords(fd, layout, shared)


def attach_store(schema: SlotSchema, fd: int, layout: dict[str, Any]) -> RecordStore:
    """The store that ``layout`` describes, as views of the memory file ``fd``
    (which the caller may close: the mapping stays while the store lives)."""
    return _rebuild(schema, layout, _views(fd, layout))


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
