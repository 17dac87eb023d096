"""Where records come from: input files, the commands that read them, and the
user's generators run in worker processes.

In: a file list (local paths, ``.gz``, ``pyarrow.fs`` URIs) and a ``pipe_command``
or a ``data_generator``. Out: column chunks in file order (``readers``: each
command's output parsed by ``datafeed.parse``; ``inprocess``: generator samples
built into columns), with per-file accounting; every command's process group
ends with its load (``process``, ``process_groups``).
"""
