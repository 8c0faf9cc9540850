"""Progress bars for long work: rate and ETA on stderr, off when not wanted."""

from __future__ import annotations

from tqdm.auto import tqdm


def progress_bar(*, total: int, desc: str, unit: str = "it", initial: int = 0, enabled: bool = True) -> tqdm:
    """A tqdm bar (count, rate, ETA) that prints nothing when ``enabled`` is false.

    >>> with progress_bar(total=3, desc="demo", enabled=False) as bar:
    ...     bar.update(3)
    """
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, smoothing=0.1)
