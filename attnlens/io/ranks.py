"""Runs on many processes with torch.distributed: ranks, shards of the data, exact sums.

attnlens does not launch processes itself. ``torchrun`` (or ``accelerate launch``)
starts one process per device and tells each its place through the environment
(``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``); :func:`init_world` reads it and joins the process group, with the
``gloo`` backend on CPU and ``nccl`` on CUDA. Without those variables (a plain
``attnlens`` command) the world is this one process and torch.distributed is never
touched, so the same command line works with one process or many.

Work is split deterministically: :func:`shard_range` gives each of ``size`` workers a
contiguous, balanced range of the sequence indices. Moment sums are additive, so the
sums of the shards, added up (:meth:`World.reduce_to_main`), equal the sums of the
whole up to float64 summation order.

>>> world = World.single()
>>> world.rank, world.size, world.is_main, world.distributed
(0, 1, True, False)
>>> [shard_range(10, rank, 3) for rank in range(3)]
[(0, 4), (4, 7), (7, 10)]
>>> world.run_on_main(lambda: "done")   # one process: simply runs
'done'
"""

from __future__ import annotations

import atexit
import datetime
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch

from attnlens.errors import AttnlensError, BadInput

T = TypeVar("T")

# Collectives wait this long for a rank that is still computing (e.g. a long pass over
# the data while another rank waits at the combine step): much longer than torch's
# 10-minute default, since one pass of a large model can take hours. A rank that dies
# is noticed by torchrun at once, which then stops the others.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=24)


class ReportedError(AttnlensError):
    """An error that rank 0 has already reported; other ranks exit with it silently.

    It subclasses :class:`AttnlensError` directly, not one of its kinds: it is a transport
    that carries whatever rank 0 raised (a :class:`BadInput`, a :class:`BadFile`, ...) to the
    ranks that did not, so that the CLI exits on them too without printing it again.
    """

    reported = True


def environment_world_size() -> int:
    """``WORLD_SIZE`` from the launcher's environment (1 when not launched by one).

    >>> environment_world_size() >= 1
    True
    """
    try:
        return max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    except ValueError:
        raise BadInput(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number; launch attnlens with torchrun") from None


def shard_range(total: int, rank: int, size: int) -> tuple[int, int]:
    """The contiguous range ``[start, stop)`` of ``total`` items that worker ``rank`` of
    ``size`` owns: sizes differ by at most one, earlier workers take the extra items (as
    ``numpy.array_split``). Contiguous ranges keep store reads sequential.

    >>> shard_range(5, 0, 2), shard_range(5, 1, 2), shard_range(1, 1, 2)
    ((0, 3), (3, 5), (1, 1))
    """
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class World:
    """This process's place among the processes of one run.

    ``rank`` and ``size`` over all machines; ``local_rank`` and ``local_size`` on this
    machine; ``backend`` is ``"gloo"``, ``"nccl"`` or ``None`` (one process).
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    backend: str | None

    @classmethod
    def single(cls) -> World:
        return cls(rank=0, size=1, local_rank=0, local_size=1, backend=None)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def describe(self) -> dict[str, object]:
        return {"world_size": self.size, "backend": self.backend, "local_world_size": self.local_size}

    def device(self, device: str) -> str:
        """The device this rank computes on: a bare ``cuda`` becomes ``cuda:LOCAL_RANK``.

        >>> World.single().device("cpu"), World(1, 2, 1, 2, "nccl").device("cuda")
        ('cpu', 'cuda:1')
        """
        if device == "cuda" and self.distributed:
            return f"cuda:{self.local_rank}"
        return device

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def run_on_main(self, function: Callable[[], T]) -> T | None:
        """Run ``function`` on rank 0 only (e.g. create a directory), then tell every rank
        how it went: its result on rank 0, ``None`` elsewhere. If it raised an
        :class:`AttnlensError` on rank 0, every rank raises it (rank 0 the error itself, the
        others silently, as a :class:`ReportedError`), so no rank is left waiting for a rank
        that gave up."""
        if not self.distributed:
            return function()
        result, message, failure = None, None, None
        if self.is_main:
            try:
                result = function()
            except AttnlensError as error:
                message, failure = (str(error.args[0]) if error.args else ""), error
            except BaseException as error:  # a bug: let the others stop too, keep the traceback here
                torch.distributed.broadcast_object_list([f"rank 0 failed with {type(error).__name__}: {error}"], src=0)
                raise
        box = [message]
        torch.distributed.broadcast_object_list(box, src=0)
        if box[0] is not None:
            if failure is not None:
                raise failure  # rank 0: the error as raised, of its kind (BadInput, BadFile, ...)
            raise ReportedError(box[0])
        return result

    def reduce_to_main(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over all ranks into rank 0's copy, in place (other ranks' copies
        are used as scratch space and hold no meaning afterwards)."""
        if self.distributed:
            torch.distributed.reduce(tensor, dst=0, op=torch.distributed.ReduceOp.SUM)


def init_world(device: str = "cpu", *, spread: bool = False) -> World:
    """The world of this process; joins the process group when launched with WORLD_SIZE > 1.

    ``nccl`` when ``device`` is CUDA (and sets this rank's CUDA device: ``LOCAL_RANK``,
    or with ``spread`` the first of the GPUs :func:`local_gpus` gives the rank for a
    ``device_map="auto"`` model), else ``gloo``. Idempotent: a second call returns the
    same world.
    """
    size = environment_world_size()
    if size == 1:
        return World.single()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(size)))
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise BadInput(f"`device` {device} asks for a GPU, but torch sees none here; use `device` cpu")
    if cuda:  # before the first collective: NCCL binds each rank to its current device
        if spread:
            torch.cuda.set_device(local_gpus(local_rank, local_size)[0])
        else:
            torch.cuda.set_device(local_rank if device == "cuda" else torch.device(device).index or 0)
    backend = "nccl" if cuda and torch.distributed.is_nccl_available() else "gloo"
    if not torch.distributed.is_initialized():
        if not all(name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT")):
            raise BadInput(
                f"WORLD_SIZE is {size} but MASTER_ADDR / MASTER_PORT are not set; launch with "
                "'torchrun --nproc-per-node N -m attnlens ...' rather than setting WORLD_SIZE by hand"
            )
        torch.distributed.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        atexit.register(_leave)
    return World(rank=rank, size=size, local_rank=local_rank, local_size=local_size, backend=backend)


def _leave() -> None:
    """Leave the process group at exit (torch warns about a group left behind)."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def local_gpus(local_rank: int, local_size: int, count: int | None = None) -> list[int]:
    """The GPUs of this machine that a rank spreads a ``device_map="auto"`` model over:
    the machine's GPUs split evenly among its ranks.

    >>> local_gpus(1, 2, count=8), local_gpus(0, 1, count=2)
    ([4, 5, 6, 7], [0, 1])
    """
    count = torch.cuda.device_count() if count is None else count
    if count < local_size:
        raise BadInput(
            f"{local_size} ranks on this machine but {count} GPUs; with `device_map` auto start at most one rank per GPU"
        )
    per_rank = count // local_size
    return list(range(local_rank * per_rank, (local_rank + 1) * per_rank))
