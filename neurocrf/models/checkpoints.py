"""Reading neurocrf checkpoints: the one place that opens a checkpoint file.

A checkpoint is a PyTorch zip archive holding plain values (tensors, dicts, lists, strings,
numbers), written by Lightning during ``neurocrf-train`` (a :class:`~neurocrf.models.tagger.Tagger`)
or ``neurocrf-supertag`` (a :class:`~neurocrf.supertagging.supertagger.Supertagger`). It is read with
``torch.load(weights_only=True)``, which never runs code from the file; a file that needs more
(pickled Python objects) is refused, whoever wrote it.

Every problem raises :class:`CheckpointError` with the file and what is wrong: an empty file, a
truncated archive, a file that is not a checkpoint, a checkpoint of the other model kind, or
weights that do not fit the model its hyperparameters describe::

    checkpoint = read_checkpoint("last.ckpt", TAGGER)         # the dict, kind checked
    model = load_module(Tagger, "last.ckpt", TAGGER)          # the model, in eval mode

:class:`Checkpointed` is what the two models share about their checkpoints, a mixin of their
LightningModules: ``Model.load(path)`` (:func:`load_module` for the class's kind), and the best dev
score so far, kept in the checkpoint beside the weights so that a resumed run compares its new
epochs with the earlier ones::

    class Tagger(Checkpointed, pl.LightningModule):
        checkpoint_kind = TAGGER       # what Tagger.load accepts
        best_metric = "val/f1"         # logged as val/f1_best, saved as checkpoint["neurocrf"]["val_f1_best"]
        ...
        def on_validation_epoch_end(self):
            ...
            self.track_best(f1)
"""

from __future__ import annotations

import inspect
import os
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytorch_lightning as pl
import torch

TAGGER = "tagger"
SUPERTAGGER = "supertagger"

# kind -> (hyperparameters that identify it, the entry point that writes it)
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    TAGGER: (("tags", "scheme", "head"), "neurocrf-train"),
    SUPERTAGGER: (("supertags", "preterminals", "roots"), "neurocrf-supertag"),
}
_ZIP_MAGIC = b"PK\x03\x04"

ModuleT = TypeVar("ModuleT", bound=pl.LightningModule)
ModelT = TypeVar("ModelT", bound="Checkpointed")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message starts with the file's path."""


def read_checkpoint(
    path: str | os.PathLike[str], kind: str | None = None, map_location: Any = "cpu"
) -> dict[str, Any]:
    """The checkpoint dict of ``path``, loaded with ``weights_only=True``.

    Args:
        path: the checkpoint file.
        kind: :data:`TAGGER` or :data:`SUPERTAGGER` to require that kind; None accepts either.
        map_location: as for ``torch.load``.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: naming the file and the problem (see the module docstring).
    """
    name = os.fspath(path)
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    file = Path(name)
    if not file.exists():
        raise FileNotFoundError(f"checkpoint file not found: {name}")
    if file.is_dir():
        raise CheckpointError(f"{name}: a folder, not a checkpoint file")
    size = file.stat().st_size
    if size == 0:
        raise CheckpointError(f"{name}: empty file (0 bytes), not a checkpoint (cut off while being written?)")
    with open(file, "rb") as handle:
        head = handle.read(len(_ZIP_MAGIC))
    if head != _ZIP_MAGIC:
        raise CheckpointError(f"{name}: not a checkpoint (not a PyTorch zip archive; it starts with {head!r})")
    if not zipfile.is_zipfile(file):
        raise CheckpointError(
            f"{name}: truncated or damaged checkpoint ({size} bytes, the end of the zip archive is"
            " missing: cut off while being written or copied?)"
        )
    try:
        checkpoint = torch.load(file, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(f"{name}: not a neurocrf checkpoint: {_refused_content(error)}") from None
    except (RuntimeError, OSError, EOFError, KeyError, ValueError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise CheckpointError(f"{name}: damaged or not a PyTorch checkpoint ({reason[:200]})") from None
    found = checkpoint_kind(checkpoint, name)
    if kind is not None and found != kind:
        raise CheckpointError(
            f"{name}: a {found} checkpoint (written by {KINDS[found][1]}), but a {kind} checkpoint"
            f" (written by {KINDS[kind][1]}) is needed here: neurocrf-predict, neurocrf-evaluate and"
            " neurocrf-export take tagger checkpoints, neurocrf-parse and neurocrf-supertag take"
            " supertagger ones"
        )
    return checkpoint


def checkpoint_kind(checkpoint: Any, name: str = "checkpoint") -> str:
    """:data:`TAGGER` or :data:`SUPERTAGGER`, read off the hyperparameters of a loaded checkpoint.

    Raises:
        CheckpointError: naming ``name`` when ``checkpoint`` is not a neurocrf checkpoint (not a
            dict, no weights, no hyperparameters, or hyperparameters of neither kind).
    """
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"{name}: not a neurocrf checkpoint: it holds a {type(checkpoint).__name__}, not a dict"
            " with state_dict and hyper_parameters"
        )
    missing = [key for key in ("state_dict", "hyper_parameters") if not isinstance(checkpoint.get(key), dict)]
    if missing:
        hint = " (a bare state dict?)" if "state_dict" not in checkpoint else ""
        raise CheckpointError(
            f"{name}: not a neurocrf checkpoint: no {' and no '.join(missing)}{hint}; neurocrf"
            " checkpoints are written by neurocrf-train and neurocrf-supertag"
        )
    hparams = checkpoint["hyper_parameters"]
    for kind, (keys, _) in KINDS.items():
        if all(key in hparams for key in keys):
            return kind
    raise CheckpointError(
        f"{name}: not a neurocrf checkpoint: its hyper_parameters ({', '.join(sorted(hparams)[:10])})"
        " describe neither a tagger nor a supertagger"
    )


def load_module(
    cls: type[ModuleT], path: str | os.PathLike[str], kind: str, map_location: Any = "cpu"
) -> ModuleT:
    """``cls`` rebuilt from the checkpoint at ``path`` (of ``kind``): hyperparameters, then the
    weights (strictly), in eval mode, on the device the weights were mapped to.

    The model's constructor gets ``restore=True`` (no pretrained weights or vectors are read: the
    checkpoint holds them). Raises :class:`CheckpointError` as :func:`read_checkpoint` does, and
    naming the file when the hyperparameters or weights do not build the model.
    """
    name = os.fspath(path)
    checkpoint = read_checkpoint(name, kind, map_location)
    accepted = inspect.signature(cls.__init__).parameters
    kwargs = {key: value for key, value in checkpoint["hyper_parameters"].items() if key in accepted}
    try:
        model = cls(**kwargs, restore=True)
    except (TypeError, ValueError, KeyError) as error:
        raise CheckpointError(f"{name}: its hyperparameters do not build a {cls.__name__}: {error}") from None
    model.on_load_checkpoint(checkpoint)
    try:
        model.load_state_dict(checkpoint["state_dict"], strict=True)
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:400]
        raise CheckpointError(f"{name}: its weights do not fit the model it describes: {detail}") from None
    device = next((t.device for t in checkpoint["state_dict"].values() if isinstance(t, torch.Tensor)), None)
    if device is not None:
        model = model.to(device)
    model.eval()
    return model


