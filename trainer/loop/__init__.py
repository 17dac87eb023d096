"""The training loop behind ``Executor.train_from_dataset``.

In: a model, an optimizer and a dataset's batches. Out: trained parameters and a
``RunSummary`` (``run_summary``). One pass runs on one thread or several
(``train_loop``); ``thread=N, hogwild=True`` runs N trainers that update the
shared model without a lock, as threads (``hogwild``) or as forked processes
(``hogwild_processes``, ``hogwild_workers``), each applying the optimizer's rule
itself (``dense_update``) and timing its steps (``step_clock``); the step counts
and batch numbers they share go up by atomic adds (``_shared_counts``).
"""
