"""Stopping on a signal by convention: SIGINT (Ctrl-C), SIGTERM (a scheduler, ``kill``) and a
scheduler's warning signal (SLURM's ``--signal=USR1@90``) end a run with the exit status
``128 + signal number`` (130, 143, 138 ...), after the run cleaned up (temporary files removed,
complete shards kept).

:class:`Stopped` is what the handlers raise. It is a ``SystemExit`` rather than a
``KeyboardInterrupt``, for three reasons: Lightning turns a ``KeyboardInterrupt`` into
``sys.exit(1)``; code that catches ``Exception`` lets it through; and a process that does not catch
it (a worker Lightning spawned) ends with its status, without a traceback.

Two ways to stop:

- :func:`stops_raise`: the signal raises :class:`Stopped` in the main thread at once (after
  passing the signal on to the child processes), for work that is lost when cut anyway;
- :class:`DeferredStop`: the signal is noted, and :meth:`DeferredStop.check` raises at a point
  where stopping loses nothing finished (after a batch of a resumable prediction).

>>> import os, signal
>>> with stops_raise():
...     try:
...         os.kill(os.getpid(), signal.SIGTERM)
...     except Stopped as stop:
...         print(stop, stop.code)
stopped by SIGTERM 143
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import FrameType
from typing import Any

STOP_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop every neurocrf tool."""


def signal_number(name: str | int) -> int:
    """``"SIGUSR1"``, ``"USR1"`` or ``10`` -> the signal's number.

    >>> signal_number("USR1") == signal.SIGUSR1 == signal_number("SIGUSR1")
    True
    >>> signal_number("SIGFOO")
    Traceback (most recent call last):
    ValueError: unknown signal 'SIGFOO' (e.g. SIGUSR1, SIGUSR2)
    """
    if isinstance(name, int):
        return int(signal.Signals(name))
    text = str(name).upper()
    try:
        return int(signal.Signals[text if text.startswith("SIG") else f"SIG{text}"])
    except KeyError:
        raise ValueError(f"unknown signal {name!r} (e.g. SIGUSR1, SIGUSR2)") from None


class Stopped(SystemExit):
    """A run stopped by the signal ``signum``; ``code`` is the exit status ``128 + signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    def __str__(self) -> str:
        return f"stopped by {self.signal_name}"

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across Lightning's worker processes
        return (type(self), (self.signum,))


def pass_on(signum: int, children: Iterable[Any] = ()) -> None:
    """Send ``signum`` to ``children`` (objects with a ``pid``) and to this process's
    ``multiprocessing`` children (the workers of a spawning launcher), so that they stop too."""
    pids = {getattr(child, "pid", None) for child in children} | {p.pid for p in multiprocessing.active_children()}
    for pid in pids - {None, os.getpid()}:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _install(signals: Sequence[int], handler: Callable[[int, FrameType | None], None]) -> dict[int, Any]:
    previous = {}
    for signum in signals:
        previous[signum] = signal.signal(signum, handler)
    return previous


def _restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def stops_raise(signals: Sequence[int] = STOP_SIGNALS) -> Iterator[None]:
    """Inside this block each of ``signals`` raises :class:`Stopped` in the main thread (a no-op
    in other threads); the previous handlers come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        pass_on(signum)
        raise Stopped(signum)

    previous = _install(signals, handler)
    try:
        yield
    finally:
        _restore(previous)


class DeferredStop:
    """Notes the first of ``signals`` instead of stopping; :meth:`check` raises :class:`Stopped`
    for it. ``children()``: the processes to pass the signal on to (e.g. a launcher's workers).

    >>> import os, signal
    >>> stop = DeferredStop([signal.SIGUSR1])
    >>> stop.install(); os.kill(os.getpid(), signal.SIGUSR1); stop.pending
    10
    >>> stop.restore(); stop.check()
    Traceback (most recent call last):
    neurocrf.interrupts.Stopped: stopped by SIGUSR1
    """

    def __init__(self, signals: Sequence[int] = STOP_SIGNALS, children: Callable[[], Iterable[Any]] = tuple) -> None:
        self.signals, self.children = tuple(signals), children
        self.pending: int | None = None
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.pending is None:
            self.pending = signum
            pass_on(signum, self.children())

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = _install(self.signals, self._note)

    def restore(self) -> None:
        _restore(self._previous)
        self._previous = {}

    def check(self) -> None:
        """Raise :class:`Stopped` if a signal arrived."""
        if self.pending is not None:
            raise Stopped(self.pending)
