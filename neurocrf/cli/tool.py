"""How every Hydra console script starts and ends: one line per user error, exit statuses by
convention, stop signals, mandatory values checked together.

Exit statuses (the same for every ``neurocrf-*`` tool; each ``--help`` repeats them):

====  ========================================================================================
0     done
1     an internal error, a bug: the traceback is printed (please report it with it)
2     a user error: a bad or missing option, a file that is missing or cannot be read or
      written, bad input data, a checkpoint that cannot be used. One line on stderr,
      ``neurocrf-<tool>: error: <file>:<line>: <problem>`` (or the option at fault)
130   stopped by SIGINT (Ctrl-C); 143: by SIGTERM; 128 + N: by signal N (``stop_signals``)
====  ========================================================================================

A user error is what the package raises for bad input: ``ValueError`` and its kinds
(:class:`~neurocrf.data.streams.ConllFormatError`, :class:`~neurocrf.models.checkpoints.CheckpointError`,
``TreebankFormatError``, ``InvalidTagError``), ``OSError`` (missing files, folders that cannot
be written) and the config errors of OmegaConf and Hydra (an unknown key, a missing ``???``
value, a bad override). ``HYDRA_FULL_ERROR=1`` prints its traceback too.

Hydra reports a failed job as ``Error executing job with overrides`` and a traceback, and exits
1. So the task function hands its exception out wrapped in :class:`JobFailed`, which Hydra lets
through (a multirun keeps Hydra's report: one failed job there does not end a sweeper's study
early); and an error of Hydra's own (an unknown key on the command line) reaches :func:`run_tool`
because it runs Hydra with ``HYDRA_FULL_ERROR=1``. Worker processes that Lightning starts inherit
that setting together with :data:`SHORT_ERRORS`, which keeps their reports short as well.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, InstantiationException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from neurocrf.cli.utils import CONFIG_DIR
from neurocrf.interrupts import Stopped, stops_raise

log = logging.getLogger(__name__)

EXIT_INTERNAL = 1
EXIT_USER = 2
FULL_ERROR = "HYDRA_FULL_ERROR"
SHORT_ERRORS = "NEUROCRF_SHORT_ERRORS"  # set by run_tool alone, for the processes it starts

class JobFailed(BaseException):
    """The exception of a task function, carried past Hydra's report of failed jobs."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class MissingValues(ValueError):
    """Mandatory values (``???`` in the config) not given on the command line."""


def user_error(error: BaseException) -> BaseException | None:
    """The user error that ``error`` is or wraps (module docstring); None for an internal error.

    >>> user_error(FileNotFoundError(2, "No such file or directory", "in.conll")).filename
    'in.conll'
    >>> user_error(KeyError("tags")) is None
    True
    """
    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__  # the error of the object's constructor (a data module's missing file)
    if isinstance(error, (ValueError, OSError, OmegaConfBaseException, HydraException)):
        return error
    return None


def one_line(error: BaseException) -> str:
    """``error``'s message on one line: a file error as ``<file>: <problem>``, a config error
    with the key at fault.

    >>> one_line(FileNotFoundError(2, "No such file or directory", "in.conll"))
    'in.conll: No such file or directory'
    >>> one_line(ValueError("in.conll:3: 2 columns\\nexpected 3"))
    'in.conll:3: 2 columns; expected 3'
    """
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        text = f"{error.filename}: {error.strerror}"
    elif isinstance(error, HydraException) and isinstance(error.__cause__, OmegaConfBaseException):
        text = f"{error} ({str(error.__cause__).splitlines()[0]})"
    else:
        text = str(error) or type(error).__name__
    if isinstance(error, OmegaConfBaseException):
        text = text.split("\n    full_key:")[0]  # OmegaConf's own location lines
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "".join(line + ("" if i == len(lines) - 1 else " " if line.endswith(".") else "; ")
                   for i, line in enumerate(lines))


