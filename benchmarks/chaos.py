"""bench chaos: kill -9 the roles of a live durable run, and the broker with its store once; nothing is
lost or trained twice, versions have no gap, and the run keeps learning.

One durable `forgestream up --minutes M --separate-light-roles` (each role its own process, evaluator
off). Once its first trajectory is judged, every `--every-s` seconds for `--chaos-minutes` the bench
kills -9 the next role process of a shuffled rotation (actors, judge, signals, forge, scheduler, env
model, learners: every role once per round, so none fails often enough within `up`'s healthy period to
count as a crash loop); half-way, it kills -9 the broker (Tansu) and its store (s3rver) together, and
at three quarters it freezes the broker (SIGSTOP) for `--freeze-s` seconds: an outage `up` cannot
end by restarting it. `up` restarts what died. The run then goes on to its end without faults.
Afterwards, from the topics (read from the broker's data) and the learners' checkpoint lineage:
- rollout requests lost: requests sent at least `--settle-s` before the run's last trajectory that
  never got all of their trajectories; and of those, the ones the broker lost (sent before its kill,
  a missing trajectory's partition kept no record from before it);
- trajectories judged more than once (redeliveries after a kill: expected), and samples trained twice
  (the learners' lineage, policy and reward: must be 0);
- policy and reward versions published: gap-free from 0 to the newest;
- the run's newest policy against the preset on held-out tasks of the training band (`forgestream eval`,
  the default `scheduler.seed_difficulty`);
- restarts per role, and `up`'s exit code (0: no crash loop ended the run).
Writes benchmarks/results/chaos.json.

    python benchmarks/chaos.py [--minutes 10] [--chaos-minutes 5] [--every-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio

from schemas.config import SchedulerConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ROLES = ("actor", "judge", "signals", "forge", "scheduler", "env-model", "policy-learner", "reward-learner")
BAND = SchedulerConfig().seed_difficulty  # the held-out check's level: the one the run trains on


def children(pid: int) -> dict[int, list[str]]:
    """pid -> argv of the processes whose parent is `pid`."""
    out = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, IndexError):
            continue
        if int(stat[1]) == pid and stat[0] != "Z":
            out[int(entry)] = argv
    return out


def role_pid(up: int, role: str) -> int | None:
    return next((pid for pid, argv in children(up).items() if argv[-3:-1] == ["run", role]), None)


def broker_pids(up: int) -> list[int]:
    """Tansu and s3rver (node), `up`'s children that are not roles."""
    return [pid for pid, argv in children(up).items() if "run" not in argv and any(
        "tansu" in a or "s3rver" in a for a in argv)]  # fmt: skip


async def read_run(bootstrap: str) -> dict:
    from infra.bus import Bus
    from schemas import topics
    from schemas.config import KafkaConfig

    async with Bus(KafkaConfig(bootstrap=bootstrap), role="chaos") as bus:
        requests = await bus.read_topic(topics.ROLLOUT_REQUESTS, latest_per_key=False)
        trajectories = await bus.read_topic(topics.TRAJECTORIES, latest_per_key=False)
        judged = await bus.read_topic(topics.JUDGED, latest_per_key=False)
        weights = await bus.read_topic(topics.WEIGHTS, latest_per_key=False)
    return {
        "requests": [(r.value.request_id, r.value.n, r.timestamp_ms / 1000) for r in requests],
        "trajectories": [(r.value.key, r.partition, r.timestamp_ms / 1000) for r in trajectories],
        "judged": [r.value.key for r in judged],
        "weights": [(w.value.model, w.value.version) for w in weights],
    }


def trajectory_partition(key: str, partitions: int) -> int:
    """The partition a trajectory keyed `key` goes to: the producer's own partitioner (murmur2, as
    Kafka's Java client), so a trajectory that never arrived still has a place it would have been."""
    from aiokafka.partitioner import DefaultPartitioner

    every = list(range(partitions))
    return DefaultPartitioner()(key.encode(), every, every)


def lost_requests(run: dict, settle_s: float, broker_killed_at: float | None = None) -> dict:
    """Settled requests without all their trajectories; of those, the ones the broker lost: sent before
    its kill, with a missing trajectory whose partition (by its own key, `request_id/index`) kept no
    record from before the kill."""
    from schemas.topics import TOPICS, TRAJECTORIES

    partitions = TOPICS[TRAJECTORIES].partitions
    last = max((t for _, _, t in run["trajectories"]), default=0.0)
    produced: dict[str, set[str]] = {}
    for key, _, _ in run["trajectories"]:
        request_id, index = key.rsplit("/", 1)
        produced.setdefault(request_id, set()).add(index)
    old = {rid: n for rid, n, t in run["requests"] if t <= last - settle_s}
    lost = sorted(rid for rid, n in old.items() if len(produced.get(rid, ())) < n)
    emptied: set[int] = set()
    by_broker: list[str] = []
    if broker_killed_at is not None:
        kept = {p for _, p, t in run["trajectories"] if t < broker_killed_at}
        sent_at = {rid: t for rid, _, t in run["requests"]}
        for rid in lost:
            missing = [f"{rid}/{i}" for i in range(old[rid]) if str(i) not in produced.get(rid, ())]
            gone = {trajectory_partition(key, partitions) for key in missing} - kept
            if sent_at[rid] < broker_killed_at and gone:
                by_broker.append(rid)
                emptied |= gone
    return {"requests": len({rid for rid, _, _ in run["requests"]}), "settled_requests": len(old),
            "lost": len(lost), "lost_ids": lost[:20], "lost_with_the_broker": len(by_broker),
            "trajectory_partitions_emptied_by_the_broker": sorted(emptied)}  # fmt: skip


