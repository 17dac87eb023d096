# cython: language_level=3
"""Counts that Hogwild trainers share, added to atomically.

Hogwild trainers (threads, or forked processes sharing memory) bump the same
counters at once: the optimizer's step counts, which Adam's bias correction
and Adagrad's learning-rate decay read, and the pass's next batch number. A
plain ``+= 1`` (load, add, store) loses a count whenever two trainers meet on
it (tests/trainer/test_hogwild_counters.py). An atomic add is exact, waits for
no lock (so none is left taken by a trainer killed mid-step), and returns the
count its own add made: the step number that trainer's update then uses, as
one trainer's would. Per-trainer counts summed after the pass would be exact
only after it: meanwhile each trainer's bias correction would read its own
count, not the age of the moments all of them update.
"""

from libc.stdint cimport int64_t

import torch

cdef extern from *:
    """
    #define FF_DEFINE_ATOMIC_ADD(name, type)                                         \\
        static inline type name(type* address, type amount) {                       \\
            type seen, sum;                                                         \\
            __atomic_load(address, &seen, __ATOMIC_RELAXED);                        \\
            do {                                                                    \\
                sum = seen + amount;                                                \\
            } while (!__atomic_compare_exchange(address, &seen, &sum, 1,            \\
                                                __ATOMIC_RELAXED, __ATOMIC_RELAXED)); \\
            return sum;                                                             \\
        }
    FF_DEFINE_ATOMIC_ADD(ff_atomic_add_float, float)
    FF_DEFINE_ATOMIC_ADD(ff_atomic_add_double, double)
    #define FF_FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)
    """
    float ff_atomic_add_float(float* address, float amount) noexcept nogil
    double ff_atomic_add_double(double* address, double amount) noexcept nogil
    int64_t FF_FETCH_ADD(int64_t* address, int64_t amount) noexcept nogil


def count_steps(steps):
    """Adds 1 to each step counter of ``steps`` (0-d float32 or float64
    tensors, torch's layout of an optimizer's "step"), atomically; returns
    the value each add made, as ``step.item()`` after ``step += 1`` would be
    for one trainer alone. A counter on a device is added to by a torch op:
    a device runs the ops of one stream one after another.

    Raises:
        TypeError: a counter on the CPU that is not a float32 or float64 scalar.
    """
    counts = []
    cdef Py_ssize_t address
    for step in steps:
        if not step.is_cpu:
            step.add_(1)
            counts.append(step.item())
            continue
        dtype = step.dtype
        if step.dim() != 0 or dtype not in (torch.float32, torch.float64):
            raise TypeError(
                f"expected a step counter as torch's optimizers keep it (a 0-d float32 "
                f"or float64 tensor), got a {dtype} tensor of shape {tuple(step.shape)}"
            )
        address = step.data_ptr()
        if dtype == torch.float32:
            counts.append(ff_atomic_add_float(<float*>address, 1.0))
        else:
            counts.append(ff_atomic_add_double(<double*>address, 1.0))
    return counts


def take_number(int64_t[::1] counter):
    """The number in ``counter[0]`` (an int64 array, in shared memory for
    processes), which goes up by one: each caller gets a number of its own."""
    if counter.shape[0] < 1:
        raise ValueError("expected a counter of at least one int64, got an empty array")
    return FF_FETCH_ADD(&counter[0], 1)
