"""Where the Hydra configs are: in order, ``$NEUROCRF_CONFIGS``; ``configs/`` of the repository
this package sits in (``Path(__file__).parents[2]``, also true for an editable install);
``configs/`` in the working directory; the copy installed inside the package (``neurocrf/configs``,
for a non-editable install)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

CONFIGS_ENV = "NEUROCRF_CONFIGS"
PACKAGED_CONFIGS = Path(__file__).parents[1] / "configs"  # installed copy (a link in the repository)


def config_dir() -> str:
    """Absolute path of the Hydra config directory (see the module docstring)."""
    override = os.environ.get(CONFIGS_ENV)
    if override:
        return str(Path(override).expanduser().resolve())
    candidates = [Path(__file__).resolve().parents[2] / "configs", Path.cwd() / "configs", PACKAGED_CONFIGS]
    for candidate in candidates:
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    # Hydra reports a missing primary config directory itself; name the fix here.
    log.warning("no neurocrf configs found in %s; set %s", [str(c) for c in candidates], CONFIGS_ENV)
    return str(candidates[0])


CONFIG_DIR = config_dir()
