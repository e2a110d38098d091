"""bench fuzz: bad records written into a live run end in the dead-letter topic with their real source,
and no role restarts.

One `forgestream up --ephemeral --minutes M` (evaluator off). Once its first trajectory is judged, the
bench writes `--count` records to every topic a consumer group reads, cycling four kinds:
- bytes: random bytes;
- truncated: a real event of the topic's type, msgpack-encoded and cut in half;
- wrong type: a valid event of another type (a Metric);
- out of range: the topic's event with one field out of its bounds (a group of 10**9 rollouts, a
  negative rollout index, a step without judgements, a negative sample version, an accuracy of 1.5).
It also writes `--count` random-bytes records to the topics only group-less readers follow (tasks,
weights, metrics): those readers skip them (a dead letter from each of many readers would be noise).
Then, while the run lives, it reads `forge.dlq` until every injected record is dead-lettered by every
consumer group of its topic, or `--settle-s` passes. Reported per topic: injected, dead-lettered by
each group (matched on source topic, partition and offset), letters per record; the roles' restarts
(from their logs); the run's judged trajectories and versions. Writes benchmarks/results/fuzz.json.

    python benchmarks/fuzz.py [--count 1000] [--minutes 8]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio
import msgspec

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
KINDS = ("bytes", "truncated", "wrong type", "out of range")


def consumed_topics() -> dict[str, int]:
    """Topic -> how many consumer groups read it (each dead-letters what it cannot decode)."""
    from schemas import topics as t

    return {
        t.ROLLOUT_REQUESTS: 1,
        t.TRAJECTORIES: 1,
        t.JUDGED: 2,
        t.SAMPLES_POLICY: 1,
        t.SAMPLES_REWARD: 1,
        t.TASK_EVENTS: 1,
    }  # fmt: skip  (judged: signals and forge)


def followed_topics() -> list[str]:
    from schemas import topics as t

    return [t.TASKS, t.GROUPS, t.WEIGHTS, t.METRICS]


def examples(real: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Per consumed topic: (a valid event, the same event as builtins with one field out of range)."""
    from schemas import events as ev
    from schemas import topics as t

    policy = ev.PolicySampleBatch(request_id="fuzz", samples=[ev.PolicySample(
        sample_key="fuzz/0/0", task_id="fuzz", prompt_token_ids=[1, 2], response_token_ids=[3],
        behaviour_logprobs=[-0.5], policy_version=0, advantage=1.0, reward=1.0)])  # fmt: skip
    reward = ev.RewardSampleBatch(request_id="fuzz", samples=[ev.RewardSample(
        sample_key="fuzz/0/0/0", prompt_token_ids=[1, 2], response_token_ids=[3],
        behaviour_logprobs=[-0.5], reward_version=0, advantage=1.0, reward=1.0)])  # fmt: skip
    task_event = ev.TaskEvent(
        event_id="fuzz", task_id="fuzz", task_version=0, kind="harder", accuracy=1.0, rollouts=8
    )
    events = {t.ROLLOUT_REQUESTS: real[t.ROLLOUT_REQUESTS], t.TRAJECTORIES: real[t.TRAJECTORIES],
              t.JUDGED: real[t.JUDGED], t.SAMPLES_POLICY: policy, t.SAMPLES_REWARD: reward,
              t.TASK_EVENTS: task_event}  # fmt: skip

    def out_of_range(topic: str, tree: dict) -> dict:
        if topic == t.ROLLOUT_REQUESTS:
            tree["n"] = 10**9
        elif topic == t.TRAJECTORIES:
            tree["rollout_index"] = -1
        elif topic == t.JUDGED:
            tree["steps"][0]["judgements"] = []
        elif topic == t.SAMPLES_POLICY:
            tree["samples"][0]["policy_version"] = -1
        elif topic == t.SAMPLES_REWARD:
            tree["samples"][0]["reward_version"] = -1
        else:
            tree["accuracy"] = 1.5
        return tree

    return {topic: (e, out_of_range(topic, msgspec.to_builtins(e))) for topic, e in events.items()}


