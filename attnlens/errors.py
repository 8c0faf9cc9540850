"""Errors attnlens raises for problems with the user's input, files or model.

Every message is one line that says what is wrong and how to fix it. A message names
the parameters it is about between backticks; Python callers read the parameter's name
(``lambdas``), the command line its option (``--lambdas``), from the same error:

>>> error = BadInput("`seq_len` 2 is below 4; use `seq_len` 4 or more")
>>> str(error)
'seq_len 2 is below 4; use seq_len 4 or more'
>>> error.cli_message()
'--seq-len 2 is below 4; use --seq-len 4 or more'
>>> isinstance(error, ValueError), isinstance(error, AttnlensError)
(True, True)

The hierarchy lets callers catch what they mean: :class:`BadInput` (a setting or
argument out of range, unknown or inconsistent), :class:`BadFile` (a store, result,
moments or partial file that is missing, damaged, unfinished or of another kind) and
:class:`UnsupportedModel` (a model attnlens cannot load or whose attention it cannot
reach); ``except AttnlensError`` catches all three. Anything else that escapes is a bug
in attnlens and keeps its traceback.

The rule for attnlens' own code: raise one of the three subclasses, never
:class:`AttnlensError` itself, and never a built-in exception (``ValueError``,
``RuntimeError``, ``KeyError``, ...) for anything a user can cause. A check that only a
bug in attnlens can fail raises ``AssertionError`` and says so in a comment; an abstract
method raises ``NotImplementedError``. The one direct subclass besides the three is
:class:`attnlens.io.ranks.ReportedError`, which carries an error rank 0 has already
reported to the other ranks of a torchrun launch, whatever its kind. ``tests/test_errors.py``
reads the package's source and fails on any other raise of the base class or of a built-in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_PARAMETER = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")


def option_name(parameter: str) -> str:
    """The command-line option of a library parameter: ``num_seqs`` -> ``--num-seqs``.

    >>> option_name("num_seqs")
    '--num-seqs'
    """
    return "--" + parameter.replace("_", "-")


class _OneLine:
    """A one-line message that names parameters between backticks: plain for Python callers,
    as command-line options on the command line."""

    args: tuple

    def __str__(self) -> str:
        return _PARAMETER.sub(r"\1", str(self.args[0]) if self.args else "")

    def cli_message(self, options: Mapping[str, str] | None = None) -> str:
        """The message with each named parameter written as its command-line option
        (``options`` maps parameters whose option is spelt otherwise, e.g. ``source`` -> ``SOURCE``)."""
        options = options or {}
        text = str(self.args[0]) if self.args else ""
        return _PARAMETER.sub(lambda match: options.get(match.group(1), option_name(match.group(1))), text)


class AttnlensError(_OneLine, Exception):
    """Bad input or an unusable environment, with a one-line message saying how to fix it.

    The CLI prints :meth:`cli_message` on stderr, without a traceback, and exits non-zero.
    """


class BadInput(AttnlensError, ValueError):
    """A setting or argument that is out of range, unknown, or contradicts another."""


class BadFile(AttnlensError):
    """A store, result, moments or partial file that is missing, damaged, unfinished or of another kind."""


class UnsupportedModel(AttnlensError):
    """A model attnlens cannot load, or whose attention it cannot capture."""


class AttnlensWarning(_OneLine, UserWarning):
    """Something a user should know that does not stop the work (a judged set that may hold the
    classifier's own training examples). The command line prints it as one line on stderr,
    ``attnlens: warning: ...``; Python callers see a :mod:`warnings` warning they can filter."""
