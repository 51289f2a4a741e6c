"""neurocrf: neural sequence labeling with exact, batched CRF output layers."""

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "LinearChainCRF": "neurocrf.structs",
    "SecondOrderCRF": "neurocrf.structs",
    "PrecursorInducedCRF": "neurocrf.structs",
    "allowed_transitions": "neurocrf.structs",
    "Tagger": "neurocrf.models",
    "PredictOptions": "neurocrf.models",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    # Lazy so that `import neurocrf` stays cheap and the floors do not import each other eagerly.
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'neurocrf' has no attribute {name!r}")
