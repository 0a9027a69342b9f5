"""ServiceControl heartbeats and custom checks, sent over the transport itself: the messages
NServiceBus's heartbeat and custom-check plugins send, written into ServiceControl's input
queue table (`messages`: their wire shape; `checks`: what each check reports; `reporter`: the
daemon's scheduled jobs that observe and send)."""
