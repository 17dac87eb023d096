"""The records in memory: column chunks, their Arrow form, the store that holds
them, and the places they are kept between passes.

In: ``RecordChunk``s from a load. Out: a ``RecordStore`` (chunks in load order,
gathered by the kernels of ``_shuffle.pyx``), Arrow record batches and IPC
(``arrow``), the parsed-data cache file (``cache``), records in shared memory for
Hogwild processes (``shared_records``), and the load's accounting (``stats``).
"""
