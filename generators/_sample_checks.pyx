"""The checks of generator samples, and the ``SampleError`` they raise.

A sample is a list or tuple (or a zip) of ``(name, [values])`` pairs; the
formatter (_format.pyx) writes it and calls in here, through
_sample_checks.pxd, to classify a value it has no fast path for and to raise
every ``SampleError``: all message text lives here, so that the formatter's
loop is only the writing. The messages name the slot, the sample (1-based, as
the generator numbers its output lines) and the bad value.
"""

from cpython.number cimport PyIndex_Check

import sys


class SampleError(ValueError):
    """A sample that cannot be written as MultiSlot text.

    Raised while a generator formats its output, with a message that names
    the slot, the sample and the bad value.

    Attributes:
        slot: The name of the slot at fault, or None when the fault is in the
            sample as a whole (not a list, no slots, a different slot count).
        sample: The 1-based number of the sample in this generator's output.
        value: The offending object (a value, a list of values, a slot name
            or the whole sample).
    """

    def __init__(self, message, slot=None, sample=None, value=None):
        super().__init__(message)
        self.slot = slot
        self.sample = sample
        self.value = value

    def __reduce__(self):
        # Keeps slot/sample/value (and any notes) across pickling, which the
        # default reduce of an exception with extra arguments loses.
        return (type(self), (self.args[0], self.slot, self.sample, self.value),
                self.__dict__)


# Public under its package name, which is also where pickle looks it up.
SampleError.__module__ = "generators"


# Reprs in messages are cut to this many characters (twice that in notes).
cdef Py_ssize_t REPR_LIMIT = 80

# type -> ValueKind for every value type other than exact int and float.
cdef dict _value_kinds = {}


cdef int _classify(object value) except -1:
    if isinstance(value, int):
        return INTEGER  # bool included: Paddle accepts it and writes 'True'
    if isinstance(value, float):
        return FLOATING  # numpy.float64 is a float subclass
    if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
        # Not a number, whatever numpy's version: before numpy 2.3 its bool has a
        # (deprecated) __index__ and would pass the check below.
        return NOT_A_NUMBER
    if PyIndex_Check(value):
        return INTEGER  # numpy.integer and any other type with __index__
    # numpy.float32/float16/longdouble, recognised without importing numpy
    # (a generator process must start fast).
    for base in type(value).__mro__:
        if base.__name__ == "floating" and base.__module__ == "numpy":
            return FLOATING
    return NOT_A_NUMBER


cdef int value_kind(object value) except -1:
    """The ValueKind of a value that is not an exact int or float."""
    cdef object kind = _value_kinds.get(type(value))
    if kind is None:
        kind = _classify(value)
        _value_kinds[type(value)] = kind
    return kind


cdef str _describe(object value):
    """``repr(value)`` (shortened) and the type name, for messages."""
    cdef str text = repr(value)
    if len(text) > REPR_LIMIT:
        text = text[:REPR_LIMIT - 3] + "..."
    return f"{text} ({type(value).__name__})"


cdef object slots_of(object sample, long long number):
    """The sample's (name, values) items as a list or tuple."""
    if type(sample) is list or type(sample) is tuple:
        return sample
    if type(sample) is zip:
        return list(sample)
    if isinstance(sample, (list, tuple)):
        return sample
    raise SampleError(
        f"sample {number} must be a list or tuple of (name, [values]) pairs, "
        f"found {_describe(sample)}",
        None, number, sample,
    )


cdef tuple unpack_pair(object item, Py_ssize_t index, long long number):
    """The (name, values) of an item that is not an exact 2-tuple."""
    if isinstance(item, (list, tuple)) and len(item) == 2:
        return (item[0], item[1])
    raise SampleError(
        f"item {index + 1} of sample {number} must be a (name, [values]) pair, "
        f"found {_describe(item)}",
        None, number, item,
    )


cdef list _names_in(object slots):
    """The slot names of a sample, with '?' for items that are not pairs."""
    return [
        item[0] if isinstance(item, (list, tuple)) and len(item) == 2 else "?"
        for item in slots
    ]


cdef int fail_no_slots(object sample, long long number) except -1:
    raise SampleError(
        f"sample {number} has no slots: expected a list of (name, [values]) pairs",
        None, number, sample,
    )


cdef int fail_resized(long long number) except -1:
    # Only a __str__ with side effects on the sample can get here.
    raise RuntimeError(f"sample {number} changed size while it was being formatted")


cdef int fail_values_type(object name, object values, long long number,
                          bint strings) except -1:
    cdef str expected = "a list or tuple of str" if strings else "a list"
    cdef str message = (
        f"slot {name!r} of sample {number}: values must be {expected}, "
        f"found {_describe(values)}"
    )
    if isinstance(values, tuple):
        message += (
            "; MultiSlotDataGenerator takes only lists, as Paddle's does: "
            "convert it with list(...)"
        )
    elif hasattr(values, "tolist"):
        message += "; convert it with .tolist()"
    elif isinstance(values, (int, float, str, bytes)):
        message += f"; wrap a single value in a list: [{values!r}]"
    raise SampleError(message, name, number, values)


cdef int fail_slot_names(object slots, list expected, long long number) except -1:
    """Raises for a sample whose slot names differ from the first sample's."""
    cdef list found = _names_in(slots)
    cdef object culprit = None
    cdef Py_ssize_t index
    for index in range(min(len(found), len(expected))):
        if found[index] != expected[index]:
            if isinstance(found[index], str):
                culprit = found[index]
            break
    raise SampleError(
        f"sample {number} has slots {found!r} "
        f"but the first sample had {expected!r}",
        culprit, number, slots,
    )


cdef int fail_slot_name_type(object name, long long number) except -1:
    raise SampleError(
        f"slot name {_describe(name)} of sample {number} must be a str",
        name, number, name,
    )


cdef int fail_empty_slot(object name, object values, long long number) except -1:
    raise SampleError(
        f"slot {name!r} of sample {number} is empty: "
        "pad it in generate_sample",
        name, number, values,
    )


cdef int fail_not_a_number(object name, object value, long long number) except -1:
    raise SampleError(
        f"slot {name!r} of sample {number}: expected an int or "
        f"float, found {_describe(value)}",
        name, number, value,
    )


cdef int fail_not_a_str(object name, object value, long long number) except -1:
    raise SampleError(
        f"slot {name!r} of sample {number}: expected a str, "
        f"found {_describe(value)}",
        name, number, value,
    )


cdef void note_input_line(object error, Py_ssize_t line_number, object line,
                          bint batching):
    """Notes on ``error`` the input line whose samples it came from."""
    if line is None:
        _add_note(error, "in the samples of generate_sample(None)")
        return
    cdef str text = repr(line)
    if len(text) > 2 * REPR_LIMIT:
        text = text[:2 * REPR_LIMIT - 3] + "..."
    where = "in the batch that ends with" if batching else "in the samples of"
    _add_note(error, f"{where} input line {line_number}: {text}")


cdef void _add_note(object error, str note):
    # BaseException.add_note is 3.11+; on 3.10 keep the note where 3.11 does.
    # (datafeed.config.errors.add_note does the same; a generator process must not
    # import datafeed.)
    if sys.version_info >= (3, 11):
        error.add_note(note)
    elif isinstance(getattr(error, "__notes__", None), list):
        error.__notes__.append(note)
    else:
        error.__notes__ = [note]
