"""Sparse tables: rows keyed by arbitrary 64-bit ids, with optimizer state and a
lifecycle, in a server's shard or in the process (local mode).

In: ids to pull, gradients to push, pass numbers and shrink rules. Out: rows.
``table`` (``SparseTable``) over the C kernels of ``_rows.pyx`` (the id index,
pulls) and ``_row_updates.pyx`` (optimizer steps, pooling); ``ids``, ``optim``,
``entries`` (admission and eviction), ``rowstats``, ``pooling``, ``step_rows``
(a step's pull and push by row number), ``shared_rows`` (tables shared with
Hogwild processes), ``saved_rows`` and ``describe`` (checks of rows from files).
Imports nothing of the runtime above it.
"""
