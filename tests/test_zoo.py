"""Any model a user brings is captured exactly or refused in one line (tests/zoo.py lists them).

Captured: softmax of the captured scores over the valid keys equals transformers' eager
``output_attentions`` (an independent implementation) on every valid position, the model's
final hidden states are those of eager attention, and eigen finds rows in every layer, windowed
ones included. Refused: ``load_model`` raises one line, not a traceback. docs/cli.md's model
table lists every architecture here with its outcome."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import attnlens
from zoo import CAPTURED, REFUSED, N, measure, refusal


@pytest.mark.parametrize("architecture", list(CAPTURED))
def test_captured_exactly(tmp_path, minilm_l6, kjv, architecture):
    model, measured = measure(tmp_path, minilm_l6, architecture)
    assert measured["layers"] == measured["eager_layers"] == model.num_layers
    assert measured["weights"] < 1e-6, f"softmax of the scores is {measured['weights']:.2g} from eager's weights"
    # float32 rounding apart (the same products, perhaps summed in another order), the outputs are eager's
    assert measured["outputs"] < 1e-5, f"capturing changed the model's outputs by {measured['outputs']:.2g}"
    result = attnlens.eigen(model, corpus=kjv, seq_len=N, num_seqs=8, keep=4, progress=False)
    layers = result.table.query("level == 'layer'")
    assert len(layers) == model.num_layers and (layers.rows > 0).all() and (layers.k90 > 0).all()


@pytest.mark.parametrize("architecture", list(REFUSED))
def test_refused_in_one_line(tmp_path, minilm_l6, architecture):
    message = refusal(tmp_path, minilm_l6, architecture)
    assert message is not None and "\n" not in message and str(tmp_path) in message, message


def test_docs_model_table_is_the_zoo():
    """docs/cli.md's table of architectures names every zoo entry with the outcome the tests above check."""
    text = (Path(__file__).parents[1] / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (.+?) \| (captured|refused) \|", text, flags=re.MULTILINE))
    expected = {name: "captured" for name in CAPTURED} | {name: "refused" for name in REFUSED}
    assert rows == expected
