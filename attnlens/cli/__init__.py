"""The ``attnlens`` command line: parse options, call one library function, say where the result went.

One module per pipeline step registers its commands on the shared app.
"""

from . import dam, eigen, extract, figures, importance, overlap, reconstruct, report, scale  # noqa: F401  (each registers its commands)
from .app import app, main

__all__ = ["app", "main"]
