"""Builds the compiled CRF kernel (neurocrf/structs/engine/compiled/kernel.c) at install time.

The kernel is a plain C shared library loaded with ctypes (no Python extension module, no torch
headers). ``pip install .`` and ``pip install -e .`` compile it next to its loader under the name
the loader looks for (a digest of the source, so a stale build is never loaded). Without a C
compiler the install still succeeds (``optional=True``): the loader then builds the library at
first use if a compiler appears later, and ``backend="auto"`` runs the torch backend until then.
Everything else is in pyproject.toml.
"""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

PACKAGE = "neurocrf.structs.engine.compiled"
SOURCE = Path("neurocrf/structs/engine/compiled/kernel.c")


def library_name() -> str:
    """The file name :func:`neurocrf.structs.engine.compiled.kernel.library_name` expects."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return f"first_order_kernel_{digest}{sysconfig.get_config_var('SHLIB_SUFFIX') or '.so'}"


class BuildKernel(build_ext):
    """Builds the kernel as a plain shared library under :func:`library_name`."""

    def get_ext_filename(self, fullname: str) -> str:
        # called with the full dotted name or its last part (setuptools adds the package folder)
        if fullname == f"{PACKAGE}.kernel_library":
            return str(Path(*PACKAGE.split(".")) / library_name())
        if fullname == "kernel_library":
            return library_name()
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # no PyInit_ function: ctypes loads it, Python never imports it


setup(
    ext_modules=[Extension(f"{PACKAGE}.kernel_library", sources=[str(SOURCE)], libraries=["m"],
                           extra_compile_args=["-O3", "-std=c99"], optional=True)],
    cmdclass={"build_ext": BuildKernel},
)
