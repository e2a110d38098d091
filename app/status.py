"""`forgestream status`: topics, message counts, consumer groups, members, lag, dead letters (and how
many `forgestream dlq redrive` sent back).

A partition's message count is `end - beginning` and a group's lag is `end - committed`, with `end`
from `infra.bus.true_end_offsets` (right on Tansu and Kafka). Committed offsets are asked for with explicit partitions (Tansu ignores the "all partitions" form).
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.bus import consumer_options, true_end_offsets
from infra.topics import admin_client
from schemas.config import KafkaConfig
from schemas.topics import DLQ, REDRIVEN, TopicNames


def _members(group: dict[str, Any]) -> list[dict[str, Any]]:
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

    members = []
    for m in group.get("members", []):
        partitions: list[str] = []
        if m.get("member_assignment"):  # Tansu leaves it empty
            try:
                decoded = ConsumerProtocolMemberAssignment.decode(m["member_assignment"])
                partitions = [f"{tp.topic}[{tp.partition}]" for tp in decoded.partitions()]
            except Exception:  # an assignment of another protocol: show the member without it
                partitions = []
        members.append(
            {
                "member_id": m["member_id"],
                "client_id": m.get("client_id", ""),
                "host": m.get("client_host", ""),
            }
            | {"partitions": partitions}
        )
    return members


async def _describe(admin: Any, gid: str) -> dict[str, Any]:
    """State and members of one group; a description the client cannot parse is shown as unknown
    (seen on Tansu for a group whose member was killed mid-rebalance: "Buffer underrun")."""
    try:
        (response,) = await admin.describe_consumer_groups([gid])
        (group,) = response.to_object()["groups"]
    except Exception as e:
        return {"state": f"? ({type(e).__name__})", "members": []}
    return {"state": group.get("state", "?"), "members": _members(group)}


async def collect_status(kafka: KafkaConfig) -> dict[str, Any]:
    """Everything `forgestream status` shows, as plain data (JSON-ready)."""
    names = TopicNames(kafka.topic_prefix)
    admin = admin_client(kafka)
    await admin.start()
    consumer = AIOKafkaConsumer(**consumer_options(kafka, None))
    await consumer.start()
    try:
        present = set(await admin.list_topics())
        topics = [t for t in names.all() if t in present]
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        begins, ends = await true_end_offsets(consumer, tps) if tps else ({}, {})
        topic_rows = []
        for t in topics:
            mine = [tp for tp in tps if tp.topic == t]
            topic_rows.append(
                {
                    "topic": t,
                    "partitions": len(mine),
                    "messages": sum(ends[tp] - begins[tp] for tp in mine),
                    "end_offsets": [ends[tp] for tp in mine],
                }
            )
        group_rows = []
        for gid in sorted(g[0] for g in await admin.list_consumer_groups()):
            if not gid.startswith(kafka.topic_prefix):
                continue  # group ids carry the run's topic prefix (see infra.bus.consumer_options)
            committed = await admin.list_consumer_group_offsets(gid, partitions=tps) if tps else {}
            # a group consumes a topic when it committed on any of its partitions; on the others it
            # starts from the beginning (auto_offset_reset=earliest), so their lag is the whole partition
            consumed = {
                tp.topic for tp, meta in committed.items() if meta.offset is not None and meta.offset >= 0
            }
            lag: dict[str, int] = {}
            for tp in tps:
                if tp.topic not in consumed:
                    continue
                meta = committed.get(tp)
                position = meta.offset if meta is not None and meta.offset >= 0 else begins[tp]
                lag[tp.topic] = lag.get(tp.topic, 0) + max(0, ends[tp] - position)
            if not lag and kafka.topic_prefix:
                continue  # no commit on this run's topics: a group of another run sharing the cluster
            group_rows.append(
                {"group": gid.removeprefix(kafka.topic_prefix)}
                | await _describe(admin, gid)
                | {"lag": lag, "total_lag": sum(lag.values())}
            )
        count = {r["topic"]: r["messages"] for r in topic_rows}
        return {
            "bootstrap": kafka.bootstrap,
            "topic_prefix": kafka.topic_prefix,
            "topics": topic_rows,
            "groups": group_rows,
            "dead_letters": count.get(names.of(DLQ), 0),
            "redriven": count.get(names.of(REDRIVEN), 0),  # `forgestream dlq redrive`'s journal
        }
    finally:
        await consumer.stop()
        await admin.close()


def render(status: dict[str, Any]) -> Any:
    """A rich renderable of `collect_status`'s result."""
    from rich.console import Group
    from rich.table import Table

    topics = Table(title=f"topics on {status['bootstrap']} (prefix {status['topic_prefix']!r})")
    for col in ("topic", "partitions", "messages"):
        topics.add_column(col, justify="left" if col == "topic" else "right")
    for row in status["topics"]:
        topics.add_row(row["topic"], str(row["partitions"]), str(row["messages"]))
    groups = Table(title="consumer groups")
    for col in ("group", "state", "members", "lag"):
        groups.add_column(col, justify="right" if col in ("members",) else "left")
    for g in status["groups"]:
        detail = ", ".join(f"{t}: {n}" for t, n in sorted(g["lag"].items()))
        groups.add_row(g["group"], g["state"], str(len(g["members"])), f"{g['total_lag']} ({detail})")
    redriven = f" ({status['redriven']} redriven)" if status.get("redriven") else ""
    return Group(topics, groups, f"dead letters: {status['dead_letters']}{redriven}")


def render_figures(figures: dict[str, Any]) -> Any:
    """A rich table of the run figures (`Progress.snapshot`, as `status --json` prints them)."""
    from rich.table import Table

    table = Table(
        title="run" + (" (stopped; last snapshot)" if figures.get("stopped") else ""), show_header=False
    )
    table.add_column("figure", style="bold")
    table.add_column("value")
    for key, value in figures.items():
        if key in ("cluster", "stopped"):
            continue
        shown = ", ".join(f"{g}: {n}" for g, n in value.items()) if isinstance(value, dict) else str(value)
        table.add_row(key, shown)
    return table
