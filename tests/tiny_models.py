"""Tiny random models of other families, saved with the minilm tokenizer (fast shape and parity tests)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers


def save_with_minilm_tokenizer(path: Path, model: transformers.PreTrainedModel, minilm) -> Path:
    """A model directory that loads offline: the model's weights and minilm's tokenizer."""
    model.save_pretrained(path)
    minilm.tokenizer.save_pretrained(path)
    return Path(path)


def tiny_model_dir(tmp_path: Path, minilm_l6, config: transformers.PretrainedConfig) -> Path:
    """A small random causal model of another family (``config``), saved with the minilm tokenizer."""
    torch.manual_seed(0)
    return save_with_minilm_tokenizer(tmp_path, transformers.AutoModelForCausalLM.from_config(config), minilm_l6)


def save_tiny(path: Path, minilm, kind: str) -> Path:
    """A 2-layer random model directory: ``causal`` (Llama, grouped-query attention),
    ``causal-bert`` (BertLMHeadModel as a decoder: float64 all through, unlike Llama's
    float32 RMSNorm, so finite differences in float64 are exact) or ``mlm`` (BertForMaskedLM)."""
    torch.manual_seed(0)
    if kind == "causal":
        config = transformers.LlamaConfig(
            vocab_size=30522,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            bos_token_id=101,
            eos_token_id=102,
            pad_token_id=0,
        )
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        config = transformers.BertConfig(
            vocab_size=30522,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
        )
        model = (
            transformers.BertForMaskedLM(config)
            if kind == "mlm"
            else transformers.BertLMHeadModel(transformers.BertConfig(**{**config.to_dict(), "is_decoder": True}))
        )
    return save_with_minilm_tokenizer(path, model, minilm)


# The command line, run in-process (shared by the CLI tests; test files import helpers from here, never
# from each other).


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``attnlens ARGV...`` in this process: (exit status, stdout, stderr)."""
    import pytest

    from attnlens.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, *phrases: str) -> None:
    """A non-zero exit with exactly one ``attnlens: error: ...`` line on stderr (progress bars aside),
    no traceback, and every phrase in that line."""
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip() and "it/s" not in line and "seq/s" not in line]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("attnlens: error: ") and "Traceback" not in err
    for phrase in phrases:
        assert phrase in lines[0], f"{phrase!r} not in {lines[0]!r}"


def moments_of_rows(rows, quantity: str = "scores", queries: int | None = None):
    """Moments of plain rows (R, n) as one layer with one head, summed by numpy (not by attnlens's accumulator).

    With ``queries`` = Q, every row enters each of Q query units (as if each block repeated its row at every
    query position)."""
    import numpy as np

    from attnlens.rows.moments import Moments

    rows = np.asarray(rows, dtype=np.float64)
    count, n = rows.shape
    units = 1 if queries is None else queries
    tile = lambda array: np.broadcast_to(array, (1, 1, units, *array.shape)).copy()
    return Moments(
        quantity,
        n,
        (0,),
        1,
        None if queries is None else tuple(range(queries)),
        count=np.full((1, 1, units), float(count)),
        key_count=tile(np.full(n, float(count))),
        sum=tile(rows.sum(0)),
        sum_outer=tile(rows.T @ rows),
    )


def reference_moments(model, ids, layers, quantity: str = "scores", queries=None, seed: int = 0):
    """Both halves' moments of the blocks ``ids`` (seq, n), by brute force: every layer captured whole, then
    the rows that enter (full rows pooled, or the chosen query positions over their valid keys) summed by
    numpy in float64. Independent of attnlens's accumulator and of its batch loop."""
    import numpy as np

    from attnlens.models.capture import Capture
    from attnlens.rows.moments import HalfMoments, Moments, split_halves

    layers = list(layers)
    with torch.no_grad(), Capture(layers) as capture:
        model.run_attention(torch.as_tensor(np.asarray(ids)))
    half = split_halves(len(ids), seed)
    parts = []
    for which in (0, 1):
        chosen = half == which
        arrays = {name: [] for name in ("count", "key_count", "sum", "sum_outer")}
        for layer in layers:
            scores = capture.scores[layer].double().numpy()[chosen]  # (seq, head, query, key)
            valid = capture.valid[layer].numpy()[chosen]  # (seq, query, key)
            values = np.where(valid[:, None], scores, -np.inf)
            if quantity in ("weights", "log-weights"):
                values = values - values.max(-1, keepdims=True)
                values = values - np.log(np.exp(values).sum(-1, keepdims=True))
                values = np.exp(values) if quantity == "weights" else values
            values = np.where(valid[:, None], values, 0.0)
            if queries is None:
                full = valid.all(-1)  # (seq, query)
                units = [[values[:, head][full]] for head in range(values.shape[1])]  # rows (R, n) per head
                keys = [[np.full(values.shape[-1], float(full.sum()))] for _ in units]
            else:
                units = [[values[:, head, q] for q in queries] for head in range(values.shape[1])]
                keys = [[valid[:, q].sum(0).astype(float) for q in queries] for _ in units]
            arrays["count"].append([[float(len(rows)) for rows in unit] for unit in units])
            arrays["key_count"].append(keys)
            arrays["sum"].append([[rows.sum(0) for rows in unit] for unit in units])
            arrays["sum_outer"].append([[rows.T @ rows for rows in unit] for unit in units])
        parts.append(
            Moments(
                quantity,
                ids.shape[1],
                tuple(layers),
                model.num_heads,
                None if queries is None else tuple(queries),
                **{name: np.array(value, dtype=np.float64) for name, value in arrays.items()},
            )
        )
    return HalfMoments(*parts)


