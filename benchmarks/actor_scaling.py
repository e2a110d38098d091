"""Rollout capacity vs actor processes: 1, 2, 4, 8 actors on one deep backlog of requests.

Generation is the stub backend (`policy_model.backend = "stub"`): a batch costs `--step-s` of wall time
and no CPU, as if each actor had its own generation device, so the figure is the system's (the
`actors` group, partitions, the bus), not this machine's two cores. Judges and learners do not run.
Each actor count gets a fresh topic prefix and backlog (requests keyed by request id spread over the
8 partitions); the rate is trajectories per second in a window that opens `--warmup-s` after every
actor has produced. Goal: 8 actors >= 7.6x one. Writes benchmarks/results/actor_scaling.json.

    python benchmarks/actor_scaling.py [--actors 1,2,4,8] [--window-s 30]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CONFIG = """
[kafka]
session_timeout_s = 6.0
heartbeat_interval_s = 0.5

[actor]
parallel_episodes = {episodes}
max_steps = 8

[policy_model]
backend = "stub"
stub_step_s = {step_s}
"""


async def publish_backlog(kafka, count: int) -> None:  # noqa: ANN001
    from envs import get_environment
    from infra.bus import Bus
    from infra.topics import create_topics
    from schemas import topics
    from schemas.events import RolloutRequest

    env = get_environment("household")
    rng = random.Random(5)
    tasks = [env.sample_task(2, rng) for _ in range(64)]
    await create_topics(kafka)
    async with Bus(kafka, role="bench") as bus:
        requests = [
            RolloutRequest(request_id=f"scale-{i}", task=tasks[i % len(tasks)], n=4) for i in range(count)
        ]
        await bus.send_many(topics.ROLLOUT_REQUESTS, [(r.request_id, r) for r in requests])


async def produced(kafka) -> list[tuple[float, str]]:  # noqa: ANN001
    from infra.bus import Bus
    from schemas import topics

    async with Bus(kafka, role="bench") as bus:
        return [
            (r.timestamp_ms / 1000.0, r.value.actor_id) for r in await bus.read_topic(topics.TRAJECTORIES)
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="1,2,4,8")
    parser.add_argument("--step-s", type=float, default=0.2, help="stub generation time per batch")
    parser.add_argument("--episodes", type=int, default=8, help="parallel episodes per actor")
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "actor_scaling.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import msgspec

    from benchmarks import child_env
    from infra.broker import Broker
    from schemas.config import KafkaConfig

    env = child_env()
    counts = [int(x) for x in args.actors.split(",")]
    rows = []
    with Broker() as broker, tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "actor.toml"
        config.write_text(CONFIG.format(episodes=args.episodes, step_s=args.step_s))
        for k in counts:
            kafka = msgspec.structs.replace(KafkaConfig(bootstrap=broker.bootstrap),
                                            topic_prefix=f"scale{uuid.uuid4().hex[:6]}.")  # fmt: skip
            # never drained: as if every episode took 2 steps, for the window plus 2 minutes of start-up
            need = int(k * args.episodes / (2 * args.step_s) * (args.window_s + args.warmup_s + 120) / 4)
            anyio.run(publish_backlog, kafka, need)
            argv = [sys.executable, "-m", "app.cli", "run", "actor", "--bootstrap", kafka.bootstrap,
                    "--topic-prefix", kafka.topic_prefix, "--workdir", str(Path(tmp) / "run"), "--config", str(config)]  # fmt: skip
            procs = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(Path(tmp) / f"a{k}-{i}.log", "wb"),  # noqa: SIM115
                                      stderr=subprocess.STDOUT) for i in range(k)]  # fmt: skip
            try:
                deadline = time.time() + 300
                while len({a for _, a in anyio.run(produced, kafka)}) < k:
                    if time.time() > deadline or any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"{k} actors: not all produced within 300 s (logs in {tmp})")
                    time.sleep(1.0)
                t0 = time.time() + args.warmup_s
                time.sleep(args.warmup_s + args.window_s + 1.0)
                rows_k = anyio.run(produced, kafka)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        p.kill()
            in_window = [a for t, a in rows_k if t0 <= t < t0 + args.window_s]
            rate = len(in_window) / args.window_s
            rows.append({"actors": k, "trajectories_per_s": rate, "active_actors": len(set(in_window))})
            print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["trajectories_per_s"] if rows and rows[0]["actors"] == 1 else None
    for row in rows:
        row["speedup"] = row["trajectories_per_s"] / base if base else None
    result = {"machine": "2 cores, no GPU", "stub_step_s": args.step_s, "episodes_per_actor": args.episodes,
              "window_s": args.window_s, "rows": rows, "goal": "8 actors >= 7.6x one"}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("| actors | trajectories / s | speedup |\n|---|---|---|")
    for row in rows:
        print(f"| {row['actors']} | {row['trajectories_per_s']:.1f} | {row['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
