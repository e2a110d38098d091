"""`forgestream eval`: a policy or several, paired task by task (and optionally reward models) on held-out
tasks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli import ConfigOpt, app, build_config, domain_flags, fail

MODES = ("sampled", "greedy", "redraw")
REDRAW = 8  # answers drawn per turn in the redraw mode unless --redraw says


def parse_levels(text: str) -> list[int]:
    """ "0,2,4" or "0-3" or a mix -> sorted distinct levels."""
    levels: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = part.split("-", 1)
                levels.update(range(int(lo), int(hi) + 1))
            elif part:
                levels.add(int(part))
    except ValueError:
        fail(f"--levels: {text!r} is not a list of levels such as 0,2,4 or 0-3")
    if not levels or min(levels) < 0:
        fail(f"--levels: {text!r} names no level >= 0")
    return sorted(levels)


def resolve_model(spec: str, role: str, model_cfg: Any, run: Any) -> Path:
    """`preset`, `vN` / `latest` (the run's weight store), `hf:PATH` or a folder -> an HF folder."""
    from infra.models import prepare_preset
    from infra.weights import WeightStore

    if spec == "preset":
        return prepare_preset(model_cfg, role=role, workdir=Path(run.workdir))  # type: ignore[arg-type]
    if spec == "latest" or (spec.startswith("v") and spec[1:].isdigit()):
        store = WeightStore.for_run(run)
        versions = store.versions(role)
        if not versions:
            fail(f"{spec}: no {role} version in {store.url} (give --workdir of a run)")
        version = versions[-1] if spec == "latest" else int(spec[1:])
        if version not in versions:
            fail(f"{spec}: the store keeps {role} versions {versions}")
        if not store.local:
            fail(f"{spec}: the weight store {store.url} is remote; give a downloaded folder instead")
        return Path(store.uri(role, version))
    folder = Path(spec[3:] if spec.startswith("hf:") else spec).expanduser()
    if not (folder / "config.json").is_file():
        fail(f"{spec}: expected preset, latest, vN or a Hugging Face model folder")
    return folder


@app.command("eval")
def evaluate(
    policy: Annotated[
        str,
        typer.Option(
            help="preset, latest, vN (of --workdir's run), hf:PATH or a folder; comma-separated, each after "
            "the first also plays the same tasks and is paired with the first task by task (McNemar's exact test)."
        ),
    ] = "preset",
    reward_model: Annotated[
        str | None,
        typer.Option(
            help="Also measure this reward model's process accuracy (same forms); comma-separated, each "
            "after the first is also compared with the first on the same steps (McNemar's exact test)."
        ),
    ] = None,
    domain: Annotated[
        str | None,
        typer.Option(help="Task domain, also the tiny presets' bootstrap domain (default: the config's)."),
    ] = None,
    levels: Annotated[str, typer.Option(help="Difficulty levels, e.g. 0,2,4 or 0-3.")] = "0-2",
    tasks: Annotated[
        int,
        typer.Option(
            min=1,
            max=100_000,
            help="Held-out tasks per level (200: ± 0.07 at 95 %; 40 gave ± 0.15, wider than this loop's effects).",
        ),
    ] = 200,
    modes: Annotated[
        str,
        typer.Option(
            help="sampled (policy temperature), greedy, redraw (sampled, an invalid answer redrawn: the first "
            "valid of --redraw is played), comma-separated, or none (only --reward-model)."
        ),
    ] = "sampled,greedy",
    redraw: Annotated[
        int | None,
        typer.Option(
            min=2,
            max=64,
            help=f"Answers drawn per turn in the redraw mode (as actor.redraw plays; {REDRAW}).",
        ),
    ] = None,
    max_steps: Annotated[int, typer.Option(min=1, max=200)] = 40,
    m: Annotated[
        int | None, typer.Option(min=1, max=64, help="Verdicts per step (default: judge.m).")
    ] = None,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the result here.")] = None,
    config: ConfigOpt = None,
    workdir: Annotated[Path | None, typer.Option(help="The run whose versions vN / latest name.")] = None,
) -> None:
    """Held-out success per level (95 % Wilson interval, invalid answers, mean steps), sampled and
    greedy; with --reward-model, process accuracy against the environment's step labels."""
    flags: dict[str, Any] = domain_flags(domain)
    if workdir is not None:
        flags["workdir"] = str(workdir)
    cfg = build_config(config, flags)
    wanted = [w.strip() for w in modes.split(",") if w.strip() and w.strip() != "none"]
    if (not wanted and modes.strip() != "none") or any(w not in MODES for w in wanted):
        fail(f"--modes: {modes!r}; expected some of {', '.join(MODES)} (comma-separated) or none")
    policies = _distinct_models("--policy", policy)
    reward_models = _distinct_models("--reward-model", reward_model) if reward_model is not None else []
    if len(policies) > 1 and not wanted:
        fail(f"--policy {policy!r} compares policies, and --modes none plays none")
    if not wanted and reward_model is None:
        fail("--modes none measures nothing without --reward-model")
    if redraw is not None and "redraw" not in wanted:
        fail(f"--redraw {redraw} sets the redraw mode's draws, and --modes {modes!r} does not play it")
    redraw = redraw or REDRAW
    level_list = parse_levels(levels)

    from envs import get_environment
    from infra.models.hf_backend import HFBackend
    from pipeline.evaluation import (
        evaluate_policy,
        outcome_as_verdict,
        paired_comparison,
        play_heldout,
        process_accuracy,
    )

    env = get_environment(cfg.scheduler.domain)
    if level_list[-1] >= env.levels:
        fail(f"--levels: {cfg.scheduler.domain} has levels 0..{env.levels - 1}")
    # every reward model resolved (or the flag failed) before anything is loaded or played
    folders = {name: resolve_model(name, "reward", cfg.reward_model, cfg) for name in reward_models}
    pm = cfg.policy_model
    policy_folders = {name: resolve_model(name, "policy", pm, cfg) for name in policies}
    temps = {"sampled": pm.temperature, "greedy": 0.0, "redraw": pm.temperature}

    def play(backend: HFBackend) -> dict[str, dict[str, dict[str, Any]]]:
        # the held-out tasks of a level are fixed and the draws seeded: every policy plays the same games
        return evaluate_policy(backend, cfg.scheduler.domain, level_list, tasks,
                               temperatures={w: temps[w] for w in wanted}, max_tokens=pm.max_new_tokens,
                               max_steps=max_steps, seed=seed, redraws={"redraw": redraw})  # fmt: skip

    first_policy = policies[0]
    backend = HFBackend(policy_folders[first_policy], dtype=pm.dtype, device=pm.device)
    result: dict[str, Any] = {
        "domain": cfg.scheduler.domain,
        "policy": first_policy,
        "tasks_per_level": tasks,
        "max_steps": max_steps,
        "seed": seed,
        **({"redraw": redraw} if "redraw" in wanted else {}),
        "policy_results": play(backend),
    }
    if reward_model is not None:
        rm = cfg.reward_model
        episodes = [e for level in level_list
                    for e in play_heldout(backend, cfg.scheduler.domain, level, tasks, temperature=pm.temperature,
                                          max_tokens=pm.max_new_tokens, max_steps=max_steps, seed=seed + 1)]  # fmt: skip
        steps = [s for e in episodes for s in e.steps]
        measured = {
            name: process_accuracy(
                HFBackend(folder, dtype=rm.dtype, device=rm.device),
                steps,
                m=m or cfg.judge.m,
                temperature=rm.temperature,
                max_tokens=cfg.judge.max_new_tokens,
                seed=seed,
            )
            for name, folder in folders.items()
        }
        first = reward_models[0]
        result["reward_model"] = first
        result["process_accuracy"] = measured[first]
        base = measured[first].get("right", "")
        result["compared"] = {
            name: {"process_accuracy": pa, "paired": paired_comparison(base, pa.get("right", ""))}
            for name, pa in measured.items()
            if name != first
        }
        result["outcome_as_verdict"] = outcome_as_verdict(episodes)
    del backend  # one policy in memory at a time
    base_results = result["policy_results"]
    if len(policies) > 1:
        result["policy_compared"] = {}
    for name in policies[1:]:
        theirs = play(HFBackend(policy_folders[name], dtype=pm.dtype, device=pm.device))
        paired = {mode: {level: paired_comparison(r["solved"], theirs[mode][level]["solved"])
                         for level, r in by_level.items()}
                  for mode, by_level in base_results.items()}  # fmt: skip
        result["policy_compared"][name] = {"policy_results": theirs, "paired": paired}
    _print(result)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=1))


