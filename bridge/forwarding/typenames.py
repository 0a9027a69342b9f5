""".NET type names, as they appear in `$.store-and-forward.eventtype` and
`NServiceBus.EnclosedMessageTypes`. Pure.

NServiceBus subscribes and publishes by topic = `Type.FullName`: the namespace-qualified name
without the assembly, `+` between nested types, and for closed generic types the type
arguments in brackets, each assembly-qualified:

    Shared.OrderSubmitted, Shared, Version=1.0.0.0, Culture=neutral, PublicKeyToken=null
    -> Shared.OrderSubmitted
    Shared.Outer+Inner, Shared                         -> Shared.Outer+Inner
    Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0]], Shared
    -> Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0]]

Backslash escapes (`\\,` `\\[` `\\]` `\\+` `\\\\`) keep special characters inside a name.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.exceptions import TypeNameError

SYSTEM_OBJECT = "System.Object"


@dataclass(frozen=True)
class TypeName:
    """A parsed type name: `full_name` is the topic, `assembly` the rest (or None)."""

    full_name: str
    assembly: str | None
    generic_arguments: tuple[TypeName, ...] = ()

    @property
    def assembly_qualified(self) -> str:
        return self.full_name if self.assembly is None else f"{self.full_name}, {self.assembly}"


def parse_type_name(text: str) -> TypeName:
    """Parse an assembly-qualified (or plain full) .NET type name. Raises TypeNameError."""
    parser = _Parser(text)
    name = parser.type_name(top_level=True)
    parser.expect_end()
    return name


def topics_for(event_type: str | None, enclosed_message_types: str | None) -> list[str]:
    """Every topic a published event is delivered under, most specific first, no duplicates.

    The event type itself, then every type in `NServiceBus.EnclosedMessageTypes` (which lists
    the message hierarchy: base classes and interfaces), then `System.Object`, which
    NServiceBus includes when it looks up subscribers. Raises TypeNameError when the event
    type cannot be parsed; unparseable entries of the enclosed types are skipped.
    """
    topics: list[str] = []
    if event_type is not None:
        topics.append(parse_type_name(event_type).full_name)
    for entry in split_enclosed_message_types(enclosed_message_types or ""):
        try:
            topics.append(parse_type_name(entry).full_name)
        except TypeNameError:
            continue
    topics.append(SYSTEM_OBJECT)
    return list(dict.fromkeys(topics))


def split_enclosed_message_types(text: str) -> list[str]:
    """Split the `;`-separated EnclosedMessageTypes header (`;` never appears in a type name)."""
    return [part.strip() for part in text.split(";") if part.strip()]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.position = 0

    def error(self, message: str) -> TypeNameError:
        return TypeNameError(f"{message} at position {self.position} in {self.text!r}")

    def peek(self) -> str:
        return self.text[self.position] if self.position < len(self.text) else ""

    def expect_end(self) -> None:
        if self.position != len(self.text):
            raise self.error("unexpected text")

    def type_name(self, *, top_level: bool, allow_assembly: bool = True) -> TypeName:
        """name [generic args] [, assembly] — the assembly runs to the closing bracket or end."""
        full_name = self.simple_name()
        arguments: tuple[TypeName, ...] = ()
        if self.peek() == "[":
            arguments, rendered = self.generic_arguments()
            full_name += rendered
        while self.peek() in ("*", "&") or self.text.startswith("[]", self.position):
            # Pointer, by-ref and array suffixes are part of the full name.
            step = 2 if self.peek() == "[" else 1
            full_name += self.text[self.position : self.position + step]
            self.position += step
        assembly = None
        if self.peek() == "," and allow_assembly:
            self.position += 1
            assembly = self.assembly_part(top_level=top_level)
        return TypeName(full_name.strip(), assembly, arguments)

    def simple_name(self) -> str:
        start = self.position
        characters: list[str] = []
        while self.position < len(self.text):
            char = self.text[self.position]
            if char == "\\":
                if self.position + 1 >= len(self.text):
                    raise self.error("dangling escape")
                characters.append(self.text[self.position : self.position + 2])
                self.position += 2
                continue
            if char in ",[]*&":
                break
            characters.append(char)
            self.position += 1
        name = "".join(characters).strip()
        if not name:
            self.position = start
            raise self.error("missing type name")
        return name

    def generic_arguments(self) -> tuple[tuple[TypeName, ...], str]:
        """`[[A, Asm],[B]]` or `[A,B]`; returns the arguments and their FullName rendering."""
        if self.text.startswith("[]", self.position):
            return (), ""  # an array, not generic arguments
        self.position += 1  # [
        arguments: list[TypeName] = []
        while True:
            if self.peek() == "[":
                self.position += 1
                arguments.append(self.type_name(top_level=False))
                if self.peek() != "]":
                    raise self.error("expected ']' after a generic argument")
                self.position += 1
            else:
                # Unbracketed arguments cannot carry an assembly: a comma separates arguments.
                arguments.append(self.type_name(top_level=False, allow_assembly=False))
            while self.peek() == " ":
                self.position += 1
            if self.peek() == ",":
                self.position += 1
                while self.peek() == " ":
                    self.position += 1
                continue
            if self.peek() == "]":
                self.position += 1
                break
            raise self.error("expected ',' or ']' in generic arguments")
        rendered = "[" + ",".join(f"[{a.assembly_qualified}]" for a in arguments) + "]"
        return tuple(arguments), rendered

    def assembly_part(self, *, top_level: bool) -> str:
        """Up to the end (top level) or the `]` closing this bracketed argument."""
        start = self.position
        while self.position < len(self.text):
            char = self.text[self.position]
            if char == "\\":
                self.position += 2
                continue
            if char == "]" and not top_level:
                break
            if char == "[":
                raise self.error("unexpected '[' in an assembly name")
            self.position += 1
        assembly = self.text[start : self.position].strip()
        if not assembly:
            raise self.error("empty assembly name")
        return assembly
