"""The one conversion to plain values: what the checkpoints, encoders, data modules and entry
points all use for configs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from neurocrf.values import to_plain


def test_configs_become_resolved_plain_values() -> None:
    config = OmegaConf.create({"a": [1, 2], "b": {"c": "${a}"}})
    assert to_plain(config) == {"a": [1, 2], "b": {"c": [1, 2]}}
    assert to_plain(OmegaConf.create([{"x": "${oc.env:NO_SUCH_VARIABLE,7}"}])) == [{"x": "7"}]
    converted = to_plain({"p": Path("/x"), "t": (1, 2), "n": torch.tensor(3.5), "i": np.int64(4)})
    assert converted == {"p": "/x", "t": [1, 2], "n": 3.5, "i": 4} and type(converted["i"]) is int
    assert to_plain(None) is None and to_plain("s") == "s"


def test_an_interpolation_that_cannot_be_resolved_stays_as_written() -> None:
    """A key or resolver that does not exist here (``${hydra:...}`` outside a Hydra run): the
    config is kept unresolved."""
    for missing in ("${paths.nowhere}/x", "${no_such_resolver:x}/x"):
        config = OmegaConf.create({"out": missing, "n": 1})
        assert to_plain(config) == {"out": missing, "n": 1}


def test_what_is_not_a_plain_value_is_named_where_it_sits() -> None:
    with pytest.raises(TypeError, match=r"encoder\.layers\[1\]: Linear is not a plain value"):
        to_plain({"layers": [1, torch.nn.Linear(1, 1)]}, "encoder")
    with pytest.raises(TypeError, match="value: key 1 is not a string"):
        to_plain({1: "x"})
    with pytest.raises(TypeError, match="set is not a plain value"):
        to_plain({"s": {1}})
