"""Sphinx configuration of the neurocrf documentation site.

Build (from the repository root, after ``pip install -e ".[docs]"``)::

    sphinx-build -W --keep-going -n -b html docs docs/_build/html

Nothing is fetched at build time (no intersphinx inventories) and no notebook is executed: the
notebooks are rendered from the outputs stored in them.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's package, also when another copy is installed

from sphinx.addnodes import pending_xref  # noqa: E402
from sphinx.ext.napoleon.docstring import GoogleDocstring  # noqa: E402
from sphinx.util.nodes import make_refnode  # noqa: E402

import neurocrf  # noqa: E402

project = "neurocrf"
author = "the neurocrf authors"
copyright = "the neurocrf authors"
release = version = neurocrf.__version__

extensions = [
    "myst_nb",  # MyST Markdown pages and notebooks (myst_nb loads myst_parser itself)
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
templates_path = ["_templates"]

# --- MyST and notebooks --------------------------------------------------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 4  # GitHub-style anchors, so links like results.md#a-heading work on the site too
nb_execution_mode = "off"  # render the stored outputs; the notebook tests run them
nb_merge_streams = True

# --- API reference -------------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = False  # each object is documented once, in the module that defines it


def shadowed_modules() -> dict[str, bool]:
    """Modules that their package's namespace hides behind another object of the same name.

    ``neurocrf.parsing.evaluate`` is a module and, on the package, the function it exports:
    autosummary takes the function, and ``_templates/autosummary/base.rst`` gives the name a module
    page. Where the package itself defines the other object (True: a function of the package's own
    ``__init__``), the module and that object share one full name; autosummary then leaves the
    module out, and :func:`write_hidden_module_pages` writes its page.
    """
    names = {}
    for info in pkgutil.walk_packages(neurocrf.__path__, "neurocrf."):
        parent, _, leaf = info.name.rpartition(".")
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional dependency (triton): autodoc mocks it
            continue
        shadow = getattr(importlib.import_module(parent), leaf, None)
        if not info.ispkg and shadow is not module:
            names[info.name] = getattr(shadow, "__module__", None) == parent
    return names


SHADOWED = shadowed_modules()
HIDDEN = sorted(name for name, same_name in SHADOWED.items() if same_name)


def write_hidden_module_pages(app) -> None:
    """The API pages of the modules in :data:`HIDDEN`: not indexed (the name is the package's
    function's), linked from their package's page."""
    folder = Path(app.srcdir) / "api" / "generated"
    folder.mkdir(parents=True, exist_ok=True)
    for name in HIDDEN:
        text = f"{name}\n{'=' * len(name)}\n\n.. automodule:: {name}\n   :no-index:\n"
        page = folder / f"{name}.rst"
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            page.write_text(text, encoding="utf-8")


autosummary_context = {"shadowed_modules": sorted(SHADOWED), "hidden_modules": HIDDEN}
# every public member of a module, whether its __all__ lists it or not (docstrings link to helpers);
# names a package re-exports are documented where they are defined, once
autodoc_default_options = {
    "members": True, "undoc-members": True, "ignore-module-all": True, "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_inherit_docstrings = False  # not Lightning's long docstrings under every hook we override
# the Triton kernels import triton at the top: without it (an optional dependency) they are
# documented from a stand-in module
autodoc_mock_imports = [] if importlib.util.find_spec("triton") else ["triton"]
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
python_maximum_signature_line_length = 88  # longer signatures get one parameter per line
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
napoleon_use_ivar = True  # an "Attributes:" section is a field list: autodoc documents the attributes themselves
napoleon_custom_sections = [("Inputs", "params_style"), ("Outputs", "returns_style")]
# names in docstrings written as |S| (the size of a state space) are text, not substitutions
rst_prolog = """
.. |S| unicode:: U+007C U+0053 U+007C
.. |S'| unicode:: U+007C U+0053 U+0027 U+007C
"""

# --- Warnings as errors, cross references nitpicky -----------------------------------------------
nitpicky = True
# Types of other libraries: without intersphinx inventories (no network at build time) they
# cannot resolve, so they are named but not linked.
nitpick_ignore_regex = [
    (r"py:.*", r"(collections|os|pathlib|types|typing|random|ctypes|io|argparse|logging|subprocess|json|gc"
               r"|threading|multiprocessing|concurrent|dataclasses|enum|abc|gzip|re|numbers)(\..*)?"),
    (r"py:.*", r"(torch|numpy|np|pytorch_lightning|lightning|lightning_fabric|transformers|omegaconf"
               r"|hydra|seqeval|triton|matplotlib|onnxruntime|tqdm)(\..*)?"),
]

# --- Short names in docstrings ------------------------------------------------------------------
# Napoleon reads the first line of a data or property docstring as "type: description"; ours are
# sentences ("The wildcard symbol: the token ..."), and their types come from the annotations.
GoogleDocstring._parse_attribute_docstring = lambda self: list(self._consume_to_end())


def find_object(target: str, module: str) -> object:
    """The Python object ``target`` names, absolute or relative to ``module`` and its packages."""
    parts = module.split(".") if module else []
    for depth in range(len(parts), -1, -1):
        name = ".".join([*parts[:depth], target])
        pieces = name.split(".")
        for split in range(len(pieces), 0, -1):
            try:
                found = importlib.import_module(".".join(pieces[:split]))
            except ImportError:
                continue
            try:
                for attribute in pieces[split:]:
                    found = getattr(found, attribute)
            except AttributeError:
                break
            return found
    return MISSING


MISSING = object()


def canonical_name(found: object) -> str | None:
    """Where autodoc documents ``found``: the module that defines it, not one that re-exports it."""
    if isinstance(found, type(sys)):
        return found.__name__
    module, qualname = getattr(found, "__module__", None), getattr(found, "__qualname__", None)
    return f"{module}.{qualname}" if module and qualname else None


def resolve_short_name(app, env, node, contnode):
    """Resolve a docstring's reference that Sphinx's own lookup misses.

    ``neurocrf.structs.LinearChainCRF`` (a package's re-export) links to where the class is
    documented; a short ``Name`` or ``Class.method`` from another module links to the one
    documented object whose full name ends with it (the nearest to the referring module if several
    do). A reference to something that exists but has no page of its own (a private helper, a
    TypeVar, an undocumented constant, a Triton kernel) is set as plain code. A reference to
    nothing at all stays a warning, so a renamed or removed name fails the build.
    """
    target = node["reftarget"].lstrip("~.")
    if node.get("refdomain") != "py" or hasattr(builtins, target):  # builtins: Sphinx's own resolver
        return None
    module = node.get("py:module") or ""
    domain = env.get_domain("py")
    found = MISSING
    if node.get("py:class"):  # a method of the class being documented, perhaps inherited
        found = find_object(f"{node['py:class']}.{target}", module)
    if found is MISSING:
        found = find_object(target, module)
    name = canonical_name(found) if found is not MISSING else None
    if name not in domain.objects:
        matches = [full for full in domain.objects if full == target or full.endswith("." + target)]
        scope = module
        while len(matches) > 1 and scope:
            near = [full for full in matches if full.startswith(scope + ".")]
            matches = near or matches
            scope = scope.rpartition(".")[0]
        name = matches[0] if len(matches) == 1 else None
    if name is None:
        return contnode if found is not MISSING else None
    entry = domain.objects[name]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)


def builtins_stay_builtins(app, doctree):
    """``type`` or ``str`` in a docstring's type field names the builtin, never one of our attributes
    that happens to be called ``type`` (Sphinx searches field types by suffix)."""
    for node in doctree.findall(pending_xref):
        if node.get("refdomain") == "py" and node.hasattr("refspecific") and hasattr(builtins, node["reftarget"]):
            del node["refspecific"]  # the domain searches by suffix whenever the attribute is there


def factory_defaults_parse(app, what, name, obj, options, signature, return_annotation):
    """A dataclass field's ``default_factory`` shows as ``<factory>``, which is not Python: Sphinx
    would then split the signature at every comma, brackets of ``dict[str, X]`` included."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), return_annotation
    return None


def setup(app):
    app.connect("builder-inited", write_hidden_module_pages, priority=100)  # before autosummary
    app.connect("autodoc-process-signature", factory_defaults_parse)
    app.connect("doctree-read", builtins_stay_builtins)
    app.connect("missing-reference", resolve_short_name)


# --- HTML ----------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"neurocrf {release}"
html_static_path: list[str] = []
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
