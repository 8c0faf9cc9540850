"""Errors that say what they are: the kinds attnlens raises, and the messages of a damaged store and a missing SOURCE.

attnlens raises :class:`BadInput`, :class:`BadFile` or :class:`UnsupportedModel`, never the base
class :class:`AttnlensError` itself nor a built-in exception for something a user can cause (see
``attnlens/errors.py``). The first test reads the package's source so that a new raise of either
kind cannot slip in; the others check the errors that used to escape as the base class or as a
built-in.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import attnlens
from attnlens.errors import AttnlensError, BadFile, BadInput, UnsupportedModel
from tiny_models import assert_one_line_error, run_cli

PACKAGE = Path(attnlens.__file__).parent

# Built-in exceptions attnlens' code may raise: an assertion for a check only a bug in attnlens
# can fail (with a comment that says so), NotImplementedError as the body of an abstract method.
ALLOWED_BUILTINS = {"AssertionError", "NotImplementedError"}
BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
} - ALLOWED_BUILTINS


def _raised_name(node: ast.Raise) -> str | None:
    """The class a ``raise`` names: ``raise X(...)``, ``raise X``, ``raise module.X(...)``; None for ``raise``/``raise error``."""
    target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _is_abstract_body(function: ast.AST, node: ast.Raise) -> bool:
    """Whether ``node`` is the whole body of ``function`` (its docstring aside)."""
    if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = function.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    return body == [node]


def forbidden_raises(path: Path, root: Path = PACKAGE.parent) -> list[str]:
    """``file:line: raise ...`` (the file relative to ``root``) for every raise of the bare base class or of a
    built-in exception in one file."""
    source = path.read_text()
    tree = ast.parse(source, filename=str(path))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        name = _raised_name(node)
        if name == "NotImplementedError" and not _is_abstract_body(parents.get(node), node):
            name = "NotImplementedError outside an abstract method"
        elif name not in BUILTIN_EXCEPTIONS | {"AttnlensError"}:
            continue
        line = " ".join(ast.get_source_segment(source, node).split())
        line = line if len(line) <= 160 else line[:157] + "..."
        found.append(f"{path.relative_to(root)}:{node.lineno}: {line}")
    return found


def _parts() -> list[str]:
    """The package's subpackages and top-level modules: one test each, so a failure says where."""
    return sorted(path.name for path in PACKAGE.iterdir() if path.suffix == ".py" or (path / "__init__.py").is_file())


@pytest.mark.parametrize("part", _parts())
def test_no_raise_of_the_base_class_or_of_a_builtin(part):
    """Every ``raise`` under attnlens/ names a kind (BadInput, BadFile, UnsupportedModel), not AttnlensError
    itself, and no built-in exception but an assertion or an abstract method's NotImplementedError."""
    files = [PACKAGE / part] if part.endswith(".py") else sorted((PACKAGE / part).rglob("*.py"))
    found = [hit for path in files for hit in forbidden_raises(path)]
    assert not found, (
        "raise BadInput, BadFile or UnsupportedModel (attnlens/errors.py), not the base class or a built-in:\n" + "\n".join(found)
    )


