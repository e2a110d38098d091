"""Weight fan-out: publish a version -> 1, 2, 4, 8 watcher processes serving it.

Each watcher process is what runs beside an actor: a transformers backend of the tiny preset, a
`WeightsWatcher` following forge.weights on a real (embedded Tansu) broker, and on every new event
`store.fetch` (sha256 + safetensors checks) then `backend.load_weights`. It prints the wall-clock
time at which it serves each version. The latency of one round is the time from the start of
`WeightStore.publish` (safetensors written, hashed, renamed, event sent) to the last watcher
serving it. Goal: flat in the watcher count and <= 1.5 x one file read + 100 ms.

    .venv/bin/python -m benchmarks.weight_fanout [--counts 1 2 4 8] [--rounds 5]
Writes benchmarks/results/weight_fanout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKDIR = REPO / ".work" / "bench"


def worker(bootstrap: str, prefix: str, store_url: str, bootstrap_seconds: float) -> None:
    """One watcher process: serve every new policy version and report when it does."""
    import anyio
    import torch

    torch.set_num_threads(1)
    from infra.bus import Bus
    from infra.models import load_backend
    from infra.weights import WeightStore, WeightsWatcher
    from learners import tiny_preset  # noqa: F401  (registers the `tiny` preset's recipe)
    from schemas.config import KafkaConfig, ModelConfig

    # experiment: the watcher's long-poll wait bounds how soon a new event is seen
    wait_ms = os.environ.get("FANOUT_FETCH_MAX_WAIT_MS")
    follow = {"follow_wait_s": int(wait_ms) / 1000} if wait_ms else {}

    backend = load_backend(
        ModelConfig(bootstrap_sft_seconds=bootstrap_seconds), role="policy", workdir=WORKDIR
    )
    store = WeightStore(store_url)

    async def main() -> None:
        async with Bus(KafkaConfig(bootstrap=bootstrap, topic_prefix=prefix, **follow), role="fanout") as bus:
            watcher = WeightsWatcher(bus, store, "policy")
            async with anyio.create_task_group() as tg:
                tg.start_soon(watcher.run)
                print("ready", flush=True)
                while True:
                    await watcher.wait_newer_than(backend.version)
                    seen = time.time()
                    version = watcher.apply(backend)  # fetch + verify + load, inline: nothing else runs here
                    if version is not None:
                        print(f"served {version} {time.time():.6f} {seen:.6f}", flush=True)

    anyio.run(main)


def file_read_seconds(path: Path, repeats: int = 5) -> float:
    """Median time to read the whole weights file (page cache warm, as for the watchers)."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        path.read_bytes()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Watchers:
    """N watcher subprocesses and their stdout lines, merged into one queue."""

    def __init__(self, count: int, bootstrap: str, prefix: str, store_url: str, args: argparse.Namespace):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        if args.fetch_max_wait_ms:
            env["FANOUT_FETCH_MAX_WAIT_MS"] = str(args.fetch_max_wait_ms)
        code = (
            "from benchmarks.weight_fanout import worker; "
            f"worker({bootstrap!r}, {prefix!r}, {store_url!r}, {args.bootstrap_seconds!r})"
        )
        self.lines: queue.Queue[tuple[int, str]] = queue.Queue()
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
            )
            for _ in range(count)
        ]
        for i, p in enumerate(self.procs):
            threading.Thread(target=self._pump, args=(i, p.stdout), daemon=True).start()

    def _pump(self, i: int, stream) -> None:
        for line in stream:
            self.lines.put((i, line.strip()))

    def wait_for(self, prefix_text: str, timeout: float) -> list[str]:
        """One line starting with `prefix_text` from every watcher."""
        got: dict[int, str] = {}
        deadline = time.time() + timeout
        while len(got) < len(self.procs):
            i, line = self.lines.get(timeout=max(0.01, deadline - time.time()))
            if line.startswith(prefix_text):
                got[i] = line
        return list(got.values())

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_count(count: int, bootstrap: str, store_dir: Path, model, tok, args: argparse.Namespace) -> dict:
    import anyio
    import torch

    from infra.bus import Bus
    from infra.topics import create_topics
    from infra.weights import WeightStore
    from schemas.config import KafkaConfig
    from schemas.topics import WEIGHTS

    prefix = f"fanout{count}-{uuid.uuid4().hex[:6]}."
    kafka = KafkaConfig(bootstrap=bootstrap, topic_prefix=prefix)
    anyio.run(create_topics, kafka)
    store = WeightStore(str(store_dir / f"n{count}"), keep_last=3)
    latencies, publish_s, event_s = [], [], []

    async def publish(version: int) -> float:
        async with Bus(kafka, role="fanout-bench") as bus:
            t0 = time.time()
            ev = store.publish("policy", version, model, tok)
            publish_s.append(time.time() - t0)
            await bus.send(WEIGHTS, ev, key="policy")
            return t0

    watchers = Watchers(count, bootstrap, prefix, store.url, args)
    try:
        watchers.wait_for("ready", 600)
        for version in range(1, args.rounds + 2):  # version 1 warms every watcher up
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 1e-3)
            t0 = anyio.run(publish, version)
            served = watchers.wait_for(f"served {version} ", 120)
            if version > 1:
                latencies.append(max(float(s.split()[2]) for s in served) - t0)
                event_s.append(max(float(s.split()[3]) for s in served) - t0)
    finally:
        watchers.stop()
    weights = Path(store.uri("policy", args.rounds + 1)) / "model.safetensors"
    read_s = file_read_seconds(weights)
    goal = 1.5 * read_s + 0.1
    return {
        "watchers": count,
        "rounds": args.rounds,
        "latency_median_s": statistics.median(latencies),
        "latency_max_s": max(latencies),
        "latencies_s": latencies,
        "publish_write_median_s": statistics.median(publish_s[1:]),
        "event_seen_median_s": statistics.median(event_s),
        "file_read_s": read_s,
        "weights_bytes": weights.stat().st_size,
        "goal_s": goal,
        "meets_goal": statistics.median(latencies) <= goal,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bootstrap-seconds", type=float, default=5.0, help="tiny preset SFT (cached)")
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=0,
        help="experiment: watchers' consumer long-poll wait (0 = bus default)",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "weight_fanout.json"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(1)
    from infra.broker import Broker
    from infra.models import load_trainable
    from schemas.config import ModelConfig

    model, tok = load_trainable(
        ModelConfig(bootstrap_sft_seconds=args.bootstrap_seconds), role="policy", workdir=WORKDIR
    )
    store_dir = WORKDIR / f"fanout-store-{uuid.uuid4().hex[:8]}"
    results = []
    with Broker() as broker:
        for count in args.counts:
            results.append(run_count(count, broker.bootstrap, store_dir, model, tok, args))
            print(json.dumps(results[-1]), flush=True)
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {"benchmark": "weight_fanout", "runs": {}}
    report["runs"][f"fetch_max_wait_ms={args.fetch_max_wait_ms or 'bus default'}"] = {
        "model": "tiny policy preset (fp32 safetensors)",
        "machine": f"{os.cpu_count()} CPUs shared with other jobs; torch threads 1 per process",
        "latency": "start of WeightStore.publish -> last watcher serving the version (fetch + sha256 + load)",
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
