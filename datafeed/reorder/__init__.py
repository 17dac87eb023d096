"""Changing which records a worker holds and in what order.

In: a ``RecordStore``. Out: the store shuffled with a seed (``shuffle``),
redistributed across workers over ``torch.distributed`` and validated on receipt
(``global_shuffle``, over ``collectives``; merge-by-line-id destinations from
``hashing``), or with the records of one instance id merged (``merge``).
"""
