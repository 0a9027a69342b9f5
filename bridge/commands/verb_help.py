"""Help that helps: a parser that answers a mistyped verb or option with the nearest it knows
(Python 3.11's argparse has no `suggest_on_error`), and the shape of each verb's `--help`
(its description, then its examples).

`bridge.commands.cli` builds every parser of `sfbridge` from this class, so a new verb gets
the suggestions without doing anything; its description and examples are fields of its row
in `VERBS`, which `tests/unit/commands/test_verb_help.py` holds every verb to.
"""

from __future__ import annotations

import argparse
import difflib
import re
import textwrap
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

EXAMPLES = "examples:"
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)'")


class HelpfulParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors suggest the nearest verb, choice or option.

    `verb_parsers` (on the top-level parser) maps each verb's name (`errors list`) to its
    parser: an option no parser took is reported by the verb's parser, with the verb's usage
    and its own options to suggest from.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)
        self.verb_parsers: dict[str, HelpfulParser] = {}

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self.verb_parsers.get(getattr(parsed, "verb", ""), self)
            parser.error(
                f"unrecognized arguments: {' '.join(extras)}{parser.suggest_options(extras)}"
            )
        return parsed

    def error(self, message: str) -> NoReturn:
        """Print the usage and `message`, with a suggestion where one is near; exit 2."""
        invalid = _INVALID_CHOICE.search(message)
        if invalid is not None:
            message += _suggestion(invalid.group(1), self._choices())
        super().error(message)

    def suggest_options(self, given: Iterable[str]) -> str:
        """ "; did you mean '--json'?" for the first unknown option that is near one of this
        parser's, else ""."""
        known = list(self._option_string_actions)
        for word in given:
            if word.startswith("-"):
                suggestion = _suggestion(word.split("=", 1)[0], known)
                if suggestion:
                    return suggestion
        return ""

    def _choices(self) -> list[str]:
        choices: list[str] = []
        for action in self._actions:
            if action.choices is not None:
                choices.extend(str(choice) for choice in action.choices)
        return choices


class _Formatter(argparse.HelpFormatter):
    """Wraps the description to the terminal, keeps the examples' lines as they are."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(EXAMPLES):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        # Not at hyphens: "in-flight" and option names stay whole.
        return textwrap.fill(
            " ".join(text.split()),
            width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
        )


def _suggestion(word: str, known: Sequence[str]) -> str:
    # 0.75: a slip of one or two letters ('stauts', '--forwader'), not another word that
    # shares a few ('--reason' is not '--json').
    near = difflib.get_close_matches(word, known, n=1, cutoff=0.75)
    return f"; did you mean '{near[0]}'?" if near else ""


def examples_epilog(examples: Sequence[str]) -> str:
    """The examples as the end of a verb's `--help`, one command (and its comment) a line."""
    return EXAMPLES + "\n" + "\n".join(f"  {example}" for example in examples)
