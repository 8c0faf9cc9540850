"""Contracts over every kind of result: each registers itself, names a figures module that draws,
shows columns its tables have, reads back as it was written, and prints as text."""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pandas as pd
import pytest

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
        if cls.figures_module is not None:
            assert callable(importlib.import_module(cls.figures_module).draw), f"{cls.figures_module} has no draw(result)"


def test_the_registry_is_filled_by_the_classes_not_the_storage_layer():
    source = importlib.util.find_spec("attnlens.io.results").origin
    text = open(source).read()
    for kind in REGISTRY:
        assert f"attnlens.analysis.{kind}" not in text, "the storage layer names no analysis"


@pytest.fixture(scope="module")
def every_kind(quick_report, tmp_path_factory) -> dict[str, Result]:
    """One saved result of every kind: the quick report's, a small moments job, and a decoder's sinks (the quick
    report's model is an encoder)."""
    report = attnlens.load_result(quick_report)
    results = {"report": report}
    for key in report.meta["results"]:
        result = report.result(key)
        results.setdefault(result.kind, result)
    work = tmp_path_factory.mktemp("moments") / "job"
    results["moments"] = attnlens.run_moments("minilm-l6", work, seq_len=16, num_seqs=4, batch_size=2, progress=False)
    sinks = attnlens.sinks("minilm-l6", num_seqs=4, seq_len=32, min_keys=8, progress=False)
    sinks.save(tmp_path_factory.mktemp("sinks") / "sinks")
    results["sinks"] = sinks
    return results


@pytest.mark.slow
def test_every_kind_shows_columns_it_has_reloads_and_prints(every_kind, tmp_path):
    assert set(every_kind) == set(REGISTRY), "every kind is covered"
    for kind, result in every_kind.items():
        for name, columns in type(result).shown.items():
            frame = result.compared() if name == "compared" else result.tables[name]
            missing = [column for column in columns if column not in frame]
            # optional columns (a task, an absolute loss, a warm start) may be absent; most must be there
            assert len(missing) < len(columns) / 2, f"{kind}.{name} shows columns it does not have: {missing}"
            assert list(result.view(name, frame).columns) == [c for c in columns if c in frame]
        optional = {"delta", "seconds_ratio"}  # a comparison's difference; a plan made in seconds
        assert set(type(result).column_notes) <= {c for table in result.tables.values() for c in table} | optional, kind
        text = result.text()
        assert text.strip() and "Traceback" not in text, kind
        if kind != "report":
            loaded = attnlens.load_result(result.path)
            assert type(loaded) is type(result)
            for name, table in result.tables.items():
                pd.testing.assert_frame_equal(loaded.tables[name], table, check_dtype=False)
            for name, array in result.arrays.items():
                np.testing.assert_array_equal(loaded.arrays[name], array)
            assert loaded.text() == text, f"{kind}: the same text from disk"


def test_a_table_with_no_rows_and_no_columns_reads_back_empty(tmp_path):
    """A table that matched nothing (a DAM mask no adapted pattern comes within reach of) is written as an
    empty file; the result reloads with it empty, not as a damaged result."""
    from attnlens.io.result_files import read_result_dir, write_result

    out = write_result(tmp_path / "r", "dam", {"note": "x"}, tables={"kept": pd.DataFrame({"a": [1]}), "none": pd.DataFrame()})
    assert (out / "none.csv").read_text().strip() == ""
    meta, tables, arrays = read_result_dir(out)
    assert tables["none"].empty and tables["kept"]["a"].tolist() == [1]
