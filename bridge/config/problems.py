"""What configuration checking reports: `Problem`s and the `ConfigError` that carries them
(defined in `bridge.exceptions`, which may import nothing above it), and the `ProblemLog` that
validation appends them to.

No message ever contains a connection string or DSN value: such keys are marked `secret` in the
schema and their values are never echoed, and every `Problem` is passed through `mask_secrets`
as a second line of defence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bridge.exceptions import ConfigError, Problem, Severity

__all__ = ["ConfigError", "Problem", "ProblemLog", "Severity"]


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