def check_mandatory(cfg: DictConfig) -> None:
    """Raise :class:`MissingValues` naming every ``???`` value left in ``cfg`` (all at once)."""
    missing = sorted(key for key in OmegaConf.missing_keys(cfg) if not key.startswith("hydra."))
    if missing:
        raise MissingValues(
            f"missing mandatory value{'s' if len(missing) > 1 else ''}: {', '.join(missing)}"
            f" (give {' '.join(f'{key}=...' for key in missing)}; --help lists the options)"
        )


def run_tool(prog: str, hydra_main: Callable[[], Any]) -> Any:
    """Run a Hydra entry point as the console script ``prog``, ending as the module docstring says."""
    traceback_wanted = os.environ.get(FULL_ERROR) == "1" and os.environ.get(SHORT_ERRORS) != "1"
    saved = {name: os.environ.get(name) for name in (FULL_ERROR, SHORT_ERRORS)}
    if not traceback_wanted:
        os.environ.update({FULL_ERROR: "1", SHORT_ERRORS: "1"})
    try:
        with stops_raise():
            return hydra_main()
    except JobFailed as failed:
        return _report(prog, failed.error, traceback_wanted)
    except Stopped as stop:
        print(f"{prog}: {stop}", file=sys.stderr)
        raise SystemExit(stop.code) from None
    except KeyboardInterrupt:
        print(f"{prog}: stopped by SIGINT", file=sys.stderr)
        raise SystemExit(130) from None
    except Exception as error:  # noqa: BLE001 - every error ends here, reported by its kind
        return _report(prog, error, traceback_wanted)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _report(prog: str, error: Exception, traceback_wanted: bool) -> None:
    user = user_error(error)
    if user is None or traceback_wanted:
        traceback.print_exception(error)
    if user is None:
        print(f"{prog}: internal error: {one_line(error)}", file=sys.stderr)
        raise SystemExit(EXIT_INTERNAL) from None
    print(f"{prog}: error: {one_line(user)}", file=sys.stderr)
    raise SystemExit(EXIT_USER) from None


def _no_tips(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("\N{ELECTRIC LIGHT BULB} Tip:")


def silence_lightning_tips() -> None:
    """Drop Lightning's advertisements ("Tip: ... try installing ...") from its log (idempotent)."""
    lightning = logging.getLogger("pytorch_lightning.utilities.rank_zero")
    if _no_tips not in lightning.filters:
        lightning.addFilter(_no_tips)


silence_lightning_tips()


def tool_main(
    task: Callable[[DictConfig], Any], config_name: str, prog: str,
    result: Callable[[DictConfig, Any], float | None] | None = None,
) -> Callable[[], Any]:
    """The console script ``prog``: composes ``configs/<config_name>.yaml`` with the command
    line, checks that no ``???`` value is left, runs ``task(cfg)`` and returns
    ``result(cfg, <what task returned>)`` to Hydra (the value a sweeper optimises), all under
    :func:`run_tool`. Hydra names the job after ``task``'s module."""

    @functools.wraps(task)  # Hydra reads the job name off the module of the wrapped function
    def task_function(cfg: DictConfig) -> float | None:
        try:
            check_mandatory(cfg)
            log.info("run folder: %s (paths.root_dir=<folder> or NEUROCRF_HOME=<folder> moves it)",
                     cfg.paths.output_dir)
            returned = task(cfg)
        except Exception as error:
            if HydraConfig.get().mode == RunMode.MULTIRUN:
                raise
            raise JobFailed(error) from error
        return result(cfg, returned) if result is not None else None

    task_function.__name__ = task_function.__qualname__ = "main"
    hydra_main = hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)(task_function)

    def main() -> Any:
        return run_tool(prog, hydra_main)

    main.__doc__ = f"``{prog}``: ``{task.__module__}.{task.__name__}`` on ``configs/{config_name}.yaml``."
    return main
