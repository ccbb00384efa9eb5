"""The first loop, on a real local stack, told as it happens.

Starts NATS, PostgreSQL, S3 and the six services; creates an endpoint with three arms;
serves simulated requests through the SDK (Select over gRPC, feedback over NATS, with a
hidden true success rate per arm); sends one feedback event twice to show it counts
once; reads the decision back from the trace store; prints the posteriors; stops.

    python -m flywheel.stack.demo [--requests 300] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from pathlib import Path

import grpc
import nats
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from flywheel.api.common.v1.common_pb2 import EventMeta
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2 as admin_pb
from flywheel.api.optimizer.v1 import endpoint_admin_service_pb2_grpc as admin_grpc
from flywheel.api.optimizer.v1 import endpoints_pb2 as ep_pb
from flywheel.api.optimizer.v1.events_pb2 import FeedbackEvent
from flywheel.api.subjects import Catalogue
from flywheel.api.traces.v1 import trace_store_service_pb2 as ts_pb
from flywheel.api.traces.v1 import trace_store_service_pb2_grpc as ts_grpc
from flywheel.sdk import FlywheelClient
from flywheel.stack.stack import Stack

console = Console()
# Hidden truth of the simulation: the probability each arm's answer satisfies the user.
TRUE_RATES = {"small-cheap": 0.35, "large-careful": 0.70, "large-creative": 0.50}
ARM_PARAMS = {
    "small-cheap": {"model": "gpt-4o-mini", "temperature": 0.2},
    "large-careful": {"model": "gpt-4o", "temperature": 0.1},
    "large-creative": {"model": "gpt-4o", "temperature": 0.9},
}


async def run_loop(stack: Stack, requests: int) -> None:
    optimizer = stack.services["optimizer"].address
    env = stack.servers.env(nats_role="product")  # the demo plays a product: feedback only
    async with grpc.aio.insecure_channel(optimizer) as channel:
        admin = admin_grpc.EndpointAdminServiceStub(channel)
        arms = []
        for arm_id, params in ARM_PARAMS.items():
            arm = ep_pb.Arm(arm_id=arm_id)
            arm.params.update(params)
            arms.append(arm)
        await admin.CreateEndpoint(
            admin_pb.CreateEndpointRequest(endpoint=ep_pb.Endpoint(name="support-bot", arms=arms))
        )
        console.print("[bold]1.[/] Created endpoint [cyan]support-bot[/] with arms " + ", ".join(ARM_PARAMS))

        rng = random.Random(7)  # noqa: S311 - a reproducible simulation, not a secret
        chosen: dict[str, int] = dict.fromkeys(ARM_PARAMS, 0)
        async with FlywheelClient(
            target=optimizer,
            nats_url=env["FLYWHEEL_NATS_URL"],
            nats_user=env["FLYWHEEL_NATS_USER"],
            nats_password=env["FLYWHEEL_NATS_PASSWORD"],
            source="demo",
        ) as fw:
            first = None
            with Progress(console=console, transient=True) as progress:
                task = progress.add_task("serving requests (Select + feedback)", total=requests)
                for i in range(requests):
                    decision = await fw.select("support-bot", user_id=f"user-{i % 25}", context={"lang": "en"})
                    first = first or decision
                    chosen[decision.arm_id] += 1
                    reward = 1.0 if rng.random() < TRUE_RATES[decision.arm_id] else 0.0
                    await fw.feedback(decision, reward=reward, event_id=f"fb-{decision.decision_id}")
                    progress.advance(task)
            console.print(f"[bold]2.[/] Served {requests} requests; arms chosen: {chosen}")

            # The same feedback event again, as a producer retrying after JetStream's
            # 10-minute dedup window would send it: same event id, new NATS message id.
            # Only the optimizer's applied_feedback table stands between it and a double count.
            assert first is not None
            await resend_feedback(env, first.decision_id, f"fb-{first.decision_id}")
            console.print(
                f"[bold]3.[/] Re-sent the feedback of decision {first.decision_id[:8]}… "
                "(same event id, new NATS message id)"
            )

        deadline = time.monotonic() + 30
        while True:
            got = (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))).endpoint
            applied = sum(s.pulls for s in got.stats)
            if applied >= requests or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)  # give a wrongly applied duplicate time to show up
        got = (await admin.GetEndpoint(admin_pb.GetEndpointRequest(name="support-bot"))).endpoint
        applied = sum(s.pulls for s in got.stats)

    table = Table(title="Posteriors in PostgreSQL (Beta, prior 1,1)")
    for col in ("arm", "true rate", "pulls", "alpha", "beta", "mean", "95% interval"):
        table.add_column(col, justify="right" if col != "arm" else "left")
    for s in got.stats:
        table.add_row(
            s.arm_id,
            f"{TRUE_RATES[s.arm_id]:.2f}",
            str(s.pulls),
            f"{s.alpha:.0f}",
            f"{s.beta:.0f}",
            f"{s.mean:.3f}",
            f"[{s.ci_low:.3f}, {s.ci_high:.3f}]",
        )
    console.print(table)
    verdict = "[green]once[/]" if applied == requests else f"[red]{applied} times for {requests} events[/]"
    console.print(
        f"[bold]4.[/] Feedback applied {applied} times for {requests} distinct events "
        f"+ 1 duplicate: each counted {verdict}. Incumbent: [cyan]{got.incumbent_arm_id or '(none yet)'}[/]"
    )

    async with grpc.aio.insecure_channel(stack.services["trace_store"].address) as channel:
        record = (
            await ts_grpc.TraceStoreServiceStub(channel).GetDecision(
                ts_pb.GetDecisionRequest(decision_id=first.decision_id)
            )
        ).decision
    console.print(
        f"[bold]5.[/] Trace store has decision {record.decision_id[:8]}…: arm {record.arm_id}, "
        f"p={record.probability:.3f}, user {record.user_id}, feedback "
        f"{[(f.event_id[:11] + '…', f.reward) for f in record.feedback]}"
    )
    if applied != requests:
        raise SystemExit("feedback was not applied exactly once")


async def resend_feedback(env: dict[str, str], decision_id: str, event_id: str) -> None:
    nc = await nats.connect(
        env["FLYWHEEL_NATS_URL"], user=env["FLYWHEEL_NATS_USER"], password=env["FLYWHEEL_NATS_PASSWORD"]
    )
    event = FeedbackEvent(
        meta=EventMeta(event_id=event_id, source="demo-retry"),
        decision_id=decision_id,
        endpoint="support-bot",
        reward=1.0,
    )
    await nc.jetstream().publish(
        Catalogue().feedback("support-bot"), event.SerializeToString(), headers={"Nats-Msg-Id": f"retry-{event_id}"}
    )
    await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the data folder afterwards")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="flywheel-demo-"))
    stack = Stack.create(root)
    started = time.monotonic()
    with console.status("starting NATS, PostgreSQL, S3 and six services on loopback…"):
        stack.up()
    console.print(f"Stack up in {time.monotonic() - started:.1f}s — data and logs in {root}")
    for name, proc in stack.services.items():
        console.print(f"  {name:13s} grpc {proc.address}  SERVING")
    try:
        asyncio.run(run_loop(stack, args.requests))
    finally:
        with console.status("stopping everything (SIGTERM, drain)…"):
            stack.down()
        console.print("Stack stopped.")
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
