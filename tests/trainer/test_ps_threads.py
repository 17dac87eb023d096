"""A parameter-server process runs torch with one intra-op thread unless the
user chose a count: the default pool (a thread per core) spins between the
small calls of a step and, with the job's other processes on the same cores,
cost 20x the CPU per batch (issue 14)."""

from __future__ import annotations

import pytest
import torch

from trainer.job.launch import one_thread_unless_chosen
from trainer.ps.runtime import one_intra_op_thread


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_one_thread_when_omp_num_threads_is_unset_or_empty(monkeypatch, restore_threads, value):
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    torch.set_num_threads(2)
    one_intra_op_thread("worker 0")
    assert torch.get_num_threads() == 1


def test_a_chosen_thread_count_is_kept(monkeypatch, restore_threads):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    one_intra_op_thread("worker 0")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("given", "expected"), [(None, "1"), ("", "1"), (" ", "1"), ("3", "3")])
def test_fleetrun_gives_one_thread_unless_chosen(given, expected):
    env = {} if given is None else {"OMP_NUM_THREADS": given}
    one_thread_unless_chosen(env)
    assert env["OMP_NUM_THREADS"] == expected