def _distinct_models(flag: str, text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or len(set(names)) < len(names):
        fail(f"{flag}: {text!r}; expected one or more distinct models, comma-separated")
    return names


def _print(result: dict[str, Any]) -> None:
    from rich.console import Console

    console = Console(soft_wrap=True)  # a pipe or a log gets 80 columns: each result stays one line
    if result["policy_results"]:
        _print_policy(console, result, result["policy"], result["policy_results"])
    for name, c in result.get("policy_compared", {}).items():
        _print_policy(console, result, name, c["policy_results"])
        for mode, by_level in c["paired"].items():
            for level, d in by_level.items():
                console.print(
                    f"  {mode}, level {level}, "
                    + _paired_line(d, result["policy"], "tasks", "won where it lost", "lost where it won")
                )
    pa = result.get("process_accuracy")
    if pa:
        _print_process_accuracy(console, result["reward_model"], pa)
    for name, c in result.get("compared", {}).items():
        _print_process_accuracy(console, name, c["process_accuracy"])
        d = c["paired"]
        console.print(
            "  "
            + _paired_line(
                d, result["reward_model"], "steps", "right where it was wrong", "wrong where it was right"
            )
        )
    ov = result.get("outcome_as_verdict")
    if ov and ov.get("steps"):
        console.print(
            f"a judge that repeats each episode's outcome (where the consistency reward leads): process accuracy "
            f"{ov['accuracy']:.3f} (balanced {ov['balanced_accuracy']:.3f}, says good {ov['said_good']:.2f})"
        )


def _paired_line(d: dict[str, Any], first: str, items: str, gained: str, lost: str) -> str:
    """One `paired_comparison` in words, for judges (steps) and policies (tasks)."""
    return (
        f"against {first} on the same {d['items']} {items}: {gained} {d['b_only']}, {lost} {d['a_only']}; "
        f"difference {d['difference']:+.3f}, McNemar's exact p = {d['p_value']:.3g}"
    )


def _print_process_accuracy(console: Any, name: str, pa: dict[str, Any]) -> None:
    if not pa.get("steps"):
        console.print(f"reward model {name}: no labelled steps")
        return
    console.print(
        f"reward model {name}: process accuracy {pa['accuracy']:.3f} (balanced {pa['balanced_accuracy']:.3f}) on "
        f"{pa['steps']} steps (valid {pa['valid']['accuracy']:.3f}, invalid {pa['invalid']['accuracy']:.3f}; "
        f"says good {pa['said_good']:.2f}, labels good {pa['good_label_rate']:.2f}, unparseable {pa['unparseable']:.2f})"
    )  # fmt: skip
    console.print(
        "by step index: "
        + ", ".join(f"{k}: {v['accuracy']:.2f} ({v['steps']})" for k, v in pa["by_step"].items())
    )


def _print_policy(console: Any, result: dict[str, Any], name: str, by_mode: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=f"held-out {result['domain']} — policy {name}, {result['tasks_per_level']} tasks/level"
    )
    for col in ("mode", "level", "success", "95% CI", "invalid", "steps"):
        table.add_column(col, justify="right")
    for mode, by_level in by_mode.items():
        for level, r in by_level.items():
            table.add_row(mode, level, f"{r['success']:.2f}", f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
                          f"{r['invalid_rate']:.2f}", f"{r['mean_steps']:.1f}")  # fmt: skip
    console.print(table)
