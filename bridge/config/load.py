"""Reading the configuration file: YAML parsing, then `validate`.

Every way the file can be wrong, from "does not exist" through YAML syntax to a bad value,
ends in a `ConfigError` carrying `Problem`s, so the CLI has one thing to catch and print.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import yaml

from bridge.config.model import BridgeConfig

# parse_duration lives with the schema (it defines the `duration` type validate.py checks) and is
# re-exported here as part of the loading API.
from bridge.config.schema import parse_duration
from bridge.config.validate import ConfigError, Problem, validate

__all__ = ["ConfigError", "Problem", "load_config", "parse_duration"]


def load_config(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> tuple[BridgeConfig, list[Problem]]:
    """Read, parse and validate the configuration file at `path`.

    Given the file and the environment for `${VAR}` expansion (default: `os.environ`).
    Returns the configuration and its warnings. Raises ConfigError when the file is missing or
    unreadable (Problem path: the file), is not valid YAML (path: `<file>:line:col`) or does not
    validate (path: the key, e.g. `routes[2].database`); the error carries every problem found.
    """
    source = os.fspath(path)
    text = _read(source)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(source, exc)]) from None
    config, problems = validate(raw, os.environ if environ is None else environ, source)
    if config is None:
        raise ConfigError(problems)
    return config, [problem for problem in problems if problem.severity == "warning"]


def _read(source: str) -> str:
    """The text of the file; raises ConfigError saying why it cannot be read."""
    try:
        with open(source, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        message = "configuration file not found"
    except IsADirectoryError:
        message = "is a directory, not a configuration file"
    except PermissionError:
        message = "cannot read the configuration file: permission denied"
    except UnicodeDecodeError as exc:
        message = f"the configuration file is not valid UTF-8 (byte {exc.start})"
    except OSError as exc:
        message = f"cannot read the configuration file: {exc.strerror or exc}"
    raise ConfigError([Problem(source, message)]) from None


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
