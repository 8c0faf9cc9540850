"""Writes that bypass the page cache: O_DIRECT where the file system allows it, the page cache elsewhere.

Batches go to disk with O_DIRECT where they can: from the batch's own memory straight to
the disk, instead of being copied into the page cache and written back by the kernel.
Extraction keeps every core busy with the forward pass, and that copy and writeback
(about 1.2 CPU-seconds per 600 MB, measured on minilm-l6) were most of what writing
the store cost it. The alignment is the strictest O_DIRECT asks for on Linux (4 KiB
sectors and pages): for file offsets, lengths and memory addresses. The store's writer
lays out its batches' memory to match (:class:`attnlens.io.store_writer.BatchBuffers`).
"""

from __future__ import annotations

import errno
import fcntl
import os

import numpy as np

from attnlens.io.files import pwrite_all

DIRECT_ALIGNMENT = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)  # absent on macOS: everything goes through the page cache


def pwrite_direct(descriptor: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at byte ``offset``, as :func:`pwrite_all` does, but the whole
    aligned blocks in its middle with O_DIRECT when the memory is aligned as the file is
    (see :class:`~attnlens.io.store_writer.BatchBuffers`) and the file system allows it.

    The partial blocks at either end, which a batch shares with its neighbours, always go
    through the page cache, so no block is ever written both ways. O_DIRECT does not make
    a write durable by itself (the disk's cache, the file's extents): the writer still
    fsyncs every file before it counts a batch.
    """
    head = -offset % DIRECT_ALIGNMENT
    body = max(len(data) - head, 0) // DIRECT_ALIGNMENT * DIRECT_ALIGNMENT
    if not body or _address(data[head:]) % DIRECT_ALIGNMENT or not _set_direct(descriptor, True):
        pwrite_all(descriptor, data, offset)
        return
    try:
        pwrite_all(descriptor, data[head : head + body], offset + head)
    except OSError as error:
        if error.errno != errno.EINVAL:  # some file systems accept O_DIRECT, then refuse the write
            raise
        _set_direct(descriptor, False)
        pwrite_all(descriptor, data[head : head + body], offset + head)
    finally:
        _set_direct(descriptor, False)
    pwrite_all(descriptor, data[:head], offset)
    pwrite_all(descriptor, data[head + body :], offset + head + body)


def _address(data: memoryview) -> int:
    return np.frombuffer(data, dtype=np.uint8).ctypes.data


def _set_direct(descriptor: int, direct: bool) -> bool:
    """Switch O_DIRECT on or off for an open file; ``False`` where the file system has no direct I/O."""
    if not _O_DIRECT:
        return False
    flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
    try:
        fcntl.fcntl(descriptor, fcntl.F_SETFL, flags | _O_DIRECT if direct else flags & ~_O_DIRECT)
    except OSError:
        return False
    return True
