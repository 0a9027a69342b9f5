"""The schema's `servicecontrol` section: heartbeats and custom checks sent to ServiceControl
(`bridge.daemon.servicecontrol`)."""

from __future__ import annotations

from bridge.config.keys import Key, Section
from bridge.config.model import ServiceControlConfig
from bridge.config.schema.common import _POSITIVE, NAME_MESSAGE, NAME_PATTERN

SERVICECONTROL = Section(
    name="servicecontrol",
    shape="mapping",
    model=ServiceControlConfig,
    description=(
        "Heartbeats and custom checks for ServiceControl, written into its input queue as "
        "NServiceBus's heartbeat and custom-check plugins write them, so that each host running "
        "the bridge shows in ServicePulse as an endpoint instance with a heartbeat, and with a "
        'check per destination database, per forwarder and per error queue (see "Operating": '
        "ServiceControl). Leave the section out for none. ServiceControl being down or its "
        "queue missing never holds up forwarding."
    ),
    keys=(
        Key(
            "database",
            "string",
            "Name of the database (under `databases`) that holds ServiceControl's input queue: "
            "the one ServiceControl's transport connection string opens (postgresql or "
            "sqlserver).",
            example="receiver",
        ),
        Key(
            "queue",
            "address",
            "ServiceControl's input queue in that database, in its dialect (default: the table "
            "`Particular.ServiceControl`, the name of a default ServiceControl instance, in the "
            "database's default schema). In PostgreSQL quote a dotted name "
            "(`'\"Particular.ServiceControl\"'` in YAML), or its first part is the schema.",
            example='"Particular.ServiceControl"',
            default=None,
        ),
        Key(
            "endpoint",
            "string",
            "The endpoint name the bridge reports as; each host running it is an instance of "
            "that endpoint in ServicePulse. Give each bridge of one ServiceControl a name of "
            "its own.",
            example="sfbridge",
            default="sfbridge",
            pattern=NAME_PATTERN,
            pattern_message=NAME_MESSAGE,
        ),
        Key(
            "heartbeat_interval",
            "duration",
            "How often a heartbeat is sent (NServiceBus's default, 10s). ServiceControl calls "
            "an instance dead after its `HeartbeatGracePeriod` (40 s by default) without one; "
            "a warning outside 1s..60s.",
            example="10s",
            default=10.0,
            warn_outside=(1.0, 60.0),
            **_POSITIVE,
        ),
        Key(
            "time_to_be_received",
            "duration",
            "How long a heartbeat or check result may wait in the queue before it is "
            "discarded unread (default: four intervals of its kind, as NServiceBus does).",
            example="40s",
            default=None,
            **_POSITIVE,
        ),
        Key(
            "check_interval",
            "duration",
            "How often the custom checks run and report: a check fails in ServicePulse at most "
            "this long after its trouble starts, and passes at most this long after it ends; a "
            "warning outside 5s..10m.",
            example="30s",
            default=30.0,
            warn_outside=(5.0, 600.0),
            **_POSITIVE,
        ),
    ),
)
