"""Config files: YAML, YAML-compatible with AReaL, parsed with a bound on alias expansion."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from prm_jax._validation import short_repr
from prm_jax.config._experiment import ExperimentConfig
from prm_jax.errors import ConfigFileError

MAX_YAML_NODES = 100_000


def _distinct_nodes(node: yaml.Node, seen: set[int]) -> int:
    """Nodes the document holds as written (a subtree an alias shares counted once)."""
    if id(node) in seen:
        return 0
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        return 1 + sum(_distinct_nodes(child, seen) for child in node.value)
    if isinstance(node, yaml.MappingNode):
        return 1 + sum(_distinct_nodes(k, seen) + _distinct_nodes(v, seen) for k, v in node.value)
    return 1


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes the document has once aliases are expanded (shared subtrees counted each time they appear)."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a recursive alias counts once
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    memo[id(node)] = size  # (a Python int: an alias bomb's astronomic count is cheap to add up)
    return memo[id(node)]


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader reading numbers as AReaL's configs are read (OmegaConf, YAML 1.2): ``1e-5`` and
    ``1E+3`` are floats, not the strings YAML 1.1 makes of an exponent without a dot."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?
                |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                |[-+]?\.(?:inf|Inf|INF)
                |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))
# The float resolver above also matches plain integers; YAML's own int resolver comes first for those.
_Loader.yaml_implicit_resolvers = {key: sorted(resolvers, key=lambda r: r[0] != "tag:yaml.org,2002:int")
                                   for key, resolvers in _Loader.yaml_implicit_resolvers.items()}


def parse_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` (numbers as AReaL reads them) that refuses documents whose aliases expand them by
    more than ``MAX_YAML_NODES`` nodes (nested-alias bombs; a long document as written is read as it is), or
    nested too deeply for the parser. Errors are ``ConfigFileError`` naming ``where``.

    Args:
        text: The YAML document.
        where: How errors name its source (a file name, ``<string>``).

    Example:
        >>> prm_jax.config.parse_yaml("actor: {kl_ctl: 0.0, gae_lambda: 1.0e-1}", "<string>")
        {'actor': {'kl_ctl': 0.0, 'gae_lambda': 0.1}}
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        added = _expanded_size(node, {}) - _distinct_nodes(node, set())
        if added > MAX_YAML_NODES:
            raise ConfigFileError(f"{where}: the YAML's aliases expand it by more than {MAX_YAML_NODES} nodes "
                                  "(nested aliases); refused")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise ConfigFileError(f"{where}: not valid YAML: {short_repr(str(err))}") from None
    except RecursionError:
        raise ConfigFileError(f"{where}: the YAML is nested too deeply") from None
    finally:
        loader.dispose()


def load_config(path: str | Path) -> ExperimentConfig:
    """Loads and validates a YAML config file; every error names the file (``ConfigFileError``, a
    ``ValueError``; ``OSError`` when it cannot be read).

    Args:
        path: The YAML file to read.

    Example:
        >>> import pathlib, tempfile
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "config.yaml"
        >>> _ = path.write_text("actor:\\n  kl_ctl: 0.0\\n  gae_lambda: 0.95\\n")
        >>> config = prm_jax.load_config(path)
        >>> config.actor.gae_lambda, config.actor.kl_ctl, config.prm.active
        (0.95, 0.0, False)
    """
    path = Path(path)
    data = parse_yaml(path.read_text(), str(path))
    if not isinstance(data, Mapping):
        raise ConfigFileError(f"{path}: the config must be a YAML mapping with 'rollout' and 'actor'")
    try:
        return ExperimentConfig.from_mapping(data)
    except (ValueError, TypeError) as err:
        raise ConfigFileError(f"{path}: {err}") from None
