"""Which server holds what: sparse rows by a hash of their id, dense parameters
by size.

Every process computes the same placement from what it already knows (the id;
the shapes of the optimizer's parameters, in order), so nothing about placement
is sent or agreed on at run time, and a checkpoint needs none of it: its files
list the ids and parameter indices they hold, and a job of any server count
re-shards them on load.

* Rows: ``table.shard_of`` (splitmix64 of the id, mod server_num), an even
  spread for any id distribution, whatever the table.
* Dense parameters: ``dense_owners``, the largest parameter first, each onto the
  server holding the fewest elements so far (greedy longest-processing-time;
  ties go to the lower index). By index (``i % server_num``) a model of Linear
  layers, whose parameters alternate weight, bias, put every weight matrix on
  the even servers: the wide&deep example's MLP (221-64-32-1, 16,321 floats)
  had 16,224 floats on server 0 and 97 on server 1 of two; by size it is
  14,144 and 2,177 (the first weight matrix alone is 14,144: a parameter is
  never split over servers). Each step every worker sends each server the
  gradients of the parameters it holds and receives their values, so the
  busiest server's share is what bounds a step's dense traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["dense_owners"]


def dense_owners(shapes: Sequence[Sequence[int]], server_num: int) -> tuple[int, ...]:
    """The server of each dense parameter (by index), spreading elements evenly.

    Args:
        shapes: every dense parameter's shape, in the optimizer's order.
        server_num: the job's server count (>= 1).

    Raises:
        ValueError: ``server_num`` below 1.
    """
    if server_num < 1:
        raise ValueError(f"expected a server count >= 1, found {server_num}")
    return _owners(tuple(tuple(int(n) for n in shape) for shape in shapes), server_num)


@lru_cache(maxsize=64)
def _owners(shapes: tuple[tuple[int, ...], ...], server_num: int) -> tuple[int, ...]:
    sizes = [math.prod(shape) for shape in shapes]
    load = [0] * server_num
    owners = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        server = min(range(server_num), key=lambda s: (load[s], s))
        owners[index] = server
        # A parameter of 0 elements still costs a message entry: count it as 1.
        load[server] += max(1, sizes[index])
    return tuple(owners)
