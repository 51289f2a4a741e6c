"""The compiled CPU kernel: the forward-backward pass, Viterbi and gold-path scores of first-order
chains in C (``kernel.c`` beside this file), loaded with :mod:`ctypes`: no torch headers, no Python
extension module.

Where the library comes from, first found wins:

1. built at install time: ``pip install`` (and ``pip install -e .``) compiles ``kernel.c`` into
   this folder (``setup.py``), so the first call loads it in about a millisecond;
2. the user cache, ``$XDG_CACHE_HOME/neurocrf`` (``~/.cache/neurocrf``): built there once, at the
   first use, with the system C compiler (``$CC``, ``cc``, ``gcc`` or ``clang``; about a second)
   when the install could not build it (for instance a wheel built elsewhere).

Both file names carry a digest of ``kernel.c``, so a library built from another version of the
source is never loaded. Without a compiler the backend is unavailable and :func:`unavailable`
says why: ``backend="auto"`` then runs the torch backend; ``backend="compiled"`` raises.

``NEUROCRF_COMPILED_KERNEL=0`` (or ``false``, ``no``, ``off``) turns the kernel off for a run;
``=1``, the switch of releases where it was off by default, is accepted and changes nothing.

The kernel computes, row by row on CPU tensors: the rescaled forward-backward pass in float64
(rescaled at every position and certified as it runs: every product of a kept rescaled value and
a nonzero factor of the next step is at least ``exp(-700)``, so no finite score is lost to
underflow; a value too small for that is dropped, and the backward pass bounds the relative error
of ``Z`` the dropped values could have caused; otherwise it reports failure and the caller takes
the reference's log-space scan); Viterbi in float64 with first-index ties, summing ``score +
(move + emission)`` (the exported decoder's order); gold-path scores summed in float64. Each takes emissions ``[B, T, C]`` whose columns
several states may share (``columns``, see :mod:`~neurocrf.structs.engine.columns`), and
:func:`fold` turns the states' emission gradients into the columns' in the emissions' dtype.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("kernel.c")
_ENV = "NEUROCRF_COMPILED_KERNEL"
_OFF = {"0", "false", "no", "off"}
_enabled = os.environ.get(_ENV, "").strip().lower() not in _OFF
_library: ctypes.CDLL | None = None
_failed: str | None = None
_I64, _F64, _PTR = ctypes.c_int64, ctypes.c_double, ctypes.c_void_p


def library_name() -> str:
    """File name of the library built from the current ``kernel.c``."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"first_order_kernel_{digest}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"


def use_compiled_kernel(enabled: bool = True) -> bool:
    """Allow or forbid the compiled kernel for this process; returns whether it is now usable."""
    global _enabled
    _enabled = enabled
    return unavailable() is None


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "neurocrf"


