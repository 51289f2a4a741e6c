"""Plain values: the one conversion of configs (OmegaConf containers, tuples, paths, scalars) to
dicts, lists, strings, numbers, booleans and None.

Checkpoints hold their hyperparameters as plain values, so that they load with
``torch.load(path, weights_only=True)``; data modules, encoders and the entry points take Hydra
configs and turn them into plain values here. Below every floor of the package: it imports nothing
of neurocrf.

>>> from omegaconf import OmegaConf
>>> to_plain(OmegaConf.create({"columns": [0, 1], "path": "${root}/x", "root": "/data"}))
{'columns': [0, 1], 'path': '/data/x', 'root': '/data'}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any


def to_plain(value: Any, where: str = "value") -> Any:
    """A copy of ``value`` made of dicts (str keys), lists, str, int, float, bool and None only.

    OmegaConf containers are resolved (left unresolved as a whole when some interpolation cannot
    be, e.g. ``${hydra:...}`` outside a Hydra run); tuples become lists, paths strings, numpy and
    torch scalars numbers. Anything else raises TypeError naming where it sits (``where``, then
    the keys and indices below it), because it would break ``weights_only`` checkpoint loading.
    """
    value = _container(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is not a string")
            out[key] = to_plain(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:  # numpy / torch scalar
        return value.item()
    raise TypeError(f"{where}: {type(value).__name__} is not a plain value (dict, list, str, number)")


def plain_values(**named: Any) -> dict[str, Any]:
    """Each keyword argument as a plain value (:func:`to_plain`, errors naming the argument): the
    hyperparameters a model saves in its checkpoints.

    >>> plain_values(tags=("O", "B-PER"), scheduler=None)
    {'tags': ['O', 'B-PER'], 'scheduler': None}
    """
    return {name: to_plain(value, name) for name, value in named.items()}


def _container(value: Any) -> Any:
    """An OmegaConf container as python containers (resolved if possible); anything else as is."""
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return value
    if not OmegaConf.is_config(value):
        return value
    try:
        return OmegaConf.to_container(value, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation that cannot be resolved here
        return OmegaConf.to_container(value, resolve=False)
