"""Topic syntax: a topic is an event type's full name, without the assembly part."""

from __future__ import annotations

__all__ = ["topic_problem"]


def topic_problem(topic: str) -> str | None:
    """What is wrong with `topic` as a topic (an event type's full name), or None if nothing.

    The message does not quote the topic: it goes with a key path that does.

    Rejects empty names, leading or trailing whitespace, unbalanced brackets and an assembly
    part (`Shared.OrderSubmitted, Shared`): only a comma outside brackets starts one, since a
    generic type's arguments are assembly-qualified inside its brackets
    (``Shared.Envelope`1[[Shared.Order, Shared, Version=1.0.0.0]]``).
    """
    if not topic.strip():
        return "a topic must not be empty"
    if topic != topic.strip():
        return f"has leading or trailing whitespace; write {topic.strip()!r}"
    depth = 0
    for index, char in enumerate(topic):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                break
        elif char == "," and depth == 0:
            type_name, assembly = topic[:index].strip(), topic[index + 1 :].strip()
            return (
                f"names an assembly ({assembly!r}); a topic is the event type's full name "
                f"without the assembly part: write {type_name!r}"
            )
    if depth != 0:
        return "has unbalanced '[' and ']'"
    return None
