"""The ``attnlens`` command line: parse options, call one library function, say where the result went.

One module per pipeline step registers its commands on the shared app.
"""

# each registers its commands; --help lists them in this order, the pipeline's
from . import report, extract, eigen, scale, overlap, reconstruct, importance, sinks, dam, plan, figures  # noqa: F401, I001
from .app import app, main

__all__ = ["app", "main"]
