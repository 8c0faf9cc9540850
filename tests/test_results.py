"""The results registry: one entry per kind, each naming the class that writes that kind."""

from __future__ import annotations

import importlib
import pkgutil

import attnlens
from attnlens.io.results import REGISTRY, Result, result_class


def _all_subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    return found | {grand for sub in found for grand in _all_subclasses(sub)}


def test_every_result_class_is_registered_under_its_kind():
    for module in pkgutil.walk_packages(attnlens.__path__, "attnlens."):
        if not module.name.startswith(("attnlens.cli", "attnlens.__main__")):
            importlib.import_module(module.name)
    classes = {cls for cls in _all_subclasses(Result) if cls.__module__.startswith("attnlens.")}
    assert {cls.kind for cls in classes} == set(REGISTRY), "a kind without a class, or a class without an entry"
    for cls in classes:
        assert result_class(cls.kind) is cls
        figures = REGISTRY[cls.kind].figures
        if figures is not None:
            assert callable(importlib.import_module(figures).draw), f"{figures} has no draw(result)"
