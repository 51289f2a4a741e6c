"""Clean exits for multi-process runs: the process group is destroyed before the interpreter ends.

Lightning initialises a ``torch.distributed`` process group in every process of a ``ddp``,
``ddp_spawn`` or multi-node run and leaves it open when the run ends (it registers a destroy at
exit for NCCL only). A gloo group left open makes exits crash now and then: one of the group's
worker threads (``ProcessGroupGloo::runLoop``) releases the last reference to a finished
collective, whose tensors need the GIL to be freed; when that happens after the main thread has
begun finalising the interpreter, taking the GIL ends the thread with a forced unwind through a
``noexcept`` destructor, and the process dies with ``terminate called without an active
exception`` (SIGABRT) after its work is done. Destroying the group at exit, before finalisation,
joins those threads while the interpreter still runs; for NCCL it also avoids PyTorch's warning
about a group that was never destroyed.

:class:`ProcessGroupTeardown` is a mixin of the LightningModules: its ``setup`` hook runs in
every process once the strategy has initialised the group, for every launcher and every stage
(fit, validate, test, predict), and registers :func:`destroy_process_group_at_exit` there.
"""

from __future__ import annotations

import atexit

import torch.distributed as dist

_registered = False


def _destroy_open_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_process_group_at_exit() -> bool:
    """Destroy this process's default process group when the interpreter exits (registered once
    per process, only where a group is initialised). Returns whether a destroy is registered.

    >>> destroy_process_group_at_exit()  # no process group in this process: nothing to do
    False
    """
    global _registered
    if not _registered and dist.is_available() and dist.is_initialized():
        # runs before Lightning's own NCCL handler (registered earlier; atexit runs last in, first
        # out), which then finds the group gone and does nothing
        atexit.register(_destroy_open_process_group)
        _registered = True
    return _registered


class ProcessGroupTeardown:
    """LightningModule mixin: every process that runs a stage under a distributed strategy
    destroys its process group at exit (see the module docstring for why)."""

    def setup(self, stage: str) -> None:
        super().setup(stage)  # type: ignore[misc]
        destroy_process_group_at_exit()
