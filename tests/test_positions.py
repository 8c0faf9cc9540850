"""Position classes against masks written out by hand, on hand-made token sequences."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import attnlens
from attnlens.data.positions import DEFAULT_CLASSES, class_masks, exclusive_index, is_punctuation, parse_classes, token_roles


def hand_masks(tokens: list[str], cls_positions: set[int], sep_positions: set[int], punct: set[str], width: int) -> dict:
    """Every class by explicit loops over (i, j), independent of the library's predicates."""
    n = len(tokens)
    masks = {name: np.zeros((n, n), bool) for name in ("self", "prev", "next", f"band({width})", "cls", "sep", "punct")}
    for i in range(n):
        for j in range(n):
            masks["self"][i, j] = i == j
            masks["prev"][i, j] = j == i - 1
            masks["next"][i, j] = j == i + 1
            masks[f"band({width})"][i, j] = 0 < abs(i - j) <= width
            masks["cls"][i, j] = j in cls_positions
            masks["sep"][i, j] = j in sep_positions
            masks["punct"][i, j] = tokens[j] in punct
    masks["other"] = ~np.any(list(masks.values()), axis=0)
    return masks


def test_encoder_classes_on_a_hand_made_sequence(minilm_l6):
    tokens = ["[CLS]", "in", "the", "beginning", ",", "god", "created", ";", "the", "earth", ".", "[SEP]"]
    ids = torch.tensor([minilm_l6.tokenizer.convert_tokens_to_ids(tokens)])
    names = ("self", "prev", "next", "band(2)", "cls", "sep", "punct", "other")
    masks = class_masks(ids, minilm_l6, names)
    expected = hand_masks(tokens, {0}, {11}, {",", ";", "."}, 2)
    assert list(masks) == list(names)
    for name in names:
        assert masks[name].shape == (1, 12, 12)
        np.testing.assert_array_equal(masks[name][0].numpy(), expected[name], err_msg=name)


def test_other_is_what_the_listed_classes_leave(minilm_l6):
    ids = torch.tensor([minilm_l6.tokenizer.convert_tokens_to_ids(["[CLS]", "a", ",", "b", "[SEP]"])])
    only_self = class_masks(ids, minilm_l6, ("self", "other"))
    assert torch.equal(only_self["other"][0], ~torch.eye(5, dtype=torch.bool))
    valid = torch.ones(1, 5, 5, dtype=torch.bool).tril()
    restricted = class_masks(ids, minilm_l6, ("next", "other"), valid=valid)
    assert not restricted["next"].any(), "next is never valid under a causal mask"
    assert torch.equal(restricted["other"], valid)


def test_decoder_roles_fall_back_to_first_and_last_positions(minilm_l6):
    """A tokenizer that adds nothing around a text: cls is position 0, sep the last position."""
    bare = dataclasses.replace(minilm_l6, special=dataclasses.replace(minilm_l6.special, prefix=(), suffix=()))
    ids = torch.tensor([minilm_l6.tokenizer.convert_tokens_to_ids(["and", "god", "said", ",", "let"])] * 2)
    roles = token_roles(ids, bare)
    assert roles.cls.tolist() == [[True, False, False, False, False]] * 2
    assert roles.sep.tolist() == [[False, False, False, False, True]] * 2
    assert "first position" in roles.description["cls"] and "last position" in roles.description["sep"]
    assert token_roles(ids, minilm_l6).description["cls"] == "[CLS] (id 101)"


@pytest.mark.slow
def test_gemma_roles_are_bos_and_last_position(gemma3, kjv):
    blocks = kjv.blocks(gemma3, n=24, num_blocks=2, seed=0)
    roles = token_roles(torch.from_numpy(blocks.ids), gemma3)
    assert roles.cls[:, 0].all() and roles.cls.sum() == 2, "<bos> opens every block"
    assert roles.sep[:, -1].all() and roles.sep.sum() == 2
    assert roles.description["cls"] == "<bos> (id 2)" and "last position" in roles.description["sep"]
    texts = gemma3.tokenizer.convert_ids_to_tokens(blocks.ids[0].tolist())
    assert roles.punct[0].tolist() == [
        all(not c.isalnum() for c in t.replace("\u2581", "")) and bool(t.replace("\u2581", "").strip()) and t != "<bos>"
        for t in texts
    ]


def test_punctuation_tokens():
    assert [is_punctuation(t) for t in (".", ",", "##.", "\u2581\u00bb", '!"', "--", "'")] == [True] * 7
    assert [is_punctuation(t) for t in ("a", "##s", "3", "\u2581", "", "[CLS]", "$", "+")] == [False] * 8


def test_parse_classes_accepts_and_normalises():
    assert parse_classes(None) == DEFAULT_CLASSES
    assert parse_classes("self, band( 3 ),other") == ("self", "band(3)", "other")
    assert parse_classes(["cls", "sep"]) == ("cls", "sep")
    assert parse_classes("sink, heavy ( 4 ), other") == ("sink", "heavy(4)", "other")


@pytest.mark.parametrize(
    "text, phrase",
    [
        ("self,diagonal", "unknown position class 'diagonal'"),
        ("band(0)", "band(0): the width w of band(w) must be at least 1"),
        ("band(-2)", "band(-2): the width w"),
        ("band(x)", "unknown position class 'band(x)'"),
        ("self,self", "names 'self' more than once"),
        ("heavy(0)", "heavy(0): the number k of heavy(k) must be at least 1"),
        ("heavy,heavy(4)", "names heavy(k) more than once"),
        (" , ", "classes is empty"),
    ],
)
def test_parse_classes_rejects(text, phrase):
    with pytest.raises(attnlens.AttnlensError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        parse_classes(text)


def test_exclusive_index_takes_the_first_class_that_contains_a_position(minilm_l6):
    ids = torch.tensor([minilm_l6.tokenizer.convert_tokens_to_ids(["[CLS]", "a", ",", "b", "[SEP]"])])
    masks = class_masks(ids, minilm_l6, ("cls", "self", "punct"))
    index = exclusive_index(masks)[0]
    for i in range(5):
        for j in range(5):
            expected = 0 if j == 0 else 1 if i == j else 2 if j == 2 else 3
            assert index[i, j] == expected, (i, j)