def find_compiler() -> str | None:
    """The C compiler to use: ``$CC``, ``cc``, ``gcc`` or ``clang``; None if there is none."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(target: Path) -> None:
    """Compile ``kernel.c`` into the shared library ``target`` (atomically: concurrent builders never
    see a partial file); RuntimeError naming the problem if it cannot."""
    compiler = find_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        library = Path(tmp) / target.name
        run = subprocess.run([compiler, "-O3", "-shared", "-fPIC", "-std=c99", str(SOURCE), "-o", str(library), "-lm"],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {run.stderr.strip()[-500:]}")
        os.replace(library, target)


def _open() -> ctypes.CDLL:
    """The library: the one built at install time, else the cached one, built now if missing."""
    name = library_name()
    installed = Path(__file__).with_name(name)
    if installed.exists():
        return ctypes.CDLL(str(installed))
    cached = _cache_dir() / name
    if not cached.exists():
        build(cached)
    return ctypes.CDLL(str(cached))


def unavailable() -> str | None:
    """None when the kernel is loaded (loading or building it now if needed), else why it is not."""
    global _library, _failed
    if not _enabled:
        return f"the compiled kernel is turned off ({_ENV}=0 or use_compiled_kernel(False))"
    if _failed is not None:
        return _failed
    if _library is None:
        try:
            library = _open()
        except Exception as error:  # no compiler, a failed build, an unloadable library
            _failed = f"the compiled kernel could not be built or loaded ({type(error).__name__}: {error})"
            return _failed
        library.fb_forward.restype = ctypes.c_int
        library.fb_forward.argtypes = [_I64] * 4 + [_PTR] * 8 + [_F64] + [_PTR] * 2
        library.fb_backward.restype = ctypes.c_int
        library.fb_backward.argtypes = [_I64] * 4 + [_PTR] * 9 + [_F64] * 2 + [_PTR] * 5
        for name in ("viterbi_f32", "viterbi_f64", "gold_f32", "gold_f64", "gold_backward_f32", "gold_backward_f64",
                     "fold_f32", "fold_f64"):
            function = getattr(library, name)
            function.restype = ctypes.c_int if name in ("gold_f32", "gold_f64") else None
            function.argtypes = [_I64] * 4 + [_PTR] * (4 if name.startswith("fold") else 8)
        _library = library
    return None


def _columns(num_columns: int, columns: Tensor | None) -> tuple[int, int | None]:
    """The kernel's ``C, col`` arguments: the number of emission columns and the pointer of the
    column map (None: the identity)."""
    return num_columns, None if columns is None else columns.data_ptr()


def fb_forward(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, probs: Tensor, shift: Tensor,
               lengths: Tensor, tiny: float, columns: Tensor | None = None) -> tuple[Tensor, Tensor, int]:
    """float64 contiguous CPU inputs (``emissions`` and ``probs = exp(emissions - shift)`` ``[B, T, C]``,
    ``shift`` ``[B, T]`` the row maxima, int64 ``lengths``; state ``s`` of ``start [S]`` scores column
    ``columns[s]``, None: ``C = S`` and the identity) -> log Z ``[B]``, rescaled alphas ``[B, T, S]``
    (dropped values negated), and 0 (not certified), 1 (certified) or 2 (certified if
    :func:`fb_backward`'s error bound is small enough)."""
    batch, steps = probs.shape[:2]
    size = start.shape[0]
    log_z = probs.new_empty(batch)
    alphas = probs.new_empty(batch, steps, size)
    ok = _library.fb_forward(batch, steps, size, *_columns(probs.shape[-1], columns), start.data_ptr(),
                             transitions.data_ptr(), end.data_ptr(), emissions.data_ptr(), probs.data_ptr(),
                             shift.data_ptr(), lengths.data_ptr(), tiny, log_z.data_ptr(), alphas.data_ptr())
    return log_z, alphas, int(ok)


def fb_backward(transitions: Tensor, end: Tensor, emissions: Tensor, probs: Tensor, shift: Tensor, lengths: Tensor,
                alphas: Tensor, tiny: float, floor: float, grad: Tensor | None = None, columns: Tensor | None = None
                ) -> tuple[Tensor, ...]:
    """The backward pass (float64, inputs as :func:`fb_forward`'s). With ``grad`` ``[B]``: the
    gradients of ``sum_b grad[b] log Z[b]`` for start ``[S]``, transitions ``[S, S]``, end ``[S]`` and
    the states' emissions ``[B, T, S]`` (:func:`fold` adds them into columns); without, per row:
    node marginals ``[B, T, S]`` and edge marginals summed over the positions ``[B, S, S]``. Then the
    bound on the relative error of ``Z`` from dropped values ``[B]``, and whether it is certified."""
    batch, steps, size = alphas.shape
    rows = 1 if grad is not None else batch
    out = torch.zeros(2 * size + rows * size * size + batch * steps * size + batch, dtype=torch.float64)
    g_start, g_end, g_moves, g_em, error = out.split([size, size, rows * size * size, batch * steps * size, batch])
    ok = _library.fb_backward(batch, steps, size, *_columns(probs.shape[-1], columns), transitions.data_ptr(),
                              end.data_ptr(), emissions.data_ptr(), probs.data_ptr(), shift.data_ptr(),
                              lengths.data_ptr(), alphas.data_ptr(), None if grad is None else grad.data_ptr(), tiny,
                              floor, g_start.data_ptr(), g_moves.data_ptr(), g_end.data_ptr(), g_em.data_ptr(),
                              error.data_ptr())
    g_em = g_em.view(batch, steps, size)
    if grad is None:
        return g_em, g_moves.view(batch, size, size), error, bool(ok)
    return g_start, g_moves.view(size, size), g_end, g_em, error, bool(ok)


def fold(marginals: Tensor, dtype: torch.dtype, num_columns: int, columns: Tensor | None = None,
         weights: Tensor | None = None) -> Tensor:
    """float64 contiguous ``marginals [B, T, S]`` -> ``[B, T, C]`` in ``dtype`` (float32 or float64):
    each state's value added into its column ``columns[s]`` (None: ``C = S``, a conversion), times
    ``weights[b]`` (float64 ``[B]``) for row ``b`` when given."""
    batch, steps, size = marginals.shape
    out = torch.empty(batch, steps, num_columns, dtype=dtype)
    _typed("fold", dtype)(batch, steps, size, *_columns(num_columns, columns), marginals.data_ptr(),
                          None if weights is None else weights.data_ptr(), out.data_ptr())
    return out


def _typed(name: str, dtype: torch.dtype):
    if dtype == torch.float64:
        return getattr(_library, f"{name}_f64")
    if dtype == torch.float32:
        return getattr(_library, f"{name}_f32")
    raise ValueError(f"the compiled kernel takes float32 or float64, got {dtype}")


def gold_score(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, states: Tensor, lengths: Tensor,
               columns: Tensor | None = None) -> Tensor:
    """Contiguous CPU inputs of one float dtype (``emissions [B, T, C]``: state ``s`` scores column
    ``columns[s]``, None: ``C = S``), int64 ``states [B, T]`` and ``lengths`` -> ``[B]`` scores of the paths."""
    batch, steps = states.shape
    size = start.shape[0]
    out = emissions.new_empty(batch)
    ok = _typed("gold", emissions.dtype)(batch, steps, size, *_columns(emissions.shape[-1], columns), start.data_ptr(),
                                         transitions.data_ptr(), end.data_ptr(), emissions.data_ptr(),
                                         states.data_ptr(), lengths.data_ptr(), out.data_ptr())
    if not ok:
        raise IndexError(f"a state id outside [0, {size}) inside a row's length")
    return out


def gold_backward(states: Tensor, lengths: Tensor, grad: Tensor, size: int, num_columns: int,
                  columns: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients of ``sum_b grad[b] * score[b]``: start ``[S]``, transitions ``[S, S]``, end ``[S]``,
    emissions ``[B, T, C]`` (``size``: ``S``; ``num_columns``: ``C``)."""
    batch, steps = states.shape
    grads = grad.new_zeros(size * (size + 2) + batch * steps * num_columns)
    g_start, g_moves, g_end, g_em = grads.split([size, size * size, size, batch * steps * num_columns])
    _typed("gold_backward", grad.dtype)(batch, steps, size, *_columns(num_columns, columns),
                                        states.data_ptr(), lengths.data_ptr(), grad.data_ptr(), g_start.data_ptr(),
                                        g_moves.data_ptr(), g_end.data_ptr(), g_em.data_ptr())
    return g_start, g_moves.view(size, size), g_end, g_em.view(batch, steps, num_columns)


def viterbi(start: Tensor, transitions: Tensor, end: Tensor, emissions: Tensor, lengths: Tensor,
            columns: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Contiguous CPU inputs (float32 or float64, ``emissions [B, T, C]``: state ``s`` scores column
    ``columns[s]``, None: ``C = S``; int64 ``lengths``) -> states ``[B, T]`` (-1 past each length and
    in rows without a path), best scores ``[B]``."""
    batch, steps = emissions.shape[:2]
    function = _typed("viterbi", emissions.dtype)
    states = torch.empty(batch, steps, dtype=torch.long)
    best = emissions.new_empty(batch)
    function(batch, steps, start.shape[0], *_columns(emissions.shape[-1], columns), start.data_ptr(),
             transitions.data_ptr(), end.data_ptr(), emissions.data_ptr(), lengths.data_ptr(), states.data_ptr(),
             best.data_ptr())
    return states, best