def _refused_content(error: pickle.UnpicklingError) -> str:
    """What the weights-only unpickler refused, without torch's advice to load unsafely."""
    message = str(error)
    match = re.search(r"Unsupported global: GLOBAL (\S+?)(?: was|\s|$)", message)
    if match:
        return (
            f"it holds a pickled Python object ({match.group(1)}) instead of plain values, and"
            " loading it could run code from the file, so it is refused"
        )
    return "its content is not plain values (tensors, dicts, lists, strings, numbers), so it is refused"


class Checkpointed:
    """Mixin of the trained models: :meth:`load` a checkpoint of ``checkpoint_kind``, and keep the
    best value of ``best_metric`` over the validation epochs (sanity checks excluded), logged as
    ``<best_metric>_best`` and saved in the checkpoint.

    >>> class Model(Checkpointed):
    ...     best_metric = "val/supertag_acc"
    >>> checkpoint = {}
    >>> model = Model()
    >>> model.best_score = 0.9
    >>> model.on_save_checkpoint(checkpoint)
    >>> checkpoint
    {'neurocrf': {'val_supertag_acc_best': 0.9}}
    """

    checkpoint_kind: ClassVar[str]  # TAGGER or SUPERTAGGER (neurocrf.models.checkpoints)
    best_metric: ClassVar[str] = "val/f1"
    best_score: float = 0.0

    @classmethod
    def load(cls: type[ModelT], path: str | os.PathLike[str], map_location: Any = "cpu") -> ModelT:
        """A trained model from a checkpoint of its kind (weights only), in eval mode. A file that
        is none raises :class:`~neurocrf.models.checkpoints.CheckpointError` naming it and the
        problem (empty, truncated, not a checkpoint, a checkpoint of the other model kind, ...)."""
        return load_module(cls, path, cls.checkpoint_kind, map_location)  # type: ignore[type-var]

    @classmethod
    def best_key(cls) -> str:
        """The checkpoint key of the best score: ``val/f1`` -> ``val_f1_best``."""
        return f"{cls.best_metric.replace('/', '_')}_best"

    def track_best(self, value: float) -> None:
        """Take this validation epoch's ``best_metric`` ``value`` into the best so far (not during
        the sanity check) and log the best as ``<best_metric>_best``."""
        if not self.trainer.sanity_checking:
            self.best_score = max(self.best_score, float(value))
        self.log(f"{self.best_metric}_best", self.best_score, sync_dist=True, prog_bar=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint.setdefault("neurocrf", {})[self.best_key()] = float(self.best_score)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.best_score = float(checkpoint.get("neurocrf", {}).get(self.best_key(), 0.0))
