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
    from schemas.config import KafkaConfig, ModelConfig

    wait_ms = os.environ.get("FANOUT_FETCH_MAX_WAIT_MS")
    if wait_ms:  # experiment: the consumer's long-poll wait bounds how soon a new event is seen
        import infra.bus

        base = infra.bus.consumer_options
        infra.bus.consumer_options = lambda kafka, group: (
            base(kafka, group) | {"fetch_max_wait_ms": int(wait_ms)}
        )

    backend = load_backend(
        ModelConfig(bootstrap_sft_seconds=bootstrap_seconds), role="policy", workdir=WORKDIR
    )
    store = WeightStore(store_url)

    async def main() -> None:
        async with Bus(KafkaConfig(bootstrap=bootstrap, topic_prefix=prefix), role="fanout") as bus:
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bootstrap-seconds", type=float, default=5.0, help="tiny preset SFT (cached)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "weight_fanout.json"))
    args = parser.parse_args()

    import anyio
    import torch

    torch.set_num_threads(1)
    from infra.broker import Broker
    from infra.bus import Bus
    from infra.models import load_trainable
    from infra.topics import create_topics
    from infra.weights import WeightStore
    from schemas.config import KafkaConfig, ModelConfig
    from schemas.topics import WEIGHTS

    model_config = ModelConfig(bootstrap_sft_seconds=args.bootstrap_seconds)
    model, tok = load_trainable(model_config, role="policy", workdir=WORKDIR)
    results: list[dict[str, object]] = []
    store_dir = WORKDIR / f"fanout-store-{uuid.uuid4().hex[:8]}"
    with Broker() as broker:
        for count in args.counts:
            prefix = f"fanout{count}-{uuid.uuid4().hex[:6]}."
            kafka = KafkaConfig(bootstrap=broker.bootstrap, topic_prefix=prefix)
            anyio.run(create_topics, kafka)
            store = WeightStore(str(store_dir / f"n{count}"), keep_last=3)
            lines: queue.Queue[tuple[int, str]] = queue.Queue()
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
            code = (
                "from benchmarks.weight_fanout import worker; "
                f"worker({broker.bootstrap!r}, {prefix!r}, {str(store.url)!r}, {args.bootstrap_seconds!r})"
            )
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
                )
                for _ in range(count)
            ]

            def pump(i: int, stream) -> None:
                for line in stream:
                    lines.put((i, line.strip()))

            for i, p in enumerate(procs):
                threading.Thread(target=pump, args=(i, p.stdout), daemon=True).start()

            def wait_for(prefix_text: str, n: int, timeout: float) -> list[str]:
                got: dict[int, str] = {}
                deadline = time.time() + timeout
                while len(got) < n:
                    i, line = lines.get(timeout=max(0.01, deadline - time.time()))
                    if line.startswith(prefix_text):
                        got[i] = line
                return list(got.values())

            try:
                wait_for("ready", count, 600)
                latencies, publish_s, event_s = [], [], []

                async def publish(version: int) -> float:
                    async with Bus(kafka, role="fanout-bench") as bus:
                        t0 = time.time()
                        ev = store.publish("policy", version, model, tok)
                        t_written = time.time()
                        await bus.send(WEIGHTS, ev, key="policy")
                        publish_s.append(t_written - t0)
                        return t0

                for version in range(1, args.rounds + 2):  # version 1 warms every watcher up
                    with torch.no_grad():
                        for p in model.parameters():
                            p.add_(torch.randn_like(p) * 1e-3)
                    t0 = anyio.run(publish, version)
                    served = wait_for(f"served {version} ", count, 120)
                    if version > 1:
                        latencies.append(max(float(s.split()[2]) for s in served) - t0)
                        event_s.append(max(float(s.split()[3]) for s in served) - t0)
                read_s = file_read_seconds(Path(store.uri("policy", args.rounds + 1)) / "model.safetensors")
                goal = 1.5 * read_s + 0.1
                results.append(
                    {
                        "watchers": count,
                        "rounds": args.rounds,
                        "latency_median_s": statistics.median(latencies),
                        "latency_max_s": max(latencies),
                        "latencies_s": latencies,
                        "publish_write_median_s": statistics.median(publish_s[1:]),
                        "event_seen_median_s": statistics.median(event_s),
                        "file_read_s": read_s,
                        "goal_s": goal,
                        "meets_goal": statistics.median(latencies) <= goal,
                    }
                )
                print(json.dumps(results[-1]), flush=True)
            finally:
                for p in procs:
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
    weights_bytes = (Path(store.uri("policy", args.rounds + 1)) / "model.safetensors").stat().st_size
    report = {
        "benchmark": "weight_fanout",
        "model": "tiny (policy preset)",
        "weights_bytes": weights_bytes,
        "machine": f"{os.cpu_count()} CPUs, shared; torch threads 1 per process",
        "latency": "start of WeightStore.publish -> last watcher serving the version (fetch+sha256+load)",
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
