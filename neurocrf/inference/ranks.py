"""What the processes of a multi-process prediction agree on before they predict: one job, one
output, one shard folder that every rank sees.

The ranks of a run on several nodes reach each other's shards only through a file system that
every node mounts at the same path (NFS, Lustre, GPFS, BeeGFS ...): each rank writes its shards
into ``.<output name>.shards/`` beside the output, and rank 0 (of node 0) merges them. So, once
the process group is up and before anything is predicted:

1. the ranks exchange their output path and job fingerprint (:func:`agree_on_job`): a rank
   that writes to another output (``output=null`` names a file in each process's own run
   directory) or runs another job (other input or checkpoint files at the same path) stops
   every rank with the same error;
2. rank 0 prepares the shard folder, writes a fresh run token into it
   (:func:`neurocrf.inference.sharded.prepare_shards`) and sends the token to every rank;
3. every rank reads the token back through its own view of the folder, for up to
   :data:`SHARED_WAIT_S` seconds (``shared_wait_s`` of ``configs/predict.yaml``), and the ranks exchange what they found
   (:func:`agree_on_folder`): a rank that does not see it (a node-local disk such as ``/tmp``)
   stops every rank with the same error.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

JOB_FILE = "job.json"
# how long a rank waits to see rank 0's token: a network file system may show another node's new
# file only once its cached view of the folder expires
SHARED_WAIT_S = 10.0


@dataclass(frozen=True)
class RankView:
    """What one rank runs: its output path and job fingerprint, on which host."""

    rank: int
    host: str
    output: str
    key: str

    @property
    def name(self) -> str:
        return f"rank {self.rank} on {self.host}"


def gather(value: Any) -> list[Any]:
    """``value`` of every rank, in rank order (``[value]`` without a process group)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def different_jobs(views: list[RankView]) -> str | None:
    """Why the ranks of ``views`` cannot write one output together (None: they can).

    >>> a = RankView(0, "node1", "/shared/tags.conll", "k")
    >>> different_jobs([a, RankView(1, "node2", "/shared/tags.conll", "k")]) is None
    True
    >>> print(different_jobs([a, RankView(1, "node2", "logs/tags.conll", "k")]))
    the ranks write to different outputs (rank 0 on node1: /shared/tags.conll; rank 1 on node2: \
logs/tags.conll): give every rank the same output=<file on a file system that every node shares> \
(output=null names a file in each process's own run directory)
    >>> print(different_jobs([a, RankView(1, "node2", "/shared/tags.conll", "other")]))
    rank 1 on node2 and rank 0 on node1 do not run the same job: the input file, the checkpoint \
(path, size, modification time) or the options differ; every node must read the same files, on a \
file system that every node shares
    """
    first = views[0]
    if any(v.output != first.output for v in views):
        outputs = "; ".join(f"{v.name}: {v.output}" for v in views)
        return (f"the ranks write to different outputs ({outputs}): give every rank the same output=<file on a"
                f" file system that every node shares> (output=null names a file in each process's own run"
                f" directory)")
    if any(v.key != first.key for v in views):
        others = ", ".join(v.name for v in views if v.key != first.key)
        return (f"{others} and {first.name} do not run the same job: the input file, the checkpoint (path, size,"
                f" modification time) or the options differ; every node must read the same files, on a file"
                f" system that every node shares")
    return None


def agree_on_job(rank: int, output: str, key: str) -> list[RankView]:
    """Every rank's :class:`RankView`, once all write ``output`` for the job ``key``.

    Raises:
        RuntimeError: on every rank, when they do not (:func:`different_jobs`).
    """
    views = gather(RankView(rank, socket.gethostname(), output, key))
    problem = different_jobs(views)
    if problem:
        raise RuntimeError(problem)
    return views


def read_token(folder: Path) -> str | None:
    """The run token of the job file in ``folder`` (None: no readable job file)."""
    try:
        return json.loads((folder / JOB_FILE).read_text(encoding="utf-8")).get("run")
    except (OSError, ValueError, AttributeError):
        return None


def sees_token(folder: Path, token: str, wait_s: float = SHARED_WAIT_S) -> bool:
    """Whether ``folder`` holds the job file with ``token``, polled for up to ``wait_s`` seconds.

    >>> import tempfile
    >>> sees_token(Path(tempfile.mkdtemp()), "abc", wait_s=0)
    False
    """
    deadline = time.monotonic() + wait_s
    while read_token(folder) != token:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def agree_on_folder(views: list[RankView], folder: Path, token: str, wait_s: float = SHARED_WAIT_S) -> None:
    """Return once every rank sees rank 0's run ``token`` in ``folder`` (each waits up to ``wait_s``
    seconds for it).

    Raises:
        RuntimeError: on every rank, naming those that do not see it.
    """
    blind = [view.name for view, seen in zip(views, gather(sees_token(folder, token, wait_s))) if not seen]
    if blind:
        raise RuntimeError(
            f"{folder}: {', '.join(blind)} {'does' if len(blind) == 1 else 'do'} not see the shard folder that"
            f" {views[0].name} prepared: the output must be on a file system that every node shares, at the same"
            f" path (not a node-local disk such as /tmp), and show it within {wait_s:g} s (shared_wait_s=...)"
        )
