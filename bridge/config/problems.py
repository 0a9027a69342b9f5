"""What configuration checking reports: `Problem`s, the `ConfigError` that carries them, and
the `ProblemLog` that validation appends them to.

No message ever contains a connection string or DSN value: such keys are marked `secret` in the
schema and their values are never echoed, and every `Problem` is passed through `mask_secrets`
as a second line of defence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from bridge.exceptions import ConfigError
from bridge.secrets import mask_secrets

__all__ = ["ConfigError", "Problem", "ProblemLog", "Severity"]

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration.

    `path` locates it: a key path such as `routes[2].database`, `<file>:line:col` for YAML
    syntax errors, the file name for unreadable files, or "" for the document as a whole.
    Secrets in `path` and `message` are masked on construction, so a Problem is always safe to
    print or log.
    """

    path: str
    message: str
    severity: Severity = "error"

    def __post_init__(self) -> None:
        # Frozen, so bypass __setattr__; masking here protects every producer of Problems,
        # including future ones that forget to mask.
        object.__setattr__(self, "path", mask_secrets(self.path))
        object.__setattr__(self, "message", mask_secrets(self.message))

    def __str__(self) -> str:
        prefix = f"{self.path}: " if self.path else ""
        label = "warning: " if self.severity == "warning" else ""
        return f"{prefix}{label}{self.message}"


@dataclass
class ProblemLog:
    """The problems found so far, in the order they were found; every check appends here."""

    problems: list[Problem] = field(default_factory=list)

    def error(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, "error"))

    def warning(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, "warning"))

    @property
    def has_errors(self) -> bool:
        return any(problem.severity == "error" for problem in self.problems)
