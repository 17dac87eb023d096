"""Every public name of the three packages has a docstring: the classes and
functions of ``__all__`` (and ``trainer.fleet``'s, ``trainer.nn``'s), and the
public methods and properties those classes define."""

from __future__ import annotations

import inspect

import datafeed
import generators
import trainer
import trainer.fleet
import trainer.nn


def public_objects() -> dict[str, object]:
    found: dict[str, object] = {}
    for module in (datafeed, generators, trainer, trainer.fleet, trainer.nn):
        for name in module.__all__:
            found[f"{module.__name__}.{name}"] = getattr(module, name)
    found["trainer.fleet.util"] = type(trainer.fleet.util)
    return found


def missing_docstrings() -> list[str]:
    missing = []
    for qualname, obj in public_objects().items():
        if inspect.ismodule(obj):
            if not inspect.getdoc(obj):
                missing.append(qualname)
            continue
        if not (inspect.isclass(obj) or callable(obj)):
            continue  # constants
        if not (obj.__doc__ or "").strip():
            missing.append(qualname)
        if not inspect.isclass(obj):
            continue
        for cls in obj.__mro__:
            if cls.__module__.split(".")[0] not in ("datafeed", "generators", "trainer"):
                continue  # object, Exception, dict, ...: not ours to document
            for name, member in vars(cls).items():
                if name.startswith("_"):
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if not (inspect.isfunction(member) or isinstance(member, property)):
                    continue
                doc = member.__doc__
                if not (doc or "").strip():
                    missing.append(f"{qualname}.{name} (defined in {cls.__qualname__})")
    return sorted(set(missing))


def test_every_public_name_has_a_docstring():
    missing = missing_docstrings()
    assert not missing, "no docstring:\n" + "\n".join(missing)


def test_the_walk_sees_the_api():
    objects = public_objects()
    for name in ("datafeed.InMemoryDataset", "datafeed.Slot", "trainer.Executor",
                 "trainer.fleet.init", "generators.MultiSlotDataGenerator",
                 "trainer.nn.SparseEmbedding"):
        assert name in objects
