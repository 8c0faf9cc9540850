"""transformers kept quiet: attnlens says what it is doing itself, and a one-off conversion in the cache says nothing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide transformers' own progress bars and info logs while attnlens loads or converts a model.

    >>> from transformers.utils import logging as hf_logging
    >>> with quiet_transformers():
    ...     hf_logging.is_progress_bar_enabled()
    False
    """
    import logging

    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_logger = logging.getLogger("huggingface_hub")
    hub_level = hub_logger.level
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        hub_logger.setLevel(hub_level)
        if bars:
            hf_logging.enable_progress_bar()
