"""Corpus reading and packing into blocks."""

from __future__ import annotations

import json

import numpy as np
import pytest

import attnlens
from attnlens.data.corpus import read_wordnet


def test_txt_lines_paragraphs_jsonl_and_folders(tmp_path):
    (tmp_path / "lines.txt").write_text("first line\nsecond  line\n\n")
    (tmp_path / "paragraphs.txt").write_text("one\nparagraph here\n\n\nanother\n")
    (tmp_path / "docs.jsonl").write_text(
        json.dumps({"text": "from json"}) + "\n" + json.dumps({"body": "x", "text": "  "}) + "\n"
    )
    assert attnlens.load_corpus(tmp_path / "lines.txt").documents == ("first line", "second line")
    assert attnlens.load_corpus(tmp_path / "paragraphs.txt").documents == ("one paragraph here", "another")
    assert attnlens.load_corpus(tmp_path / "docs.jsonl").documents == ("from json",)
    folder = attnlens.load_corpus(tmp_path)
    assert folder.documents == ("from json", "first line", "second line", "one paragraph here", "another")
    assert folder.sha256 != attnlens.load_corpus(tmp_path / "lines.txt").sha256


def test_jsonl_with_another_text_field(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"body": "hello"}) + "\n")
    assert attnlens.load_corpus(tmp_path / "d.jsonl", text_field="body").documents == ("hello",)
    with pytest.raises(attnlens.AttnlensError, match="no 'text' field"):
        attnlens.load_corpus(tmp_path / "d.jsonl")


def test_kjv_is_read_without_importing_the_bible_package(kjv):
    import sys

    assert len(kjv.documents) == 31103
    assert kjv.documents[-1].endswith("Amen.")
    assert "bible" not in sys.modules


def test_blocks_have_the_special_token_layout_and_follow_the_text(minilm_l6, kjv):
    blocks = kjv.blocks(minilm_l6, n=12, num_blocks=None)
    assert blocks.ids.shape == (blocks.available, 12)
    assert (blocks.ids[:, 0] == 101).all() and (blocks.ids[:, -1] == 102).all()
    inner = blocks.ids[:, 1:-1]
    assert not np.isin(inner, list(minilm_l6.special.all_special)).any()
    # Consecutive blocks continue the token stream of the text where the last one stopped.
    stream = minilm_l6.tokenizer(" ".join(kjv.documents[:3]), add_special_tokens=False)["input_ids"]
    assert inner[:2].ravel().tolist() == stream[:20]


def test_decoder_blocks_start_with_bos(tmp_path, minilm_l6):
    from types import SimpleNamespace

    from attnlens.models.loading import SpecialTokens

    decoder_like = SimpleNamespace(
        tokenizer=minilm_l6.tokenizer, special=SpecialTokens(prefix=(2,), suffix=(), pad=0, mask=None, all_special=frozenset({2}))
    )
    (tmp_path / "t.txt").write_text("word " * 50)
    blocks = attnlens.load_corpus(tmp_path / "t.txt").blocks(decoder_like, n=8)
    assert (blocks.ids[:, 0] == 2).all() and (blocks.ids[:, 1:] != 2).all() and blocks.ids.shape[1] == 8


def test_seeded_subset_is_reproducible_sorted_and_distinct(minilm_l6, kjv):
    a = kjv.blocks(minilm_l6, n=64, num_blocks=20, seed=7)
    b = kjv.blocks(minilm_l6, n=64, num_blocks=20, seed=7)
    c = kjv.blocks(minilm_l6, n=64, num_blocks=20, seed=8)
    everything = kjv.blocks(minilm_l6, n=64)
    assert np.array_equal(a.ids, b.ids) and not np.array_equal(a.index, c.index)
    assert (np.diff(a.index) > 0).all()
    assert np.array_equal(a.ids, everything.ids[a.index])


def test_bad_corpora_say_what_is_wrong(tmp_path, minilm_l6):
    with pytest.raises(attnlens.AttnlensError, match="neither a built-in"):
        attnlens.load_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(attnlens.AttnlensError, match="holds no text"):
        attnlens.load_corpus(tmp_path / "empty.txt")
    (tmp_path / "short.txt").write_text("too short")
    with pytest.raises(attnlens.AttnlensError, match="fewer than one block"):
        attnlens.load_corpus(tmp_path / "short.txt").blocks(minilm_l6, n=64)
    (tmp_path / "some.txt").write_text("word " * 100)
    with pytest.raises(attnlens.AttnlensError, match="gives 3 blocks of 32 tokens"):
        attnlens.load_corpus(tmp_path / "some.txt").blocks(minilm_l6, n=32, num_blocks=10)


WORDNET_SAMPLE = """\
  1 This software and database is being provided to you, the LICENSEE, by  
  2 Princeton University under the following license. | not a gloss
00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived or known or inferred to have its own distinct existence  
00001930 03 n 01 physical_entity 0 007 @ 00001740 n 0000 | an entity that has physical existence; "a physical thing"  
"""


def test_wordnet_glosses(tmp_path):
    for part in ("noun", "verb", "adj", "adv"):
        (tmp_path / f"data.{part}").write_text(WORDNET_SAMPLE if part == "noun" else "")
    assert read_wordnet(tmp_path) == [
        "that which is perceived or known or inferred to have its own distinct existence",
        'an entity that has physical existence; "a physical thing"',
    ]
    assert attnlens.load_corpus(f"wordnet:{tmp_path}").documents[0].startswith("that which")
    with pytest.raises(attnlens.AttnlensError, match="apt-get install wordnet-base"):
        read_wordnet(tmp_path / "nowhere")


def test_a_tokenizers_fingerprint_is_kept_and_made_again_when_a_token_is_added(minilm_l6):
    """Read once per tokenizer (a large vocabulary takes half a second to describe), and again once a token added
    changes how text splits; two copies of one tokenizer agree, a copy with the token added does not."""
    import copy

    from attnlens.data.corpus import tokenizer_fingerprint

    tokenizer = copy.deepcopy(minilm_l6.tokenizer)
    before = tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(copy.deepcopy(minilm_l6.tokenizer)) == before
    tokenizer.add_tokens(["attnlensword"])
    after = tokenizer_fingerprint(tokenizer)
    assert after != before and tokenizer_fingerprint(tokenizer) == after
    assert tokenizer("an attnlensword")["input_ids"] != minilm_l6.tokenizer("an attnlensword")["input_ids"]
