"""The one exception type attnlens raises for problems with the user's input."""

from __future__ import annotations


class AttnlensError(Exception):
    """Bad input or an unusable environment, with a one-line message saying how to fix it.

    The CLI prints the message on stderr, without a traceback, and exits non-zero.
    Anything else that escapes is a bug in attnlens and keeps its traceback.

    >>> str(AttnlensError("--seq-len 2 is below 4; use --seq-len 4 or more"))
    '--seq-len 2 is below 4; use --seq-len 4 or more'
    """
