"""What a ``SparseEmbedding`` module needs beside its forward (``trainer.nn``).

In: the modules a script builds and the ids of each forward. Out: the tables a
model owns (``tables``: the registry of live modules and their configs), the rows
a forward pulls (``stores``: in-process tables or a parameter-server worker's
store), the pulls waiting for their push (``pending``, per thread) and the
pulls a PS worker sends for the batches to come (``ahead``).
"""
