"""The event bus: subject/stream/consumer catalogue, codec, connection, publisher and
the pull-consumer loop with dead-lettering. Built on nats-py directly (see docs/bus.md
for why not FastStream on the hot path)."""
