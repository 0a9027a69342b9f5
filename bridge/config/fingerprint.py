"""A configuration's fingerprint: which configuration a daemon runs, recorded with its heartbeat
(`bridge.storage.daemons`) so that `sfbridge status -c FILE` can tell a daemon of FILE from a
daemon of another configuration on the same forwarding database.

The fingerprint is a hash of the normalized configuration without its secrets: passwords,
keys and tokens are masked (`bridge.secrets.mask_secrets`) before hashing, and neither the
file's path nor the values left unresolved take part. So the same configuration read from two
paths, or with its keys in another order, has the same fingerprint, and changing only a
password does not change it (nor can the hash be tried against guessed passwords).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from bridge.config.model import BridgeConfig
from bridge.secrets import mask_secrets

# Fields that say where or how the configuration was read, not what it configures; `unresolved`
# may hold a secret.
_LEFT_OUT = frozenset({"source_path", "unresolved"})

# Hex digits kept: enough to tell configurations apart, short enough to read in `status`.
FINGERPRINT_LENGTH = 16


def config_fingerprint(config: BridgeConfig) -> str:
    """The configuration's fingerprint: FINGERPRINT_LENGTH lowercase hex digits."""
    text = json.dumps(_normalized(config), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:FINGERPRINT_LENGTH]


def _normalized(value: Any) -> Any:
    """`value` as JSON data: dataclasses as dicts of their fields (less `_LEFT_OUT`), mappings
    with their keys as text, sequences as lists, text with its secrets masked."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            item.name: _normalized(getattr(value, item.name))
            for item in dataclasses.fields(value)
            if item.name not in _LEFT_OUT
        }
    if isinstance(value, Mapping):
        return {str(key): _normalized(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        items = [_normalized(item) for item in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if isinstance(value, str):
        return mask_secrets(value)
    return value
