"""Declares the Cython extensions; all metadata lives in pyproject.toml."""

import os

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# FLEETFEED_CYTHON_DEBUG=1 turns bounds checks and line tracing back on.
DEBUG = os.environ.get("FLEETFEED_CYTHON_DEBUG") == "1"

DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
    "linetrace": DEBUG,
}
MACROS = [("CYTHON_TRACE_NOGIL", "1")] if DEBUG else []
# No fused multiply-adds: a kernel's float arithmetic gives the bits of numpy's
# and torch's separate roundings (the tests compare them), on every CPU and -march.
COMPILE_ARGS = ["-O0", "-g"] if DEBUG else ["-O3", "-ffp-contract=off"]

EXTENSIONS = [
    Extension(
        "datafeed.parse._colbuf",
        ["datafeed/parse/_colbuf.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "datafeed.parse._parse",
        ["datafeed/parse/_parse.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "datafeed.parse.samples",
        ["datafeed/parse/samples.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "datafeed.records._shuffle",
        ["datafeed/records/_shuffle.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "trainer.ps.tables._rows",
        ["trainer/ps/tables/_rows.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "trainer.ps.tables._row_updates",
        ["trainer/ps/tables/_row_updates.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "trainer.loop._shared_counts",
        ["trainer/loop/_shared_counts.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "generators._shortest_float",
        ["generators/_shortest_float.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "generators._sample_checks",
        ["generators/_sample_checks.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
    Extension(
        "generators._format",
        ["generators/_format.pyx"],
        define_macros=MACROS,
        extra_compile_args=COMPILE_ARGS,
    ),
]

# The extensions compile one per core: a wheel build or an editable install
# spends most of its time in the C compiler (-O3 over Cython's output).
JOBS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class ParallelBuildExt(build_ext):
    """build_ext with ``--parallel`` defaulting to the usable cores."""

    def finalize_options(self):
        if self.parallel is None:
            self.parallel = JOBS
        super().finalize_options()


setup(
    ext_modules=cythonize(EXTENSIONS, compiler_directives=DIRECTIVES, nthreads=JOBS),
    cmdclass={"build_ext": ParallelBuildExt},
)
