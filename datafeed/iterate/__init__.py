"""Handing records out as batches, and remembering where iteration stands.

In: a store or a stream of chunks, ``batch_size`` and ``drop_last``. Out:
``Batch`` mappings of torch tensors and ``Ragged`` (``batch``, ``batcher``), and
the position and resumable state behind ``state_dict()`` (``position``,
``state``), so a restarted job sees every record exactly once per epoch.
"""
