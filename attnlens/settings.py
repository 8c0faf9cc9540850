"""Settings as data: one frozen dataclass per analysis, which validates itself.

Each analysis (``EigenSettings``, ``DamSettings``, ...) subclasses :class:`Settings`.
Its fields and their defaults are the one place the defaults live: the Python entry
point takes ``settings`` plus keyword overrides (``eigen(source, num_seqs=64)``), and
the CLI declares its options with the same defaults (``EigenSettings.num_seqs``).
A bad value raises :class:`~attnlens.errors.BadInput` naming the parameter, when the
settings are made, before any model loads.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Demo(Settings):
...     num_seqs: int = 8
...     def validate(self) -> None:
...         at_least("num_seqs", self.num_seqs, 1)
>>> Demo().replace(num_seqs=4).num_seqs
4
>>> Demo(num_seqs=0)
Traceback (most recent call last):
    ...
attnlens.errors.BadInput: num_seqs 0 must be at least 1
>>> Demo.build(None, num_sqes=3)
Traceback (most recent call last):
    ...
attnlens.errors.BadInput: num_sqes is not a setting of Demo; the settings are: num_seqs
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Self

from attnlens.errors import BadInput


@dataclasses.dataclass(frozen=True)
class Settings:
    """Base of every analysis's settings: frozen, validated on creation, recorded in results.

    A field may be a group: settings of their own (a :class:`Settings` made by its
    ``default_factory``), which validate themselves; the class holding them checks what
    spans groups. Every setting has one flat name, its field's name or the ``flag`` given
    by :func:`setting`: the name :meth:`build`, :meth:`replace`, :meth:`to_dict` and the
    command line's options use, wherever the setting sits. A name declared both here and in a
    group (``bootstrap``) is one setting: this class's value is passed down to the group.
    """

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # lists given by a caller are kept as tuples: hashable, compared by value
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))
        self._pass_down()
        self.validate()

    def _pass_down(self) -> None:
        own = {_flag(field): getattr(self, field.name) for field in dataclasses.fields(self) if not _is_group(field)}
        for field in dataclasses.fields(self):
            if _is_group(field):
                group = getattr(self, field.name)
                shared = {name: own[name] for name, value in group.flat().items() if name in own and value != own[name]}
                if shared:
                    object.__setattr__(self, field.name, group.replace(**shared))

    def validate(self) -> None:
        """Raise :class:`BadInput` for a bad value; subclasses check their fields."""

    @classmethod
    def paths(cls) -> dict[str, tuple[str, ...]]:
        """Each flat name and the fields that lead to its setting.

        >>> from attnlens.analysis.dam import DamSettings
        >>> DamSettings.paths()["stop_window"], DamSettings.paths()["task"]
        (('stopping', 'window'), ('task', 'name'))
        """
        paths: dict[str, tuple[str, ...]] = {
            _flag(field): (field.name,) for field in dataclasses.fields(cls) if not _is_group(field)
        }
        for field in dataclasses.fields(cls):
            if _is_group(field):
                for name, path in field.default_factory.paths().items():  # type: ignore[union-attr]
                    # one flag, two settings: a mistake in the classes, not the user's input
                    assert len(paths.get(name, ())) <= 1, (
                        f"{cls.__name__}: groups {paths[name][0]} and {field.name} both name `{name}`"
                    )
                    paths.setdefault(name, (field.name, *path))  # a name this class declares too is this class's
        return paths

    @classmethod
    def build(cls, settings: Self | None = None, /, **changes: Any) -> Self:
        """``settings`` (default: the defaults) with ``changes``, by flat name, applied; unknown names are an error."""
        paths = cls.paths()
        unknown = [name for name in changes if name not in paths]
        if unknown:
            raise BadInput(f"`{unknown[0]}` is not a setting of {cls.__name__}; the settings are: {', '.join(paths)}")
        base = settings if settings is not None else cls()
        return base._changed({paths[name]: value for name, value in changes.items()}) if changes else base

    def _changed(self, changes: dict[tuple[str, ...], Any]) -> Self:
        own: dict[str, Any] = {}
        nested: dict[str, dict[tuple[str, ...], Any]] = {}
        for (name, *rest), value in changes.items():
            if rest:
                nested.setdefault(name, {})[tuple(rest)] = value
            else:
                own[name] = value
        for name, group_changes in nested.items():
            own[name] = getattr(self, name)._changed(group_changes)
        return dataclasses.replace(self, **own)

    def replace(self, **changes: Any) -> Self:
        return type(self).build(self, **changes)

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat name, groups opened."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if _is_group(field):
                values.update({name: item for name, item in value.flat().items() if name not in values})
            else:
                values[_flag(field)] = value
        return values

    @classmethod
    def defaults(cls) -> SimpleNamespace:
        """The defaults by flat name, as attributes: what the command line declares its options with.

        >>> from attnlens.analysis.dam import DamSettings
        >>> DamSettings.defaults().stop_window
        20
        """
        return SimpleNamespace(**cls().flat())

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON-ready data by flat name (tuples as lists, paths and objects as text)."""
        return {name: _plain(value) for name, value in self.flat().items()}