def test_the_scan_finds_what_it_forbids(tmp_path):
    """The scan itself: it catches the base class, built-ins in every spelling, and NotImplementedError
    outside an abstract method; it leaves the kinds, re-raises and abstract methods alone."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f(x):\n"
        "    if x == 1:\n"
        "        raise AttnlensError('bare')\n"
        "    if x == 2:\n"
        "        raise errors.AttnlensError('bare, by attribute')\n"
        "    if x == 3:\n"
        "        raise ValueError('builtin')\n"
        "    if x == 4:\n"
        "        raise KeyError\n"
        "    if x == 5:\n"
        "        raise NotImplementedError\n"
        "    try:\n"
        "        raise BadInput('fine')\n"
        "    except OSError as error:\n"
        "        raise error\n"
        "    raise AssertionError('a bug')\n"
        "\n"
        "class Base:\n"
        "    def method(self):\n"
        "        '''Abstract.'''\n"
        "        raise NotImplementedError\n"
    )
    found = forbidden_raises(sample, root=tmp_path)
    assert [hit.split(":")[1] for hit in found] == ["3", "5", "7", "9", "11"], found
    assert found[0] == "sample.py:3: raise AttnlensError('bare')"


# ---------------------------------------------------------------------- a damaged store


@pytest.fixture(scope="module")
def small_store(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("errors") / "store"
    attnlens.extract("minilm-l6", out, seq_len=16, num_seqs=4, progress=False)
    return out


@pytest.fixture
def copy_of_store(small_store, tmp_path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(small_store, copy)
    assert attnlens.open_store(copy).num_seqs == 4
    return copy


def _assert_reextract_hint(error: BadFile) -> None:
    message = str(error)
    assert "is damaged" in message and "extract it again" in message and "with overwrite" in message
    assert "resume finishes only an interrupted extraction" in message  # and says why resume will not do


@pytest.mark.integration  # runs a real model by name
def test_truncated_array_is_a_bad_file_that_says_to_extract_again(copy_of_store):
    array = copy_of_store / "scores" / "L00.npy"
    with open(array, "r+b") as handle:
        handle.truncate(os.path.getsize(array) // 2)
    with pytest.raises(BadFile, match=r"damaged: scores/L00\.npy is missing or truncated") as raised:
        attnlens.open_store(copy_of_store)
    _assert_reextract_hint(raised.value)
    # ... and the hint works: overwrite replaces the damaged store.
    assert attnlens.extract("minilm-l6", copy_of_store, seq_len=16, num_seqs=4, overwrite=True, progress=False).num_seqs == 4


def test_corrupt_manifest_is_a_bad_file_that_says_to_extract_again(copy_of_store):
    (copy_of_store / "manifest.json").write_bytes(b'{"format": "attnlens-store", "n": \x00\x13garbage')
    with pytest.raises(BadFile, match="damaged") as raised:
        attnlens.open_store(copy_of_store)
    _assert_reextract_hint(raised.value)


def test_manifest_without_a_field_is_a_bad_file_not_a_key_error(copy_of_store):
    """A manifest that parses but lacks a field used to escape as a KeyError."""
    manifest = json.loads((copy_of_store / "manifest.json").read_text())
    del manifest["num_seqs"]
    (copy_of_store / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BadFile, match="damaged \\(no 'num_seqs' in its manifest") as raised:
        attnlens.open_store(copy_of_store)
    _assert_reextract_hint(raised.value)


def test_unfinished_store_says_resume_not_overwrite(copy_of_store):
    (copy_of_store / "progress.json").write_text(json.dumps({"complete": 2}))
    with pytest.raises(BadFile, match=r"unfinished \(2 of 4 sequences\)") as raised:
        attnlens.open_store(copy_of_store)
    assert "with resume" in str(raised.value) and "overwrite" not in str(raised.value)


def test_store_whose_creation_stopped_says_to_delete_it(copy_of_store):
    (copy_of_store / "manifest.json").unlink()
    with pytest.raises(BadFile, match="stopped while it created the store; delete the directory and extract again"):
        attnlens.open_store(copy_of_store)


def test_damaged_store_is_one_line_on_the_command_line(capsys, copy_of_store, tmp_path):
    array = copy_of_store / "valid" / "L03.npy"
    with open(array, "r+b") as handle:
        handle.truncate(100)
    code, _, err = run_cli(capsys, "eigen", str(copy_of_store), "--out", str(tmp_path / "e"), "--no-progress")
    assert code == 2
    assert_one_line_error(
        code,
        err,
        f"store '{copy_of_store}' is damaged: valid/L03.npy",
        "extract it again by rerunning the extract command with --overwrite",
        "--resume finishes only an interrupted extraction",
    )
    (copy_of_store / "manifest.json").write_text("{not json")
    code, _, err = run_cli(capsys, "eigen", str(copy_of_store), "--out", str(tmp_path / "e"), "--no-progress")
    assert_one_line_error(code, err, "is damaged (JSONDecodeError reading its manifest or progress)", "with --overwrite")


# ---------------------------------------------------------------------- a SOURCE that is none of the things it may be

SOURCE_KINDS = (
    "a store directory (attnlens extract)",
    "a moments directory (attnlens moments / merge)",
    "a model alias (minilm-l6, minilm-l3, gemma3-270m), local directory, GGUF file or Hub id",
)


def test_missing_eigen_source_names_store_moments_and_model(capsys, tmp_path):
    out = ["--out", str(tmp_path / "e"), "--no-progress", "--seq-len", "8", "--num-seqs", "4"]
    code, _, err = run_cli(capsys, "eigen", "./no/such/store", *out)
    assert_one_line_error(code, err, "SOURCE './no/such/store' does not exist; give", *SOURCE_KINDS)
    assert "model path" not in err
    # A bare name is taken for a Hub id; the suite runs offline, so the Hub cannot be reached.
    code, _, err = run_cli(capsys, "eigen", "no-such-source", *out)
    assert_one_line_error(code, err, "SOURCE 'no-such-source' is neither a local directory nor a model alias", *SOURCE_KINDS)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("x")
    code, _, err = run_cli(capsys, "eigen", str(tmp_path / "foreign"), *out)
    assert_one_line_error(code, err, "neither an attnlens store (no manifest.json), moments", "(no config.json)", *SOURCE_KINDS)


def test_moments_source_that_does_not_exist_names_store_and_model_only(capsys, tmp_path):
    """A moments job reads rows: its SOURCE is a store or a model, never moments."""
    code, _, err = run_cli(
        capsys, "moments", "./no/such/store", "--out", str(tmp_path / "job"), "--seq-len", "8", "--num-seqs", "4", "--no-progress"
    )
    assert_one_line_error(code, err, "SOURCE './no/such/store' does not exist", SOURCE_KINDS[0], SOURCE_KINDS[2])
    assert "moments directory" not in err


def test_load_model_of_a_missing_path_is_bad_input():
    from attnlens.models.locate import ModelNotFound

    with pytest.raises(ModelNotFound, match="model path './no/such/model' does not exist") as raised:
        attnlens.load_model("./no/such/model")
    assert isinstance(raised.value, BadInput) and raised.value.reason == "does not exist"


# ---------------------------------------------------------------------- built-ins that used to escape


def test_layer_index_of_a_module_attnlens_did_not_load_is_unsupported_model():
    """Capture of a module that no attnlens.load_model numbered used to raise a RuntimeError."""
    from attnlens.models.capture import layer_index

    with pytest.raises(UnsupportedModel, match="Linear has no layer index; load the model with attnlens.load_model"):
        layer_index(torch.nn.Linear(2, 2))


def test_store_writer_refuses_batches_out_of_order_as_bad_input(tmp_path):
    """Used to be plain ValueErrors; BadInput is still a ValueError."""
    from attnlens.io.store import StoreWriter

    manifest = {"n": 3, "num_heads": 1, "layers": [0], "dtype": "float32", "weights": False}
    with StoreWriter.create(tmp_path / "s", manifest, tokens=np.zeros((2, 3), dtype=np.int32)) as writer:
        batch = {0: (np.ones((1, 1, 3, 3), np.float32), np.ones((1, 3, 3), bool), None)}
        with pytest.raises(BadInput, match="a batch starts at sequence 1, but the next unwritten one is 0"):
            writer.write_batch(1, batch)
        with pytest.raises(ValueError, match="the store holds rows of shape"):
            writer.write_batch(0, {0: (np.ones((1, 2, 3, 3), np.float32), np.ones((1, 3, 3), bool), None)})


def test_partial_file_without_an_array_is_a_bad_file(tmp_path):
    """A partial file that lacks one of its sums used to raise a KeyError."""
    from attnlens.rows.partials import load_partial, save_partial

    path = tmp_path / "pass000-rank00000.npz"
    save_partial(
        path, {"done": 2}, {"count": np.ones((2, 1, 1)), "key_count": np.ones((2, 1, 1, 3)), "sum": np.ones((2, 1, 1, 3))}
    )
    with pytest.raises(BadFile, match=r"partial file '.*' is damaged \(it has no sum_outer array\)"):
        load_partial(path)


def test_saved_sums_of_another_shape_are_a_bad_file():
    """Sums restored from a checkpoint of another shape used to raise a ValueError; scores that do not fit, too."""
    from attnlens.rows.accumulate import UnitSums

    sums = UnitSums([(0, 0)], n=3, num_heads=1, quantity="scores", queries=None)
    wrong = {name: np.zeros(shape) for name, shape in {"count": (2, 1, 1), "key_count": (2, 1, 1, 4)}.items()}
    wrong |= {"sum": np.zeros((2, 1, 1, 3)), "sum_outer": np.zeros((2, 1, 1, 3, 3))}
    with pytest.raises(BadFile, match=r"the saved key_count has shape \(2, 1, 1, 4\)"):
        sums.load_state(wrong)
    with pytest.raises(BadInput, match="do not fit these sums' n = 3"):
        sums.add(0, torch.zeros(1, 1, 4, 4), torch.ones(1, 4, 4, dtype=torch.bool), np.zeros(1, dtype=int))


@pytest.mark.integration  # runs a real model by name
def test_resuming_a_job_with_a_damaged_job_file_is_one_line(capsys, tmp_path):
    """A job.json that is not JSON used to escape as a JSONDecodeError."""
    job = tmp_path / "job"
    (job / "partials").mkdir(parents=True)
    (job / "job.json").write_text("{truncated")
    argv = ["moments", "minilm-l6", "--out", str(job), "--seq-len", "8", "--num-seqs", "4", "--layers", "0", "--no-progress"]
    code, _, err = run_cli(capsys, *argv, "--resume")
    assert_one_line_error(code, err, f"cannot resume {job}: its job.json is damaged (JSONDecodeError)", "use --overwrite")


def test_merge_of_a_missing_partial_file_is_one_line(capsys, tmp_path):
    code, _, err = run_cli(capsys, "merge", str(tmp_path / "nowhere.npz"), "--out", str(tmp_path / "m"))
    assert_one_line_error(code, err, f"partial file {tmp_path / 'nowhere.npz'} does not exist")


def test_rank_zero_raises_the_error_of_its_kind(monkeypatch):
    """run_on_main used to turn rank 0's error into the bare base class; now rank 0 raises it as it was."""
    from attnlens.io.ranks import ReportedError, World

    monkeypatch.setattr(torch.distributed, "broadcast_object_list", lambda box, src: None)
    error = BadFile("`out` is damaged")

    def fail():
        raise error

    with pytest.raises(BadFile) as raised:
        World(rank=0, size=2, local_rank=0, local_size=2, backend="gloo").run_on_main(fail)
    assert raised.value is error

    def broadcast(box, src):  # another rank receives rank 0's message, its parameters still marked
        box[0] = "`out` is damaged"

    monkeypatch.setattr(torch.distributed, "broadcast_object_list", broadcast)
    with pytest.raises(ReportedError) as raised:
        World(rank=1, size=2, local_rank=1, local_size=2, backend="gloo").run_on_main(fail)
    assert isinstance(raised.value, AttnlensError) and raised.value.reported
    assert raised.value.cli_message() == "--out is damaged"
