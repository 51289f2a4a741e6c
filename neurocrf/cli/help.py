"""``neurocrf-<tool> --help``: the tool's own options with their documentation, the config groups
it uses, example command lines, where its run folder goes and its exit statuses.

The documentation is that of the tool's primary config (``configs/<tool>.yaml``), read off its
comments: the comment block at the top (what the tool does, then the example command lines,
indented), and for each option the comment lines right above it or the comment at the end of its
line. ``configs/hydra/default.yaml`` sets ``hydra.help.template`` to the resolver
``${neurocrf_help:}`` that writes the page, so Hydra's own ``--help`` shows it, with the values
the command line gives.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from neurocrf.cli.configs import CONFIG_DIR

RESOLVER = "neurocrf_help"
INFRASTRUCTURE_GROUPS = ("hydra",)  # Hydra's own groups: --hydra-help lists them
EXIT_STATUSES = """\
Exit status: 0 done; 2 a user error (a bad or missing option, file, input or checkpoint), reported
in one line 'neurocrf-<tool>: error: <file>:<line>: <problem>' (HYDRA_FULL_ERROR=1 adds the
traceback); 1 an internal error, with its traceback; 130 stopped by SIGINT (Ctrl-C), 143 by
SIGTERM."""

RUN_FOLDER = """\
Run folder: <paths.log_dir>/<task>/runs/<date and time>, paths.log_dir being <paths.root_dir>/logs;
generated data (the sample corpus) in <paths.root_dir>/data_cache. paths.root_dir=<folder> on the
command line, or the environment variable NEUROCRF_HOME=<folder>, moves both."""

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<doc>.*))?$")


@dataclass(frozen=True)
class Option:
    """One option of a config file: its dotted key, its value as written, its documentation."""

    key: str
    value: str
    doc: str


def read_options(text: str) -> list[Option]:
    """The options of a YAML config with the comments that document them (module docstring);
    mappings are not options themselves, their keys are (dotted).

    >>> text = "defaults:\\n  - _self_\\n# a file\\ninput: ???\\nk: 10  # supertags per token\\n"
    >>> text += "data:\\n  # sentences per batch\\n  batch_size: 32\\n"
    >>> for option in read_options(text):
    ...     print(option)
    Option(key='input', value='???', doc='a file')
    Option(key='k', value='10', doc='supertags per token')
    Option(key='data.batch_size', value='32', doc='sentences per batch')
    """
    options: list[Option] = []
    comments: list[str] = []
    parents: list[tuple[int, str]] = []  # (indent, key) of the mappings the line is in
    in_defaults = False
    paragraph = ""  # the documented key that keys without a comment of their own go with
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("# @package"):
            comments, paragraph = [], ""
            continue
        if stripped.startswith("#"):
            comments.append(stripped.lstrip("#").strip())
            continue
        if stripped.startswith("-"):  # a list item: the defaults list, or a list value
            comments = []
            continue
        match = _KEY.match(line)
        if match is None:
            comments = []
            continue
        indent, key, value = len(match["indent"]), match["key"], match["value"].strip()
        if indent == 0:
            in_defaults = key == "defaults"
        parents = [(i, k) for i, k in parents if i < indent]
        dotted = ".".join([k for _, k in parents] + [key])
        doc = " ".join([*comments, match["doc"] or ""]).strip()
        if comments:
            paragraph = dotted
        elif not doc and paragraph:
            doc = f"(see {paragraph})"
        comments = []
        if in_defaults or dotted == "task_name":
            continue
        if value:
            options.append(Option(dotted, value, doc))
        else:
            parents.append((indent, key))
    return options


def read_header(text: str) -> tuple[str, list[str]]:
    """The top comment block of a config: its description and its example command lines (the
    indented lines of the block).

    >>> read_header("# Tag a file.\\n#   neurocrf-predict input=a.txt\\n# a note\\ndefaults:\\n")
    ('Tag a file.', ['neurocrf-predict input=a.txt'])
    """
    description: list[str] = []
    examples: list[str] = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line[1:]
        if body.strip().startswith("@package"):
            continue
        if body.startswith("   ") and body.strip():
            examples.append(body.strip())
        elif examples:  # the block's notes after the examples are not the tool's description
            break
        elif body.strip():
            description.append(body.strip())
    return " ".join(description), examples


def _value(root: DictConfig | None, option: Option) -> str:
    if root is None:
        return option.value
    try:
        value = OmegaConf.select(root, option.key, default=option.value, throw_on_missing=False)
    except Exception:  # noqa: BLE001 - an interpolation that resolves only in a run: show it as written
        return option.value
    if value is None:
        return "null"
    if isinstance(value, DictConfig) or OmegaConf.is_config(value):
        return str(OmegaConf.to_container(value, resolve=False))
    return str(value)


def _groups(root: DictConfig | None, config_dir: Path) -> list[str]:
    if root is None:
        return []
    choices = OmegaConf.select(root, "hydra.runtime.choices", default=None) or {}
    lines = []
    for group, choice in sorted(choices.items()):
        if group.split("/")[0] in INFRASTRUCTURE_GROUPS:
            continue
        available = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
        lines.append(f"  {group}={choice}  (one of: {', '.join(available)})")
    return lines


def tool_help(name: str, root: DictConfig | None = None, config_dir: str | Path | None = None) -> str:
    """The ``--help`` page of the tool whose primary config is ``configs/<name>.yaml``; ``root``:
    the composed config (current values and groups), None for the values as written;
    ``config_dir``: None for :data:`neurocrf.cli.configs.CONFIG_DIR`."""
    if config_dir is None:
        config_dir = CONFIG_DIR
    folder = Path(config_dir)
    text = (folder / f"{name}.yaml").read_text(encoding="utf-8")
    prog = f"neurocrf-{name.replace('_', '-')}" if name != "supertag" else "neurocrf-supertag"
    description, examples = read_header(text)
    wrap = textwrap.TextWrapper(width=100, initial_indent="      ", subsequent_indent="      ")
    lines = [f"{prog}: {description}", "", f"usage: {prog} [key=value ...] [group=option ...]"
             f" [--cfg job] [--help] [--hydra-help]", "", "examples:"]
    lines += [f"  {example}" for example in examples] or ["  (none)"]
    lines += ["", "options (key=value; the current value, then what it does):"]
    for option in read_options(text):
        lines.append(f"  {option.key}={_value(root, option)}")
        if option.doc:
            lines.append(wrap.fill(option.doc))
    groups = _groups(root, folder)
    if groups:
        lines += ["", "config groups (group=option; then their keys as group.key=value, e.g. trainer.max_epochs=3):",
                  *groups]
    lines += ["", RUN_FOLDER, "", EXIT_STATUSES]
    return "\n".join(lines).replace("$", "$$") + "\n"  # Hydra's template substitutes $NAMES


def _resolve(*, _root_: DictConfig) -> str:
    name = OmegaConf.select(_root_, "hydra.job.config_name", default=None)
    return tool_help(str(name), _root_)


def register() -> None:
    """Make ``${neurocrf_help:}`` available to the configs (idempotent)."""
    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, _resolve)

