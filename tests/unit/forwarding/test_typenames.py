"""Topics from .NET type names, as NServiceBus computes them (Type.FullName)."""

from __future__ import annotations

import pytest

from bridge.exceptions import TypeNameError
from bridge.forwarding.typenames import parse_type_name, topics_for

QUALIFIED = "Version=1.0.0.0, Culture=neutral, PublicKeyToken=null"


@pytest.mark.parametrize(
    ("text", "full_name", "assembly"),
    [
        ("Shared.OrderSubmitted", "Shared.OrderSubmitted", None),
        (
            f"Shared.OrderSubmitted, Shared, {QUALIFIED}",
            "Shared.OrderSubmitted",
            f"Shared, {QUALIFIED}",
        ),
        ("  Shared.OrderSubmitted ,  Shared  ", "Shared.OrderSubmitted", "Shared"),
        ("Shared.Outer+Inner, Shared", "Shared.Outer+Inner", "Shared"),
        ("Shared.Outer+Middle+Inner", "Shared.Outer+Middle+Inner", None),
        (
            f"Shared.Envelope`1[[Shared.Order, Shared, {QUALIFIED}]], Shared, {QUALIFIED}",
            f"Shared.Envelope`1[[Shared.Order, Shared, {QUALIFIED}]]",
            f"Shared, {QUALIFIED}",
        ),
        (
            "System.Collections.Generic.Dictionary`2[[System.String, mscorlib],"
            "[Shared.Order+Line, Shared]], mscorlib",
            "System.Collections.Generic.Dictionary`2[[System.String, mscorlib],"
            "[Shared.Order+Line, Shared]]",
            "mscorlib",
        ),
        (
            "Shared.Outer`1+Inner`1[[Shared.Envelope`1[[Shared.Order, Shared]], Shared]], Shared",
            "Shared.Outer`1+Inner`1[[Shared.Envelope`1[[Shared.Order, Shared]], Shared]]",
            "Shared",
        ),
        (
            "Shared.Pair`2[Shared.A,Shared.B], Shared",
            "Shared.Pair`2[[Shared.A],[Shared.B]]",
            "Shared",
        ),
        ("Shared.Batch[], Shared", "Shared.Batch[]", "Shared"),
        (r"Odd\,Name\+Really, Shared", r"Odd\,Name\+Really", "Shared"),
    ],
)
def test_full_name_is_the_type_name_without_its_assembly(
    text: str, full_name: str, assembly: str | None
) -> None:
    parsed = parse_type_name(text)
    assert parsed.full_name == full_name
    assert parsed.assembly == assembly


def test_generic_arguments_are_parsed_with_their_assemblies() -> None:
    parsed = parse_type_name(f"Shared.Envelope`1[[Shared.Order, Shared, {QUALIFIED}]], Shared")
    [argument] = parsed.generic_arguments
    assert argument.full_name == "Shared.Order"
    assert argument.assembly == f"Shared, {QUALIFIED}"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        ", Shared",
        "Shared.A, ",
        "Shared.A[[B, X]",
        "Shared.A[[B, X]] junk]",
        "A\\",
        "Shared.A[[B, [X]]]",
    ],
)
def test_malformed_type_names_are_rejected_with_the_text(text: str) -> None:
    with pytest.raises(TypeNameError) as error:
        parse_type_name(text)
    assert repr(text) in str(error.value)


def test_topics_are_the_event_type_its_hierarchy_and_system_object_most_specific_first() -> None:
    enclosed = ";".join(
        f"{name}, Shared, {QUALIFIED}"
        for name in ("Shared.OrderSubmittedV2", "Shared.OrderSubmitted", "Shared.IOrderEvent")
    )
    topics = topics_for(f"Shared.OrderSubmittedV2, Shared, {QUALIFIED}", enclosed)
    assert topics == [
        "Shared.OrderSubmittedV2",
        "Shared.OrderSubmitted",
        "Shared.IOrderEvent",
        "System.Object",
    ]


def test_unparseable_enclosed_types_are_skipped_but_a_bad_event_type_is_an_error() -> None:
    assert topics_for("Shared.A, Shared", "Shared.A, Shared; ;, junk;Shared.B") == [
        "Shared.A",
        "Shared.B",
        "System.Object",
    ]
    with pytest.raises(TypeNameError):
        topics_for(", Shared", None)


def test_without_an_enclosed_types_header_the_event_type_alone_is_looked_up() -> None:
    assert topics_for("Shared.A, Shared", None) == ["Shared.A", "System.Object"]
