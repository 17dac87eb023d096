"""What a fleet job is, shared by every part of ``trainer``.

In: the environment a launcher set (Paddle's variables, torchrun's, fleetrun's)
and the job key. Out: this process's ``ClusterRole`` (``role_maker``, ``role``),
the ``DistributedStrategy``, the exceptions ``trainer`` raises (``errors``), the
key and what is derived from it (``keys``), the host's addresses (``hosts``),
rendezvous stores bound to the job's own address (``bind``), restarts
(``restart``) and the ``fleetrun`` launcher (``launch``). The leaf package below
the fleet API and both backends; ``import trainer`` imports nothing here that
needs torch.
"""
