"""Topic administration: create every topic of `schemas.topics.TOPICS` under a prefix, list them.

Idempotent: an existing topic is left as it is (Tansu cannot add partitions anyway); a topic that
exists with fewer partitions than the spec is reported, not silently accepted.
"""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from infra.bus import client_options
from schemas.config import KafkaConfig
from schemas.topics import TOPICS, TopicNames

log = logging.getLogger("forgestream.topics")


def admin_client(kafka: KafkaConfig) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        **client_options(kafka), request_timeout_ms=int(kafka.request_timeout_s * 1000)
    )


async def create_topics(kafka: KafkaConfig, *, replication_factor: int = 1) -> list[str]:
    """Create the missing forgestream topics (prefixed); returns the physical names created."""
    names = TopicNames(kafka.topic_prefix)
    admin = admin_client(kafka)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(
                names.of(spec.name), spec.partitions, replication_factor, topic_configs=dict(spec.configs)
            )
            for spec in TOPICS.values()
            if names.of(spec.name) not in existing
        ]
        created: list[str] = []
        if wanted:
            response = await admin.create_topics(wanted)
            for topic, code, message in response.topic_errors:
                error = for_code(code)
                if code == 0:
                    created.append(topic)
                elif error is not TopicAlreadyExistsError:  # a concurrent creator won the race: fine
                    raise error(f"creating topic {topic}: {message}")
        await _check_partitions(admin, names, existing)
        return created
    finally:
        await admin.close()


async def _check_partitions(admin: AIOKafkaAdminClient, names: TopicNames, existing: set[str]) -> None:
    old = [names.of(n) for n in TOPICS if names.of(n) in existing]
    if not old:
        return
    for desc in await admin.describe_topics(old):
        spec = names.spec(desc["topic"])
        if len(desc["partitions"]) < spec.partitions:
            log.warning(
                "topic %s has %d partitions, the spec asks for %d: consumers scale only to %d",
                desc["topic"],
                len(desc["partitions"]),
                spec.partitions,
                len(desc["partitions"]),
            )


async def list_topics(kafka: KafkaConfig, *, all_topics: bool = False) -> list[str]:
    """Physical names of the forgestream topics present under the prefix (or every topic)."""
    names = TopicNames(kafka.topic_prefix)
    admin = admin_client(kafka)
    await admin.start()
    try:
        present = set(await admin.list_topics())
    finally:
        await admin.close()
    if all_topics:
        return sorted(present)
    return [t for t in names.all() if t in present]