def versions(run: dict, model: str) -> dict:
    seen = sorted({v for m, v in run["weights"] if m == model})
    newest = seen[-1] if seen else -1
    return {"newest": newest, "gaps": sorted(set(range(newest + 1)) - set(seen))}


def trained_twice(workdir: Path) -> dict:
    from learners.checkpoint import read_lineage

    out = {}
    for model in ("policy", "reward"):
        # a batch's later epochs (PPO's passes over it) train its keys again by design: count the first
        keys = [
            k for e in read_lineage(workdir / "checkpoints" / model) if not e.get("epoch") for k in e["keys"]
        ]
        out[model] = {"trained": len(keys), "twice": sum(n - 1 for n in Counter(keys).values() if n > 1)}
    return out


def evaluate(workdir: Path, policy: str, env: dict[str, str]) -> float:
    out = workdir / f"eval-{policy}.json"
    subprocess.run([sys.executable, "-m", "app.cli", "eval", "--policy", policy, "--levels", str(BAND), "--tasks", "40",
                    "--modes", "sampled", "--seed", "0", "--json", str(out), "--workdir", str(workdir)],
                   cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    return json.loads(out.read_text())["policy_results"]["sampled"][str(BAND)]["success"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the run")
    parser.add_argument("--chaos-minutes", type=float, default=5.0, help="how long roles are killed")
    parser.add_argument("--every-s", type=float, default=20.0, help="seconds between kills")
    parser.add_argument("--settle-s", type=float, default=150.0,
                        help="a request this much older than the last trajectory must be complete")  # fmt: skip
    parser.add_argument("--freeze-s", type=float, default=60.0, help="how long the broker is frozen once")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks import child_env, restarts, start_up, wait_for_live
    from infra.broker import Broker

    env = child_env(FORGESTREAM_EVALUATOR__ENABLED="false")
    workdir, up = start_up("bench-chaos", args.minutes, env, "--separate-light-roles")
    kills: list[dict] = []
    try:
        wait_for_live(workdir, up, timeout_s=600)
        rng = random.Random(args.seed)
        rotation: list[str] = []
        start = time.monotonic()
        broker_killed = broker_frozen = False
        broker_killed_at: float | None = None
        while time.monotonic() - start < args.chaos_minutes * 60 and up.poll() is None:
            time.sleep(args.every_s)
            if not broker_frozen and time.monotonic() - start >= args.chaos_minutes * 45:
                tansu = [pid for pid, argv in children(up.pid).items() if argv and argv[0].endswith("tansu")]
                for pid in tansu:
                    os.kill(pid, signal.SIGSTOP)
                time.sleep(args.freeze_s)
                for pid in tansu:
                    os.kill(pid, signal.SIGCONT)
                kills.append({"at_s": round(time.monotonic() - start, 1), "what": f"broker frozen {args.freeze_s:g} s",
                              "pids": tansu})  # fmt: skip
                broker_frozen = True
                continue
            if not broker_killed and time.monotonic() - start >= args.chaos_minutes * 30:
                pids = broker_pids(up.pid)
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                kills.append(
                    {"at_s": round(time.monotonic() - start, 1), "what": "broker + store", "pids": pids}
                )
                broker_killed_at = time.time()
                broker_killed = True
                continue
            if not rotation:
                rotation = rng.sample(ROLES, len(ROLES))
            role = rotation.pop()
            pid = role_pid(up.pid, role)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            kills.append(
                {"at_s": round(time.monotonic() - start, 1), "what": role, "pids": [pid] if pid else []}
            )
            print(kills[-1], flush=True)
        up_code = up.wait()
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(120)
    with Broker(durable=True, data_dir=workdir / "broker") as broker:  # the run's data, read back
        run = anyio.run(read_run, broker.bootstrap)
    judged = Counter(run["judged"])
    result = {
        "machine": "2 cores, no GPU", "minutes": args.minutes, "chaos_minutes": args.chaos_minutes,
        "every_s": args.every_s, "kills": kills, "up_exit_code": up_code, "restarts": restarts(workdir),
        "rollout_requests": lost_requests(run, args.settle_s, broker_killed_at),
        "trajectories": len({k for k, _, _ in run["trajectories"]}),
        "judged_more_than_once": sum(1 for n in judged.values() if n > 1),
        "samples_trained_twice": trained_twice(workdir),
        "policy_versions": versions(run, "policy"), "reward_versions": versions(run, "reward"),
        "heldout": {"level": BAND, "preset": evaluate(workdir, "preset", env),
                    "latest": evaluate(workdir, "latest", env)},  # fmt: skip
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "kills"}, indent=1))


if __name__ == "__main__":
    main()
