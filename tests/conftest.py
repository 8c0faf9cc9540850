"""Shared fixtures: the real offline models, loaded once per test session."""

from __future__ import annotations

import pytest
import torch

import attnlens

torch.manual_seed(0)


@pytest.fixture(scope="session")
def minilm_l6() -> attnlens.LoadedModel:
    return attnlens.load_model("minilm-l6")


@pytest.fixture(scope="session")
def minilm_l3() -> attnlens.LoadedModel:
    return attnlens.load_model("minilm-l3")


@pytest.fixture(scope="session")
def gemma3() -> attnlens.LoadedModel:
    return attnlens.load_model("gemma3-270m")


@pytest.fixture(scope="session")
def kjv() -> attnlens.Corpus:
    return attnlens.load_corpus("kjv")


@pytest.fixture(scope="session")
def kjv_blocks(minilm_l6, kjv):
    """Eight real 32-token blocks of the King James Bible for the minilm tokenizer."""
    return kjv.blocks(minilm_l6, n=32, num_blocks=8, seed=0)
