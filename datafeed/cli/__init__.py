"""The ``datafeed`` command: ``preview``, ``check``, ``stats`` and ``convert`` a
reader's output before a long job (``commands``; ``python -m datafeed.cli``).

In: files, ``--pipe`` and ``--slots``. Out: text on stdout, an exit status, or
a Parquet or cache file.
"""
