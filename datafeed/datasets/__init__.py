"""The user-facing datasets, with Paddle's names: ``InMemoryDataset``,
``QueueDataset``, ``DatasetFactory`` and Paddle's older setters.

In: settings, a file list, and calls in Paddle's order (``load_into_memory``,
``local_shuffle``, ``global_shuffle``, iteration). Out: batches, ``stats()``,
``state_dict()``. Each dataset drives the stages below it (source, parse,
records, reorder, iterate) and shows progress on long work (``progress``).
"""