def save_tiny_gpt_oss(path: Path, minilm) -> Path:
    """A 2-layer random gpt-oss model directory: its attention adds a learned sink logit per
    head (``s_aux``), which attnlens refuses (2 experts, 4 query heads / 2 key heads)."""
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        sliding_window=8,
        max_position_embeddings=64,
        bos_token_id=101,
        eos_token_id=102,
        pad_token_id=0,
    )
    return save_with_minilm_tokenizer(path, transformers.AutoModelForCausalLM.from_config(config), minilm)


def skip_unless_ci(reason: str):
    """Skip a test whose optional dependency is missing; under CI (``CI`` set, as ``.ci/run`` is run),
    where every extra is installed, a missing dependency is a broken install and fails instead."""
    import os

    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI installs every extra, so this is a broken install")
    pytest.skip(reason)


def import_or_skip(module: str, reason: str):
    """``pytest.importorskip`` that fails under CI (see :func:`skip_unless_ci`)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        skip_unless_ci(reason)


def identical_columns(table) -> list[tuple[str, str]]:
    """Pairs of columns of a table that hold the same values in every row (NaN equal to NaN)."""
    import numpy as np
    import pandas as pd

    pairs = []
    names = list(table.columns)
    for index, first in enumerate(names):
        for second in names[index + 1 :]:
            a, b = table[first], table[second]
            if pd.api.types.is_bool_dtype(a) != pd.api.types.is_bool_dtype(b):
                continue  # a flag is not a copy of a count that happens to be 0 or 1 in every row
            if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
                same = np.allclose(a.to_numpy(float), b.to_numpy(float), rtol=1e-9, atol=1e-12, equal_nan=True)
            else:
                same = a.astype(str).tolist() == b.astype(str).tolist()
            if same:
                pairs.append((first, second))
    return pairs


# ---------------------------------------------------------------------- the README's own code

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_tour() -> list[list[str]]:
    """The tour's command lines (the first fenced block after ``<!-- tour -->``), each as the
    arguments after ``attnlens``, comments stripped, as a shell would split them."""
    import shlex

    text = README.read_text()
    block = text[text.index("<!-- tour -->") :].split("```")[1]
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert all(line[0] == "attnlens" for line in lines if line), "every tour line is an attnlens command"
    return [line[1:] for line in lines if line]


def fine_tuned_classifier(base: str, rows, directory: Path, *, max_length: int, lr: float = 5e-5, epochs: int = 1, seed: int = 0):
    """``base`` (a model directory) with a negative/positive classification head, fine-tuned by plain
    transformers and torch on Rotten Tomatoes ``rows`` (batches of 16 in order, ``epochs`` passes, AdamW),
    saved with its tokenizer into ``directory`` by ``save_pretrained``: a classifier as a user brings one."""
    import torch

    from attnlens.data.tasks import load_task

    torch.manual_seed(seed)
    names = {0: "negative", 1: "positive"}
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=2, id2label=names, label2id={name: index for index, name in names.items()}
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    task = load_task("rotten-tomatoes")
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for start in [*range(0, len(rows), 16)] * epochs:
        chosen = rows[start : start + 16]
        batch = tokenizer(
            [task.texts[row] for row in chosen], padding=True, truncation=True, max_length=max_length, return_tensors="pt"
        )
        loss = model(**batch, labels=torch.from_numpy(task.labels[chosen])).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def top_keys(scores, among, k: int):
    """Each row's ``k`` keys of largest score among ``among`` (bool, the shape of ``scores``), by
    ``torch.topk``: the heavy hitters written independently of attnlens's stable sort."""
    chosen = scores.masked_fill(~among, float("-inf")).topk(k, dim=-1).indices
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, chosen, True) & among
