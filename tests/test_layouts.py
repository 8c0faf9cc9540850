"""Contracts over every mask layout and every fixed pattern: a layout is one class that registers
itself, and a change removes the same positions of the same ids on corpus blocks and on task batches."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import attnlens
from attnlens import Capture
from attnlens.analysis.changes import Batch, MaskChange, PatternChange
from attnlens.analysis.dam import LAYOUTS
from attnlens.analysis.dam.judging import MaskSplit
from attnlens.analysis.dam.layouts import MaskLayout, hard_sparsity, take
from attnlens.analysis.evaluation import valid_masks
from attnlens.analysis.experiment import Split
from attnlens.analysis.patterns import PATTERNS
from attnlens.analysis.task import TaskBatch, TaskJudge, TaskSettings, batches
from tiny_models import run_cli

N = 32


@pytest.fixture(scope="module")
def blocks(minilm_l6, kjv):
    return kjv.blocks(minilm_l6, n=N, num_blocks=3, seed=0)


def removed_positions(model, ids: torch.Tensor, change, *, task: bool, index: int) -> list[torch.Tensor]:
    """Per layer, the (batch, head, n, n) positions whose weight the change sets to zero, applied the
    way corpus blocks are judged (a capture on the blocks' view) or the way task batches are (the
    task judge's own capture, on a batch of examples with its attention mask)."""
    if task:  # as the task judge reads a batch of examples: its own view, and the model given the attention mask
        batch = TaskBatch(ids, torch.ones_like(ids), torch.zeros(len(ids), dtype=torch.long), index)
        view, mask = batch.view(model), batch.attention_mask
    else:  # as a corpus split reads a batch of blocks
        view, mask = Batch(ids, model, index), None
    with torch.no_grad(), Capture(intervene=change.intervention(view), weights=True) as recorded:
        model.forward(ids, attention_mask=mask)
    return [recorded.weights[layer] == 0 for layer in range(model.num_layers)]


def contract_changes(model, blocks) -> list:
    """A learned-looking mask in every layout, and every fixed pattern at two of its values."""
    valid = valid_masks(model, blocks.ids)
    classes = ("self", "prev", "cls", "sep", "punct", "other")
    changes = []
    for name, layout_class in LAYOUTS.items():
        layout = layout_class(model.num_layers, model.num_heads, N, valid, classes)
        logits = torch.randn(layout.shape, generator=torch.Generator().manual_seed(len(changes)))
        changes.append(MaskChange(layout, logits, f"mask/{name}"))
    for pattern in PATTERNS.values():
        changes += [PatternChange(pattern.name, value, N, seed=3) for value in pattern.values(N)[:2]]
    return changes


def test_every_change_removes_the_same_positions_on_task_batches_as_on_corpus_blocks(minilm_l6, blocks):
    ids = torch.from_numpy(blocks.ids)
    for change in contract_changes(minilm_l6, blocks):
        on_blocks = removed_positions(minilm_l6, ids, change, task=False, index=7)
        on_task = removed_positions(minilm_l6, ids, change, task=True, index=7)
        assert any(bool(layer.any()) for layer in on_blocks), f"{change.key} removes something"
        for layer, (a, b) in enumerate(zip(on_blocks, on_task)):
            assert torch.equal(a, b), f"{change.key}, layer {layer}: task batches and corpus blocks differ"


@pytest.mark.slow
def test_every_change_judged_on_length_bucketed_batches_equals_it_padded_to_n(minilm_l6, blocks):
    """Masks and patterns decide positions by their place, so a batch narrower than n takes their
    corner: features and the share removed equal those of the same examples padded to n (BigBird's
    random keys are each example's own, drawn at n)."""
    settings = TaskSettings(name="rotten-tomatoes", task_train=32, task_eval=40, probe_c=1.0)
    padded = TaskJudge(minilm_l6, settings, seq_len=N, batch_size=16, pad_to=N)
    bucketed = TaskJudge(minilm_l6, settings, seq_len=N, batch_size=16)
    widths = [batch.ids.shape[1] for batch in batches(bucketed.held_out, 16, minilm_l6.device)]
    assert min(widths) < N and padded.held_out.ids.shape[1] == N
    for change in contract_changes(minilm_l6, blocks):
        expected = padded.features(padded.held_out, change)
        np.testing.assert_allclose(bucketed.features(bucketed.held_out, change), expected, atol=1e-5, err_msg=change.key)
        assert bucketed.removal_share(change) == pytest.approx(padded.removal_share(change), rel=1e-12), change.key


def test_on_padded_task_batches_counts_and_sparsity_are_those_of_the_examples_own_positions(minilm_l6, blocks):
    """Training on a task's padded, length-bucketed examples weighs each logit by the positions it
    decides among the examples' own tokens: counted here by expanding each logit's number and
    counting it over those positions; and the hard mask's sparsity there is the share of zero
    weights among them in a forward with the mask."""
    settings = TaskSettings(name="rotten-tomatoes", task_train=32, task_eval=40, probe_c=1.0)
    split = Split.of_examples(TaskJudge(minilm_l6, settings, seq_len=N, batch_size=16).held_out, minilm_l6, 16)
    for change in [change for change in contract_changes(minilm_l6, blocks) if isinstance(change, MaskChange)]:
        layout = change.layout
        data = MaskSplit.of(split, layout, ("self",))
        assert any(valid is not None for valid in data.valids), "some batches are padded or narrower than n"
        zeros = total = 0.0
        for batch, context, counts in zip(split.inputs, data.contexts, data.counts):
            own, width = batch.attention_mask.bool(), batch.ids.shape[1]
            numbers = torch.arange(counts.numel(), dtype=torch.float64).reshape(layout.shape)
            expected = torch.zeros(counts.numel(), dtype=torch.float64)
            with torch.no_grad(), Capture(intervene=change.intervention(batch.view(minilm_l6)), weights=True) as seen:
                minilm_l6.forward(batch.ids, attention_mask=batch.attention_mask)
            for layer in range(layout.num_layers):
                here = (own[:, :, None] & own[:, None, :] & layout.valid[layer, :width, :width])[:, None]
                here = here.expand(-1, layout.num_heads, -1, -1)
                decided_by = layout.expand(numbers, layer, context)[..., :width, :width].expand_as(here)
                expected += torch.bincount(decided_by[here].long(), minlength=counts.numel()).double()
                zeros += float((seen.weights[layer] == 0)[here].sum())
                total += float(here.sum())
            assert torch.equal(counts.flatten().double(), expected), layout.name
        assert hard_sparsity(layout, change.logits, data.contexts, data.valids) == pytest.approx(zeros / total), layout.name


def test_structured_global_uses_its_global_logits_on_task_batches(minilm_l6, blocks):
    """The global [CLS]/[SEP] logits decide their rows and columns on task batches too: a mask that
    keeps only the [CLS] column keeps it (a task judged with offsets alone would drop it)."""
    ids = torch.from_numpy(blocks.ids)
    layout = LAYOUTS["structured+global"](6, 12, N, valid_masks(minilm_l6, blocks.ids), ("other",))
    logits = torch.full(layout.shape, -5.0)
    logits[:, N + 1] = 5.0  # the cls column of every head
    removed = removed_positions(minilm_l6, ids, MaskChange(layout, logits, "cls column"), task=True, index=0)
    assert not removed[0][:, :, :, 0].any(), "the [CLS] column is kept"
    assert removed[0][:, :, 1:, 1:].all(), "everything else goes"


def test_layouts_sum_their_gradients_in_the_same_order_every_time():
    """A batch-dependent index (the class and global logits) gives each logit thousands of gradient
    terms; their sum is the same in every run (the plain index's backward is a parallel scatter-add
    whose order, and so whose last digits, vary from run to run), and it is that sum."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(12, 7, generator=generator, requires_grad=True)
    index = torch.randint(0, 7, (8, 32, 32), generator=generator)
    weights = torch.randn(12, 8, 32, 32, generator=generator)
    gradients = []
    for _ in range(5):
        (take(values, index) * weights).sum().backward()
        gradients.append(values.grad.clone())
        values.grad = None
    assert all(torch.equal(gradients[0], gradient) for gradient in gradients[1:])
    by_hand = torch.zeros(12, 7, dtype=torch.float64)
    by_hand.index_add_(1, index.flatten(), weights.double().reshape(12, -1))
    torch.testing.assert_close(gradients[0].double(), by_hand, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------- a layout added by a user


class HeadDiagonal(MaskLayout):
    """Per head, one logit for the diagonal and one for the rest, shared by all layers."""

    name = "test-head-diagonal"
    summary = "per head, a logit for the diagonal and one for the rest (a test's own layout)"
    shared_by_layers = True
    expresses = {"no-diagonal": None}

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.num_heads, 2)

    def expand(self, values, layer, context):
        index = torch.arange(self.n, device=values.device)
        return values[:, (index[:, None] != index[None, :]).long()][None]  # (1, head, n, n)

    def counts(self, context, valid=None):
        weight = self.summed(context, valid).sum(0)  # (w, w): layers and sequences each position is valid in
        diagonal = weight.diagonal().sum()
        return torch.stack([diagonal, weight.sum() - diagonal]).expand(self.shape)


LAYOUTS.pop(HeadDiagonal.name)  # the class registered itself when defined: only the tests that ask for it see it


@pytest.fixture
def registered():
    LAYOUTS[HeadDiagonal.name] = HeadDiagonal
    yield HeadDiagonal.name
    LAYOUTS.pop(HeadDiagonal.name, None)


def test_a_layout_defined_in_one_class_runs_through_dam_the_figures_and_the_cli(registered, minilm_l6, kjv, tmp_path, capsys):
    settings = dict(seq_len=16, train_seqs=4, eval_seqs=2, batch_size=2, bootstrap=50, steps=4, stop_window=2, progress=False)
    result = attnlens.dam(minilm_l6, corpus=kjv, variant=registered, lambdas=[0.0, 5.0], lr=0.5, **settings)
    assert result.logits.shape == (2, 12, 2) and result.layout["name"] == registered
    assert result.layout["shared_by_layers"] and result.expressible("no-diagonal", 0) and not result.expressible("band", 1)
    compared = result.compared(within=1.0)
    own = compared[compared["scope"] == "own family"]
    assert set(own["pattern"]) <= {"no-diagonal"}, "its own family is what it says it expresses"
    figures = result.figures()
    assert {"loss_vs_sparsity", "keep_per_class", "training", "masks"} <= set(figures)
    loaded = attnlens.load_result(result.save(tmp_path / "saved"))
    assert loaded.layout == result.layout, "what the layout is travels with the result"
    code, out, err = run_cli(capsys, "dam", "--help")
    flat = re.sub(r"[\s│╭╮╰╯─]", "", out)  # the help as one string, whatever rich wrapped where
    assert code == 0 and registered in flat and "atest'sownlayout" in flat
    code, out, err = run_cli(
        capsys, "dam", "--variant", registered, "--lambdas", "0.1", "--seq-len", "16", "--train-seqs", "4", "--eval-seqs", "2",
        "--steps", "2", "--stop-window", "2", "--no-patterns", "--no-progress", "--no-figures", "--out", str(tmp_path / "cli"),
    )  # fmt: skip
    assert code == 0, err
    assert np.asarray(attnlens.load_result(tmp_path / "cli").logits).shape == (1, 12, 2)


def test_an_unknown_variant_names_every_registered_layout(registered):
    with pytest.raises(attnlens.BadInput, match=registered):
        attnlens.DamSettings.build(variant="dense")
