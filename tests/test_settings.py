"""Settings in groups: every setting keeps one flat name (the command line's option, a keyword, a saved
result's key), whatever group holds it; groups check their own fields, the class that holds them what spans."""

from __future__ import annotations

import inspect
import json

import pytest

from attnlens.analysis.dam import DamSettings
from attnlens.analysis.dam.settings import MaskSettings
from attnlens.analysis.importance import ImportanceSettings
from attnlens.analysis.plan.settings import PlanSettings
from attnlens.analysis.reconstruct.settings import ReconstructSettings
from attnlens.analysis.task import TaskSettings
from attnlens.cli import dam as dam_cli
from attnlens.cli import importance as importance_cli
from attnlens.cli import plan as plan_cli
from attnlens.cli import reconstruct as reconstruct_cli
from attnlens.errors import BadInput

# Each analysis beside its command: the command's parameters are declared by hand, one per option.
COMMANDS = [
    (DamSettings, dam_cli.dam),
    (ReconstructSettings, reconstruct_cli.reconstruct),
    (ImportanceSettings, importance_cli.importance),
    (PlanSettings, plan_cli.plan),
]
# One value away from the default in every group (and the task's), each by its flat name.
CHANGED = {
    DamSettings: dict(mask_seeds=2, sparsity=(0.8,), lr=0.05, stop_window=10, reference="band", task="rotten-tomatoes",
                      protocol="probe", bootstrap=200, seq_len=64),
    ReconstructSettings: dict(ks=(4, 8), plug_in=True, plug_in_scopes=("head",), task_ks=(8,), task="rotten-tomatoes",
                              bootstrap=200),
    ImportanceSettings: dict(task_classes=("self",), task="rotten-tomatoes", task_eval=64, bootstrap=200),
    PlanSettings: dict(max_drop=(2.0,), task="rotten-tomatoes", task_eval=400, forecastable_only=False, bootstrap=200),
}  # fmt: skip


# What a command takes beside its settings, and options it parses into settings of another name.
COMMAND_LEVEL = {"model", "model_option", "source", "out", "device", "overwrite", "figures", "progress"}
PARSED = {"select": "strategies", "scope": "scopes", "plug_in_scope": "plug_in_scopes"}


@pytest.mark.parametrize(("cls", "command"), COMMANDS, ids=lambda item: getattr(item, "__name__", ""))
def test_every_option_of_a_command_is_a_setting_by_its_flat_name(cls, command):
    """The groups moved fields, not names: every option a command declares reaches its settings by its
    own name (the command passes options to ``build`` by name, so one that matched no setting would be
    dropped), and a saved result has one key per setting."""
    names = set(cls.paths())
    for option in set(inspect.signature(command).parameters) - COMMAND_LEVEL:
        assert option in names or PARSED.get(option) in names, f"--{option.replace('_', '-')} reaches no setting"
    assert len(names) == len(cls().to_dict())


@pytest.mark.parametrize("cls", list(CHANGED), ids=lambda cls: cls.__name__)
def test_settings_saved_by_flat_name_make_the_same_settings_again(cls):
    """A result's settings (to_dict, through JSON as a result stores them) build the same object: every
    group's changed field lands back in its group."""
    settings = cls.build(**CHANGED[cls])
    stored = json.loads(json.dumps(settings.to_dict()))
    assert cls.build(**stored) == settings != cls()
    for name, value in CHANGED[cls].items():
        held = settings
        for part in cls.paths()[name]:
            held = getattr(held, part)
        assert held == value, name


def test_a_name_an_analysis_and_its_task_both_declare_is_one_setting():
    """``bootstrap`` gives the proxy's intervals and the task's: the analysis's value reaches its task,
    whether built by flat name or constructed directly."""
    assert DamSettings.build(bootstrap=200).task.bootstrap == 200
    assert DamSettings(bootstrap=300).task.bootstrap == 300
    assert ReconstructSettings.build(bootstrap=50).task.bootstrap == 50


def test_a_group_checks_its_fields_by_their_flat_names_and_the_holder_checks_across_groups():
    with pytest.raises(BadInput, match="mask_seeds 0 must be at least 1"):
        MaskSettings(seeds=0)
    with pytest.raises(BadInput, match="train_on task needs a task"):  # training group beside the task group
        DamSettings.build(train_on="task")
    with pytest.raises(BadInput, match="stop_window"):  # steps (training) against stop_window (stopping)
        DamSettings.build(steps=10, stop_window=20)
    with pytest.raises(BadInput, match="stop_windw is not a setting of DamSettings; the settings are: corpus, "):
        DamSettings.build(stop_windw=10)


def test_the_task_is_one_object_every_analysis_holds():
    """Composition: the task settings an analysis hands its judge are the object it holds, equal to the
    task settings built alone from the same flat names."""
    task = dict(task="rotten-tomatoes", task_train=64, task_eval=40, probe_c=1.0)
    alone = TaskSettings.build(**task)
    for cls in (DamSettings, ImportanceSettings):
        assert cls.build(**task).task == alone
    assert ReconstructSettings.build(plug_in=True, **task).task == alone


def test_two_groups_that_name_one_setting_alike_are_refused_when_the_class_is_used():
    """A flat name must lead to one setting: two groups with the same flag would make one unreachable."""
    from dataclasses import dataclass

    from attnlens.settings import Settings, group

    @dataclass(frozen=True)
    class Left(Settings):
        rounds: int = 1

    @dataclass(frozen=True)
    class Right(Settings):
        rounds: int = 2

    @dataclass(frozen=True)
    class Both(Settings):
        left: Left = group(Left)
        right: Right = group(Right)

    with pytest.raises(AssertionError, match="groups left and right both name `rounds`"):
        Both.build(rounds=3)
