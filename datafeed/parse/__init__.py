"""MultiSlot text, or a generator's samples, into column chunks.

In: bytes of a reader's output (``parsing.ChunkParser``, over the Cython state
machine in ``_parse.pyx``, GIL released) or Python samples (``samples.pyx``).
Out: ``RecordChunk``s of per-slot value and offset arrays
(``datafeed.records.columns``); a bad line is a ``ParseError`` naming file, line,
slot and token. ``_colbuf`` and ``_kinds`` are the C buffers and value kinds
both kernels share.
"""
