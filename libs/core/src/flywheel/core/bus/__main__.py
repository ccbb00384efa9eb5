"""``python -m flywheel.core.bus declare``: declare every stream and durable consumer of
``flywheel.api.subjects`` in the namespace of ``FLYWHEEL_NATS_NAMESPACE``.

What the chart's JetStream setup Job runs (a pre-install/pre-upgrade hook) as the NATS admin,
with the same ``FLYWHEEL_NATS_*`` settings as the services. Idempotent: existing streams are
updated only where a declared setting changed, missing consumers created with the catalogue's
config, existing ones left as their owners declared them (a service's ack-wait setting, say:
an upgrade must not put the catalogue's back). Services still declare their own streams and
consumers at start; with this done first, their NATS users can be denied stream creation.
"""

from __future__ import annotations

import argparse
import asyncio

from flywheel.api.subjects import Catalogue
from flywheel.core.bus.connection import connect, ensure_consumer_exists, ensure_topology
from flywheel.core.settings import NatsSettings, load_settings


async def declare(settings: NatsSettings) -> Catalogue:
    """Declare the catalogue's streams, then every durable consumer that is missing; returns the
    catalogue."""
    catalogue = Catalogue(settings.namespace)
    nc = await connect(settings, name="admin")
    try:
        js = nc.jetstream()
        await ensure_topology(js, catalogue)
        for consumer in catalogue.consumers.values():
            await ensure_consumer_exists(js, consumer)
    finally:
        await nc.close()
    return catalogue


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flywheel.core.bus", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["declare"])
    parser.parse_args(argv)
    settings = load_settings(NatsSettings)
    catalogue = asyncio.run(declare(settings))
    print(
        f"declared {len(catalogue.streams)} streams and {len(catalogue.consumers)} consumers "
        f"in namespace {catalogue.namespace}"
    )


if __name__ == "__main__":
    main()
