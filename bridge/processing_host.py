"""Who handled a message, as NServiceBus names it in the headers of a failed message.

NServiceBus Core adds the same four headers to every message it moves to the error queue:
the endpoint that processed it (`NServiceBus.ProcessingEndpoint`), the machine
(`NServiceBus.ProcessingMachine`), and the host's id and display name (`$.diagnostics.hostid`,
a GUID without dashes, and `$.diagnostics.hostdisplayname`). ServicePulse shows them and groups
failed messages by endpoint, and ServiceControl tells endpoint instances apart by host id.

For the bridge, the endpoint is the forwarder (its name: a proxy's queue carries the name of
a real endpoint in another database, which must not be mistaken for it), the machine is the
host name up to its first dot (as .NET's `Environment.MachineName` gives it on Linux), and
the host id is derived from that name, so it stays the same across restarts, as NServiceBus
derives its own from the machine and the program's path.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from functools import cache

__all__ = ["ProcessingHost", "host_id_for", "machine_name", "processing_host"]

# Fixed: host ids derived from it must not change between versions.
_HOST_ID_NAMESPACE = uuid.UUID("6f1c2a8e-51b4-4c4e-9a39-0d7e3b5f2c11")


@dataclass(frozen=True)
class ProcessingHost:
    """The endpoint and host that failed a message (the headers named in the docstring)."""

    endpoint: str
    machine: str
    host_id: str
    host_display_name: str


@cache
def machine_name() -> str:
    """This machine's name: the host name up to its first dot."""
    return socket.gethostname().split(".", 1)[0] or "localhost"


def host_id_for(machine: str) -> str:
    """The host id of `machine`: a name-based GUID, 32 hex digits without dashes."""
    return uuid.uuid5(_HOST_ID_NAMESPACE, f"sfbridge@{machine}").hex


def processing_host(endpoint: str) -> ProcessingHost:
    """The `ProcessingHost` of `endpoint` (a forwarder's name) on this machine."""
    machine = machine_name()
    return ProcessingHost(endpoint, machine, host_id_for(machine), machine)