def payload(kind: str, event: Any, bad_tree: dict, rng: random.Random) -> bytes:
    from schemas import codec
    from schemas import events as ev

    if kind == "bytes":
        return rng.randbytes(rng.randrange(1, 512))
    if kind == "truncated":
        data = codec.encode(event)
        return data[: len(data) // 2]
    if kind == "wrong type":
        return codec.encode(ev.Metric(role="fuzz", name="fuzz/wrong_type", value=1.0))
    return msgspec.msgpack.encode(bad_tree)


async def inject(bootstrap: str, count: int, seed: int) -> dict[str, list[tuple[int, int, str]]]:
    """Write the bad records; per topic the (partition, offset, kind) of each."""
    from aiokafka import AIOKafkaProducer

    from infra.bus import Bus
    from schemas.config import KafkaConfig

    rng = random.Random(seed)
    kafka = KafkaConfig(bootstrap=bootstrap)
    async with Bus(kafka, role="fuzz") as bus:
        real = {topic: (await bus.read_topic(topic, latest_per_key=False))[0].value
                for topic in list(consumed_topics())[:3]}  # fmt: skip
    cases = examples(real)
    written: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=8 << 20)
    await producer.start()
    try:
        for topic in [*consumed_topics(), *followed_topics()]:
            pending = []
            for i in range(count):
                kind = KINDS[i % len(KINDS)] if topic in cases else "bytes"
                event, bad = cases.get(topic, (None, {}))
                value = payload(kind, event, bad, rng)
                future = await producer.send(topic, value, key=f"fuzz-{i}".encode())
                pending.append((future, kind))
            for future, kind in pending:
                meta = await future
                written[topic].append((meta.partition, meta.offset, kind))
    finally:
        await producer.stop()
    return written


async def dead_letters(bootstrap: str) -> list[Any]:
    from infra.bus import Bus
    from schemas.config import KafkaConfig
    from schemas.topics import DLQ

    async with Bus(KafkaConfig(bootstrap=bootstrap), role="fuzz") as bus:
        return [r.value for r in await bus.read_topic(DLQ, latest_per_key=False)]


def tally(written: dict[str, list[tuple[int, int, str]]], letters: list[Any]) -> dict[str, dict]:
    groups_of: dict[tuple[str, int, int], set[str]] = defaultdict(set)
    copies: Counter[tuple[str, int, int]] = Counter()
    for letter in letters:
        where = (letter.source_topic, letter.partition, letter.offset)
        groups_of[where].add(letter.group)
        copies[(*where, letter.group)] += 1
    expected = consumed_topics()
    out = {}
    for topic, records in written.items():
        want = expected.get(topic, 0)
        got = [groups_of.get((topic, p, o), set()) for p, o, _ in records]
        by_group = Counter(g for gs in got for g in gs)
        missing = Counter(kind for (_, _, kind), gs in zip(records, got, strict=True) if len(gs) < want)
        out[topic] = {"injected": len(records), "consumer_groups": want, "dead_lettered_by": dict(by_group),
                      "records_missing_a_letter": sum(missing.values()), "missing_by_kind": dict(missing),
                      "letters_twice": sum(1 for (t, *_), n in copies.items() if t == topic and n > 1)}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000, help="bad records per topic")
    parser.add_argument("--minutes", type=float, default=8.0, help="length of the live run")
    parser.add_argument("--settle-s", type=float, default=330.0, help="how long to wait for the letters")
    parser.add_argument("--out", type=Path, default=RESULTS / "fuzz.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks import child_env, restarts, start_up, wait_for_live

    env = child_env(FORGESTREAM_EVALUATOR__ENABLED="false")
    workdir, up = start_up("bench-fuzz", args.minutes, env, "--ephemeral")
    try:
        bootstrap = wait_for_live(workdir, up)
        t0 = time.monotonic()
        written = anyio.run(inject, bootstrap, args.count, 0)
        inject_s = time.monotonic() - t0
        want = sum(len(r) * consumed_topics().get(t, 0) for t, r in written.items())
        deadline, letters = time.monotonic() + args.settle_s, []
        while time.monotonic() < deadline and up.poll() is None:
            letters = anyio.run(dead_letters, bootstrap)
            table = tally(written, letters)
            if sum(row["records_missing_a_letter"] for row in table.values()) == 0:
                break
            time.sleep(5)
        settle_s = time.monotonic() - t0 - inject_s
        table = tally(written, letters)
    finally:
        up.wait()
    summary = json.loads((workdir / "report" / "summary.json").read_text())
    result = {"machine": "2 cores, no GPU", "count_per_topic": args.count, "minutes": args.minutes,
              "inject_s": round(inject_s, 1), "letters_expected": want, "letters_read": len(letters),
              "settle_s": round(settle_s, 1), "topics": table, "restarts": restarts(workdir),
              "run": {k: summary.get(k) for k in ("policy_version", "reward_version", "trajectories",
                                                  "samples_trained", "dlq")}}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
