"""How many rows a claim locks: about as many as the byte bound will admit."""

from __future__ import annotations

import pytest

from bridge.config.model import ForwarderConfig
from bridge.forwarding.claim import claim_limit

MIB = 1024 * 1024


def forwarder(batch_size: int = 1000, batch_bytes: int = 8 * MIB) -> ForwarderConfig:
    return ForwarderConfig("f", "db", "q", batch_size=batch_size, batch_bytes=batch_bytes)


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([], 1000),  # nothing seen yet: the whole batch size
        ([1024] * 10, 1000),  # small messages: the count bound decides
        ([64 * 1024] * 128, 161),  # 8 MiB / 64 KiB = 128, and a quarter to spare
        ([8 * MIB], 2),  # messages the size of the bound: one goes, one is looked at
        ([100 * MIB], 1),  # larger than the bound: alone
        ([0], 1000),  # empty bodies and headers cannot divide by zero
    ],
)
def test_the_limit_follows_the_sizes_just_seen(sizes: list[int], expected: int) -> None:
    assert claim_limit(forwarder(), sizes) == expected


def test_the_limit_never_passes_the_batch_size_nor_drops_below_one() -> None:
    assert claim_limit(forwarder(batch_size=50), [10] * 5) == 50
    assert claim_limit(forwarder(batch_bytes=64 * 1024), [1024 * MIB]) == 1
