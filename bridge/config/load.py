"""Reading the configuration file: YAML parsing, then `validate`.

Every way the file can be wrong, from "does not exist" through YAML syntax to a bad value,
ends in a `ConfigError` carrying `Problem`s, so the CLI has one thing to catch and print.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import yaml

from bridge.config.model import BridgeConfig
from bridge.config.problems import Problem
from bridge.config.validate import validate
from bridge.exceptions import MISSING_FILE, ConfigError

__all__ = ["DEFAULT_CONFIG", "load_config", "load_config_text"]

# Where `sfbridge` looks for its configuration when neither -c nor $SFBRIDGE_CONFIG says.
DEFAULT_CONFIG = "/etc/sfbridge/sfbridge.yaml"
MISSING_FILE_ADVICE = (
    "point at one with -c FILE (before or after the command) or SFBRIDGE_CONFIG=FILE "
    f"(default {DEFAULT_CONFIG}); `sfbridge demo` needs none"
)


def load_config(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> tuple[BridgeConfig, list[Problem]]:
    """Read, parse and validate the configuration file at `path`.

    Given the file and the environment for `${VAR}` expansion (default: `os.environ`).
    Returns the configuration and its warnings. Raises ConfigError when the file is missing or
    unreadable (Problem path: the file), is not valid YAML or repeats a key within one mapping
    (path: `<file>:line:col`) or does not validate (path: the key, e.g. `routes[2].database`);
    the error carries every problem found.
    """
    source = os.fspath(path)
    return load_config_text(_read(source), source, environ)


def load_config_text(
    text: str, source: str, environ: Mapping[str, str] | None = None
) -> tuple[BridgeConfig, list[Problem]]:
    """`load_config` of a file's text, read before: `source` names the file in problems and
    is the folder relative SQLite paths are resolved against (a Spark task gets the driver's
    YAML this way, and expands its `${VAR}` references from its own environment)."""
    loader = _StrictLoader(text)
    try:
        raw = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(source, exc)], source=source) from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise ConfigError(
            (_duplicate_problem(source, dup) for dup in sorted(loader.duplicates)), source=source
        )
    config, problems = validate(raw, os.environ if environ is None else environ, source)
    if config is None:
        raise ConfigError(problems, source=source)
    return config, [problem for problem in problems if problem.severity == "warning"]


def _read(source: str) -> str:
    """The text of the file; raises ConfigError saying why it cannot be read."""
    try:
        with open(source, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        raise ConfigError(
            [Problem(source, MISSING_FILE)], source=source, advice=MISSING_FILE_ADVICE
        ) from None
    except IsADirectoryError:
        message = "is a directory, not a configuration file"
    except PermissionError:
        message = "cannot read the configuration file: permission denied"
    except UnicodeDecodeError as exc:
        message = f"the configuration file is not valid UTF-8 (byte {exc.start})"
    except OSError as exc:
        message = f"cannot read the configuration file: {exc.strerror or exc}"
    raise ConfigError([Problem(source, message)], source=source) from None


def _yaml_problem(source: str, exc: yaml.YAMLError) -> Problem:
    """A Problem for a YAML syntax error, located at `<file>:line:col` when PyYAML knows where.

    Only PyYAML's description of the problem is used, never its echo of the offending line:
    that line may be a connection string with a password in it.
    """
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        parts = [part for part in (exc.context, exc.problem) if part]
        message = "invalid YAML: " + ", ".join(parts) if parts else "invalid YAML"
        if mark is not None:
            # PyYAML counts from 0; editors and compilers count from 1.
            return Problem(f"{source}:{mark.line + 1}:{mark.column + 1}", message)
        return Problem(source, message)
    return Problem(source, f"invalid YAML: {exc}")


# --------------------------------------------------------------------------------------------
# Duplicated keys
# --------------------------------------------------------------------------------------------

_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True, order=True)
class _Duplicate:
    """A key given again in the same mapping; lines and columns count from 0, as PyYAML's do."""

    line: int
    column: int
    first_line: int
    key_path: str


class _StrictLoader(yaml.SafeLoader):
    """`yaml.safe_load`'s loader, except that it records keys repeated within one mapping.

    YAML forbids duplicate keys, but PyYAML keeps the last one and drops the others without a
    word, so a second `routes:` block would silently replace the first. The constructors are
    SafeLoader's own: no tag can build anything but plain data.

    Each mapping and sequence node is given its key path (`forwarders[0].queue`) by its parent
    before it is constructed, so that a duplicate can be named the way validation names keys.
    The first path wins: a node reused through an alias is named where its anchor was written.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.duplicates: list[_Duplicate] = []
        self._paths: dict[yaml.Node, str] = {}

    def construct_mapping(
        self, node: yaml.MappingNode, deep: bool = False
    ) -> dict[Hashable, object]:
        if isinstance(node, yaml.MappingNode):
            self._check_keys(node)
        return super().construct_mapping(node, deep=deep)

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> list[object]:
        if isinstance(node, yaml.SequenceNode):
            base = self._paths.get(node, "")
            for index, item in enumerate(node.value):
                self._paths.setdefault(item, f"{base}[{index}]")
        return super().construct_sequence(node, deep=deep)

    def _check_keys(self, node: yaml.MappingNode) -> None:
        # Runs before SafeConstructor.construct_mapping flattens `<<` merge keys into the node:
        # an explicit key that overrides a merged one is what merge keys are for, not a mistake.
        base = self._paths.get(node, "")
        first: dict[Hashable, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first.get(key)
            except TypeError:
                continue  # unhashable: SafeConstructor reports it as a YAML error
            path = _key_path(base, key)
            self._paths.setdefault(value_node, path)
            if seen is None:
                first[key] = key_node.start_mark.line
            else:
                mark = key_node.start_mark
                self.duplicates.append(_Duplicate(mark.line, mark.column, seen, path))


def _key_path(base: str, key: object) -> str:
    """`base.key`, or `base["key"]` when the key is not a plain name, as validation writes it."""
    if isinstance(key, str) and _SIMPLE_NAME.fullmatch(key):
        return f"{base}.{key}" if base else key
    shown = json.dumps(key) if isinstance(key, str) else repr(key)
    return f"{base}[{shown}]"


def _duplicate_problem(source: str, duplicate: _Duplicate) -> Problem:
    """A Problem at `<file>:line:col` of the repeated key; never quotes a value (passwords)."""
    return Problem(
        f"{source}:{duplicate.line + 1}:{duplicate.column + 1}",
        f"duplicate key '{duplicate.key_path}' (first given on line {duplicate.first_line + 1}); "
        "YAML would keep only the last one and silently drop the others, so merge them into "
        "one or delete the extra",
    )