def setting(default: Any, *, flag: str) -> Any:
    """A field whose flat name (:meth:`Settings.build`, the command line, saved results) is ``flag``."""
    return dataclasses.field(default=default, metadata={"flag": flag})


def group(cls: type[Settings]) -> Any:
    """A field holding a group of settings, its defaults by default."""
    return dataclasses.field(default_factory=cls)


def _flag(field: dataclasses.Field[Any]) -> str:
    return str(field.metadata.get("flag", field.name))


def _is_group(field: dataclasses.Field[Any]) -> bool:
    factory = field.default_factory
    return isinstance(factory, type) and issubclass(factory, Settings)


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Path):
        return str(value)
    describe = getattr(value, "describe", None)  # a Corpus or a LoadedModel: what it is, not the object
    return describe() if callable(describe) else str(value)


MIN_SEQ_LEN = 4  # a block needs room for text beside its special tokens


@dataclasses.dataclass(frozen=True)
class CorpusSettings(Settings):
    """Which text the model reads: the corpus, cut into blocks of ``seq_len`` tokens, taken
    ``batch_size`` blocks per forward pass, chosen by ``seed``. Analyses add their counts
    of blocks (``num_seqs``, or ``train_seqs`` and ``eval_seqs``).

    ``corpus`` is a built-in name (``kjv``, ``wordnet``), a file or folder, or a loaded
    :class:`~attnlens.data.corpus.Corpus`.
    """

    corpus: Any = "kjv"
    seq_len: int = 128
    batch_size: int = 32
    seed: int = 0

    def validate(self) -> None:
        super().validate()  # cooperative: a settings class may mix in others (e.g. TaskSettings)
        at_least("seq_len", self.seq_len, MIN_SEQ_LEN)
        at_least("batch_size", self.batch_size, 1)


# ---------------------------------------------------------------------- checks shared by every settings class


def at_least(name: str, value: float, low: float, hint: str = "") -> None:
    """``value >= low``, else ``BadInput`` naming the parameter."""
    if not value >= low:
        raise BadInput(f"`{name}` {value:g} must be at least {low:g}{hint}")


def positive(name: str, value: float, hint: str = "") -> None:
    """``value > 0`` and finite."""
    if not (value > 0 and math.isfinite(value)):
        raise BadInput(f"`{name}` {value:g} must be greater than 0{hint}")


def probability(name: str, value: float, hint: str = "") -> None:
    """``0 < value < 1``."""
    if not 0 < value < 1:
        raise BadInput(f"`{name}` {value:g} must be a probability strictly between 0 and 1{hint}")


def numbered_from_zero(name: str, values: Iterable[int] | None, what: str = "layers") -> None:
    """Every number in ``values`` (layers, query positions) is 0 or more; the top of the range is checked
    once the model (or store) is known.

    >>> numbered_from_zero("layers", [0, -1])
    Traceback (most recent call last):
        ...
    attnlens.errors.BadInput: layers -1 is out of range; layers are numbered from 0
    """
    bad = [value for value in values or () if value < 0]
    if bad:
        raise BadInput(f"`{name}` {bad[0]} is out of range; {what} are numbered from 0")


def one_of(name: str, value: object, choices: Iterable[object]) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise BadInput(f"`{name}` {value} is unknown; use one of {', '.join(map(str, choices))}")
