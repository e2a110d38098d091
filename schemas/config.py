"""Typed, frozen configuration: one object per role, shared parts defined once.

Defaults live only here. `infra.config.load_config` fills these from a TOML file, then
`FORGESTREAM_<SECTION>__<FIELD>` environment variables, then CLI flags; a wrong value fails at
start-up with msgspec's message naming the field (`Expected int >= 1 - at $.actor.batch_episodes`).
Importing this module must stay cheap (no torch): the CLI parses config before heavy imports.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from msgspec import Meta, Struct, field, structs

from schemas.events import Domain

# Domains whose episodes list the actions they accept (admissible()): the actor's redraw needs the list.
LISTED_ACTION_DOMAINS: tuple[Domain, ...] = ("household", "textworld", "textworld-custom")

PosInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
PosFloat = Annotated[float, Meta(gt=0.0, le=1e9)]
NonNegFloat = Annotated[float, Meta(ge=0.0, le=1e9)]
Fraction = Annotated[float, Meta(ge=0.0, le=1.0)]


class Config(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base: unknown keys in a config file are an error, not silently ignored."""

    SECRETS: ClassVar[tuple[str, ...]] = ()
    """Fields whose values never appear in a repr (logs, tracebacks, test reports)."""

    def __repr__(self) -> str:
        shown = (
            f"{name}={'***' if name in self.SECRETS and getattr(self, name) else repr(getattr(self, name))}"
            for name in self.__struct_fields__
        )
        return f"{type(self).__name__}({', '.join(shown)})"


class KafkaConfig(Config, frozen=True, kw_only=True):
    SECRETS: ClassVar[tuple[str, ...]] = ("sasl_password",)

    bootstrap: str = "127.0.0.1:9092"
    """host:port[,host:port] of the brokers."""
    topic_prefix: str = ""
    """Prepended to every topic name so several runs can share one cluster."""
    client_id: str = "forgestream"
    session_timeout_s: Annotated[float, Meta(ge=1.0, le=300.0)] = 10.0
    """Consumer-group session timeout; a dead member's partitions move after this long."""
    heartbeat_interval_s: Annotated[float, Meta(ge=0.1, le=100.0)] = 1.0
    max_poll_interval_s: Annotated[float, Meta(ge=10.0, le=3600.0)] = 600.0
    """A handler may block this long (a training step, a long generation) before the group evicts us."""
    request_timeout_s: Annotated[float, Meta(ge=1.0, le=600.0)] = 30.0
    max_message_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 64 << 20
    idempotent_producer: bool = False
    """Enable on real Kafka; Tansu rejects InitProducerId from aiokafka."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    """Secret: from the config file or FORGESTREAM_KAFKA__SASL_PASSWORD only."""
    ssl_cafile: str | None = None
    dedup_window: Annotated[int, Meta(ge=0, le=10_000_000)] = 100_000
    """Idempotency keys remembered per consumer to drop redelivered events."""
    follow_wait_s: Annotated[float, Meta(ge=0.001, le=30.0)] = 0.5
    """Broker long-poll of group-less followers (weights, tasks, progress): a new record reaches them
    within about this long. An `up` runs ~16 followers: at 0.02 s their idle fetches cost the embedded
    durable broker and its object store more CPU than both judges together (measured, 2 cores)."""
    dlq_enabled: bool = True
    transient_retry_s: Annotated[float, Meta(ge=0.0, le=240.0)] = 120.0
    """A handler's transient faults on one record (OSError, MemoryError, TransientError) are retried
    with backoff this long, then the role stops and restarts (the record is redelivered). Below
    aiokafka's 300 s max poll interval, so retrying never costs the group."""
    transient_strikes: Annotated[int, Meta(ge=0, le=1000)] = 3
    """A record whose transient fault outlasted this many rounds of `transient_retry_s` (restarts
    between them; counted on `forge.strikes`, so across restarts and hosts) goes to the DLQ, where
    `forgestream dlq redrive` sends it back once the fault is fixed. 0: never, restart forever."""
    commit_interval_s: Annotated[float, Meta(ge=0.0, le=3600.0)] = 0.5
    """Handled offsets are committed at most this often (and always at shutdown / revocation)."""


class ModelConfig(Config, frozen=True, kw_only=True):
    preset: str = "tiny"
    """`tiny`, `smollm2-135m`, or `hf:/path/to/local/model`."""
    backend: Literal["transformers", "vllm", "stub"] = "transformers"
    """`stub`: benchmarks only, a random valid answer after `stub_step_s` of wall time and no CPU."""
    stub_step_s: NonNegFloat = 0.2
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    seed: NonNegInt = 0
    max_new_tokens: PosInt = 48
    temperature: Annotated[float, Meta(ge=0.0, le=5.0)] = 0.8
    torch_threads: PosInt = 1
    """Torch behaves as if on one core here; more threads ran slower."""
    bootstrap_sft_seconds: NonNegFloat = 720.0
    """Tiny preset: SFT before RL, in reference seconds (0.6 s per batch-32 step on one core; turned into
    a fixed step count so the build is reproducible). Policy: 720 (1,200 steps, ~15 min here) on
    demonstrations with detours that answer by naming the action (`\\boxed{ open drawer 1}`): held-out
    success 0.89 / 0.73 / 0.45 / 0.21 at levels 2 / 4 / 6 / 8 (sampled; 200 tasks at 6 and 8) before the
    DAgger round (`bootstrap_dagger_rounds`), but 0.78-0.85 of its turns invalid, nearly all in failing
    episodes: an action that is not on the list (a room that is not an exit). 240 (400 steps): 0.37 at
    level 4. The former answers by number (400 steps) won 0.495 at level 4, barely above a random valid
    number (0.445) and below it once the list was shuffled: the policy had learned positions, not
    actions."""
    bootstrap_domains: tuple[Domain, ...] = ("household",)
    """Tiny preset: domains whose oracle demonstrations (or judge prompts) the bootstrap SFT uses."""
    bootstrap_dagger_rounds: NonNegInt | None = None
    """Tiny policy preset: DAgger rounds after the SFT, each playing training tasks with the policy and
    training a third as many steps on the expert's response in the states it reached. Unset: the
    domains' (household 1; TextWorld 2, the second on 64 games per rung where the SFT had 16). Household,
    one round: held-out level 6 / 8 success 0.45 / 0.21 -> 0.77 / 0.49, invalid turns at level 6 0.83 ->
    0.42 (200 tasks each); 400 more demonstration steps instead: 0.49 / 0.82; a second round: 0.79 /
    0.57. 0 = demonstrations only."""
    bootstrap_dagger_levels: tuple[NonNegInt, ...] = (4, 5, 6, 7, 8)
    """Tiny policy preset: levels of the DAgger rounds' training tasks, around the training band."""
    bootstrap_expert: Literal["omniscient", "searching"] = "omniscient"
    """Tiny policy preset: what the expert behind the demonstrations and the DAgger labels knows, on
    domains whose expert has both modes (household). `omniscient`: the whole house (the shortest
    solution from the true state); `searching`: only what the episode has seen (it opens the nearest
    closed receptacle or enters the nearest new room until it has seen what the plan needs). Searching
    built the same level (held-out level 8, 200 tasks: 0.475 sampled, 0.67 redrawn, invalid turns 0.49,
    against 0.46 / 0.72 / 0.55; level 9 0.15 / 0.24 against 0.135 / 0.225): the student's invalid
    answers are misread states, not the expert's knowledge, so omniscient stays the default."""
    bootstrap_prompt_loss: NonNegFloat = 0.5
    """Tiny policy preset (the reward preset's section sets 0): weight of a language-model loss on the
    prompt's tokens, beside the answer's, in the SFT and DAgger steps. The prompt's list of actions
    follows from its observation, so predicting it is practice at the reading an answer needs (which
    receptacle holds which object). At 0.5 the recipe no longer depends on its seed: held-out level 8
    0.46 / 0.48 / 0.51 sampled at seeds 0 / 1 / 2 (200 tasks each), against 0.46 / 0.175 / 0.21
    without; invalid turns 0.49-0.63 either way. 0 = answer only."""
    bootstrap_reading_states: NonNegInt = 400
    """Tiny policy preset: states of the demonstrations' own walks (the DAgger levels) the finished preset
    answers greedily, to record in `bootstrap.json` how often it names a listed action and the expert's
    (`reading`). Answer-only (`bootstrap_prompt_loss` 0) the recipe is seed-sensitive: seed 0 builds a
    preset that reads its list (0.81 listed), seeds 1 and 2 do not (0.46, 0.42; held-out level 8 0.175 and
    0.21 against 0.46), and this shows it at build time; with the prompt loss all three read (0.83 / 0.74
    / 0.84). Not part of the preset's key. 0 = not measured."""
    tiny_width: Annotated[int, Meta(ge=32, multiple_of=32)] = 128
    """Tiny preset: hidden size (feed-forward 3x as wide, one attention head per 32). 192 with 6 layers
    (3.2 M parameters, a 55-minute build here): valid mass 0.51 -> 0.63 but held-out level 8 success
    0.46 -> 0.34 sampled, 0.72 -> 0.565 redrawn (200 tasks each), and half the trajectories per minute."""
    tiny_layers: PosInt = 4
    """Tiny preset: transformer layers."""


class RewardModelConfig(ModelConfig, frozen=True, kw_only=True):
    """The reward model's section: its own defaults live in the class, so that overriding one field
    (a file, `FORGESTREAM_REWARD_MODEL__PRESET`) keeps the others (a section rebuilt from plain
    ModelConfig defaults silently gave judges a different preset than `up` built)."""

    max_new_tokens: PosInt = 24
    bootstrap_sft_seconds: NonNegFloat = 120.0
    """Tiny preset: 120 s (200 steps, ~6 min here), 3/4 of them on judge prompts of `bootstrap_rollouts`
    episodes the tiny policy preset played on training tasks, labelled by the environment and drawn in
    the share they were played (about 3 bad to 1 good), 1/4 on expert-vs-mistake branching steps.
    Process accuracy on held-out steps of the policy preset with its DAgger round (`forgestream eval
    --reward-model preset --levels 8 --tasks 40 --modes none`: majority of m = 3 verdicts at T 0.8,
    1,207 steps): 0.814 (balanced 0.789; invalid steps 1.000, valid ones 0.577), saying good to 0.31
    of steps labelled good 0.27; with the rollouts drawn half good, half bad: 0.816 (balanced 0.839,
    valid 0.602), saying good to 0.39. Earlier, on the AVX-512 build (1,136 steps): 0.811 (balanced
    0.812; its invalid steps 1.000, its valid ones 0.589; with 3/4 of the rollouts' bad examples
    valid-but-wrong, 0.602, not kept). Before the DAgger round (levels 6,8, rollouts at 4-8, 2,673
    steps): 0.943 (balanced 0.954; valid 0.72, invalid 0.986). With the former policy preset that
    answered by number (levels 4,6, 2,801 steps): 0.684 (balanced 0.676); 0.612 at 60 s; 0.499 for the
    former preset (50 steps of branching steps only), which called the expert's kind of step good and
    the policy's mistakes are not of that kind (300 steps of those: balanced 0.52 greedy). Rollouts on
    all 10 levels instead of 2-6: balanced 0.59 greedy against 0.73 (levels 7-9's long failures
    dominate)."""
    bootstrap_rollouts: NonNegInt = 256
    """Tiny reward preset: training episodes the policy preset plays for its data (0 = branching steps only)."""
    bootstrap_rollout_levels: tuple[NonNegInt, ...] = (6, 7, 8, 9)
    """Tiny reward preset: levels of those episodes, around the training band (`seed_difficulty`)."""
    bootstrap_policy_sft_seconds: NonNegFloat = 720.0
    """Tiny reward preset: the SFT length of the tiny policy preset that plays those episodes."""
    bootstrap_prompt_loss: NonNegFloat = 0.0
    """Tiny reward preset: answer only. Its answer is a verdict on a step, not a copy from a list, and
    its process accuracy was measured that way; the policy that plays its episodes keeps the policy
    default (0.5). Rebuilt from that policy's rollouts: process accuracy 0.817 (balanced 0.808; valid
    steps 0.601, invalid 0.997; says good 0.35 of 1,083 steps labelled good 0.29), as the former pair's."""


class StoreConfig(Config, frozen=True, kw_only=True):
    weights_url: str = ""
    """Weight store (directory or fsspec URL); empty = <workdir>/weights."""
    keep_last: PosInt = 5
    """Versions kept per model; older folders are pruned."""


class SchedulerConfig(Config, frozen=True, kw_only=True):
    domain: Domain = "household"
    seed_tasks: PosInt = 16
    """Tasks created at start when the task pool is empty (paper: 16)."""
    seed_difficulty: NonNegInt = 8
    """Level of the seed tasks: the band where the tiny preset fails about half the time (held-out
    success 0.49 at level 8; 0.77 at 6, 0.12 at 9), so groups have mixed outcomes and the policy has
    something to learn."""
    rollouts_per_task: Annotated[int, Meta(ge=2, le=1024)] = 8
    """n: rollouts in one group (paper: 8)."""
    max_concurrent_requests: PosInt = 8
    """AReaL capacity: rollout requests in flight at once."""
    poll_s: PosFloat = 0.5
    request_timeout_s: PosFloat = 900.0
    """A request whose group is still unjudged after this long stops counting as running."""


class ActorConfig(Config, frozen=True, kw_only=True):
    parallel_episodes: PosInt = 8
    """Episodes stepped together; generation is batched across them."""
    max_steps: Annotated[int, Meta(ge=1, le=200)] = 40
    redraw: Annotated[int, Meta(ge=1, le=64)] | None = None
    """Answers sampled per turn; the first that names a listed action is played (all invalid: the first),
    as `forgestream eval --modes redraw` plays (1 = the paper: every answer is played). The played
    answer carries its own logprobs; the invalid draws passed over ride along on the step
    (`Step.rejected`) and train only under `signals.invalid_penalty`. Domains without a list of actions
    need 1. Unset: 8 on domains that list their actions (`LISTED_ACTION_DOMAINS`), 1 elsewhere (the run
    config resolves it), because 1 loses the band in every household run measured here. At 8, 12-minute
    runs (held-out level 8, 200 tasks) kept the band where the defaults lost it (sampled 0.435 / 0.405
    on run seeds 0 / 1 against 0.11 / 0.185; the preset 0.46) and taught the format (invalid turns
    0.55 -> 0.43 / 0.48; 0.38 with a fresh task per group), but the choice among valid actions got worse
    (0.72 -> 0.60 / 0.625 redrawn; outcome only 0.595): valid turns drift to "go to" (0.66 -> 0.77).
    With policy_learner.lr 3e-5 the choice held (0.705 / 0.75 redrawn) and sampled play ended at 0.48 /
    0.50 (seeds 0 / 1, 12 and 15 minutes), inside the preset's interval; run 30 minutes (seed 0, v40) it
    learned the format (invalid turns 0.31, none valid of 8 0.03) and lost the choice (0.345 sampled,
    0.51 redrawn): the smaller step delays the harm, it does not remove it. With the listed-conditional
    term (policy_learner.listed_conditional, on with the redraw) long runs keep the band; the 15-minute
    `make run` with these defaults ends at 0.50 [0.43, 0.57] sampled, 0.755 redrawn (seed 0, v6):
    the preset's level, not a gain."""
    min_version_wait_s: NonNegFloat = 30.0
    """How long a request waits for its min_policy_version to be published before running anyway."""
    swap_weights: Literal["every_turn", "between_episodes"] = "every_turn"
    """every_turn: a new policy version is loaded between two turns of running episodes (an episode may
    span versions; each step records its own). between_episodes: no new episode starts while a newer
    version waits; it is loaded once the running episodes end (one version per episode, less throughput)."""


VerdictSource = Literal["model", "oracle", "oracle-explore", "oracle-invalid", "oracle-valid"]
"""Where a step's verdicts come from: the reward model, or one of the environment-label ablations."""


class JudgeConfig(Config, frozen=True, kw_only=True):
    m: Annotated[int, Meta(ge=1, le=64)] = 3
    """Verdicts per step (paper: 3), sampled at `reward_model.temperature` (the reward learner rescores
    them at that temperature, so it is set once, there)."""
    max_new_tokens: PosInt = 24
    verdicts: VerdictSource = "model"
    """`oracle`: an ablation, not the paper's loop. The m verdicts of a step are the environment's own
    step label (`step_is_progress`: household, TextWorld; 0 where a domain has none) instead of the
    reward model's: what the policy learns from a free process reward. No reward model is loaded and
    the verdicts carry no tokens, so run it `--without reward-learner`. `oracle-explore`: the same,
    and a search step (`step_explores`: household) counts as progress; the hindsight label alone calls
    it a detour, because the oracle knows which closed receptacle holds the object. `oracle-invalid`:
    -1 for an invalid answer, 0 for a valid one (what the defaults' reward model reliably knows);
    `oracle-valid`: the label for valid answers, 0 for invalid ones."""
    follow_weights: bool = True
    """Load each newer reward-model version between trajectories. False pins the judges to the preset
    while the reward learner still trains and publishes: a shadow reward model, to be measured
    (`forgestream eval --reward-model latest`) before it judges, and the compute-matched ablation of
    `bench learning` (the learner's CPU share without its effect on the rewards)."""


class SignalsConfig(Config, frozen=True, kw_only=True):
    lam: Annotated[float, Meta(ge=0.0, le=100.0)] = 1.0
    """λ in R = O + λ·mean S."""
    rm_lam: Annotated[float, Meta(ge=0.0, le=100.0)] = 3.5
    """λ of the R that the reward model's consistency reward uses (the policy's stays `lam`; the paper
    uses one λ: set rm_lam = lam). With m = 3 verdicts any λ < 3 teaches the reward model the episode's
    outcome alone, never its own majority, and co-training pulled process accuracy down towards the
    outcome level (0.561): 0.684 -> 0.627 / 0.626 / 0.668 after 6-minute runs (household, 3 seeds). At
    3.5 a 2-1 majority outvotes the outcome: 0.733 / 0.708 / 0.719 against the preset's 0.684 / 0.654 /
    0.656 on the same steps (balanced 0.719 / 0.691 / 0.701 against 0.676 / 0.645 / 0.646), 0.722 after
    12 minutes; held-out success unchanged within noise (level 4: 0.46 against the preset's 0.47)."""
    rm_acc_low: Fraction = 0.2
    rm_acc_high: Fraction = 0.8
    """Reward-model samples only from groups whose accuracy lies in [low, high]."""
    policy_acc_low: Fraction = 0.125
    policy_acc_high: Fraction = 0.875
    """Policy samples only from groups whose accuracy lies in [low, high] (the released code's 1/8, 7/8:
    with n = 8, mixed-outcome groups only). 0 and 1 also train all-fail / all-success groups on the
    verdicts alone."""
    rm_outcome_balance: bool = True
    """Weight reward-model samples so the steps of successful and of failed rollouts count the same in
    total; without it a 12-minute run collapsed the reward model to "every step is bad" (said_good 0.0)."""
    episode_weighting: bool = True
    """Scale each rollout's policy advantages by (mean rollout length in the group / its length), so every
    episode weighs the same in the learner's sample-mean loss instead of in proportion to its length.
    12-minute `up`, 200 held-out tasks per level: level 6 (never trained on) 0.28 with it, 0.18 without
    (the preset: 0.275); level 4 0.50 and 0.47."""
    baseline: Literal["step_index", "state"] = "step_index"
    """What a policy advantage is measured against: "step_index" (the paper) z-scores R over the
    group's rollouts that reached the same step index, by then often in different states; "state"
    z-scores it over the group's steps whose policy prompt is the same, at any index (a prompt met
    once trains nothing). Not better, measured from the DAgger start (12-minute runs, held-out level 8):
    with oracle verdicts 0.315 against the step index's 0.38, outcome only (λ = 0) 0.45 against 0.47."""
    judge_invalid_steps: bool = True
    """False keeps the verdicts on invalid answers out of the policy's R (such a step gets the outcome
    alone); the reward model still learns them. Verdicts that knew only the format (-1 for an invalid
    answer, 0 for a valid one) lowered held-out level 8 from 0.49 to 0.225, as the defaults did (0.22);
    with False the defaults' 12-minute runs gave 0.395 / 0.225 / 0.18 (run seeds 0-2; the defaults 0.22 /
    0.34 on seeds 0-1): the invalid answers were trained away all the same. The paper's True stays."""
    invalid_penalty: NonNegFloat = 0.0
    """> 0: an invalid answer's policy advantage is -invalid_penalty, and the valid steps are z-scored
    among themselves (by step index or state), so the format is taught by pushing invalid answers down
    alone. Scored with the valid steps (0, the paper), an invalid answer's low R gives every valid answer
    sampled beside it a positive advantage wherever it leads. Why it matters here: the policy preset
    wins 0.46 of held-out level-8 tasks, and 0.725 when each invalid answer is redrawn instead of costing
    a turn (the first valid of 8 samples, `forgestream eval --modes redraw`), while the loop's runs trained
    the invalid answers away and lowered success to 0.11-0.34. 12-minute runs (seed 0): a penalty of 1
    on all tokens 0.24 (λ = 0: 0.135); after the listed prefix (below) 0.41 / 0.425 (seeds 0 / 1; the
    defaults 0.11 / 0.185), invalid turns 0.69 / 0.67 (the preset's 0.55), 0.68 / 0.66 redrawn: it keeps
    the band and the preferences but does not teach the format. Not a fix yet. With `actor.redraw` > 1
    the invalid draws an actor passed over (`Step.rejected`) are pushed down the same way: a format
    signal on the policy's own mistakes that costs no turn. Measured with redraw 8 and policy lr 3e-5
    (seed 0, 12 minutes; 13,690 samples trained against ~5,000 without): level 8 0.425 sampled, invalid
    0.49, 0.685 redrawn, against 0.48 / 0.43 / 0.705 without: it does not teach the format either."""
    invalid_penalty_tokens: Literal["all", "after_listed_prefix"] = "after_listed_prefix"
    """Which tokens of an invalid answer the penalty pushes down: "all", or those after the longest
    prefix that still spells a listed action (`Step.listed_prefix_tokens`): `\\boxed{ take apple 1 from
    drawer 2}` with `take apple 1 from table 1` listed is pushed down from `drawer` on. With "all" the
    penalty taught the verbs of the policy's invalid answers away everywhere (measured: its invalid
    answers begin with take / open 88 % of the time; after a run with the penalty on all tokens, its valid
    turns were "go to" 0.95 of the time instead of 0.66, "take" 0.009 instead of 0.08)."""
    group_timeout_s: PosFloat = 600.0
    """A group missing rollouts this long is flushed as incomplete and counted."""
    max_open_groups: PosInt = 10_000
    """Groups held in memory at most; beyond this the oldest is flushed early (bounded state)."""
    fetch_records: PosInt = 256
    """Judged trajectories fetched per poll."""


class ForgeConfig(Config, frozen=True, kw_only=True):
    high: Fraction = 0.8
    low: Fraction = 0.2
    window: PosInt = 8
    """Rollouts in a task's accuracy window (paper: one group of n)."""
    app_id: str = "forgestream-forge"
    """Faust app id = consumer group and prefix of its internal topics (after kafka.topic_prefix)."""
    event_cooldown_s: NonNegFloat = 60.0
    """After a harder/easier event a task gets no other one this long (its variant needs time to appear)."""
    partitions: PosInt = 8
    """Partitions of the app's internal topics (repartition by task_id, table changelog)."""


class EnvModelConfig(Config, frozen=True, kw_only=True):
    kind: Literal["rule", "llm"] = "rule"
    max_attempts: PosInt = 8
    """Proposals tried before giving up on one event (duplicate signatures, unsolvable)."""
    llm_candidates: Annotated[int, Meta(ge=2, le=16)] = 3
    """kind = "llm": rule-based candidates the model chooses among."""


class EvaluatorConfig(Config, frozen=True, kw_only=True):
    enabled: bool = True
    """`up` runs the evaluator role (held-out success per policy version, process accuracy per reward version)."""
    every_versions: PosInt = 4
    """Evaluate every this many policy versions (version 0, the start, always)."""
    levels: tuple[NonNegInt, ...] = ()
    """Held-out levels; empty = the training band (scheduler.seed_difficulty) and two levels harder."""
    tasks_per_level: PosInt = 32
    """Held-out tasks per level (envs.seeds: seeds no training draws)."""
    reward_steps: NonNegInt = 96
    """Labelled held-out steps for the reward model's process accuracy (every `every_versions` reward
    versions); 0 = policy only."""
    max_steps: Annotated[int, Meta(ge=1, le=200)] = 40
    modes: Annotated[tuple[Literal["sampled", "redraw"], ...], Meta(min_length=1)] = ("sampled",)
    """How held-out episodes are played: sampled (every answer played, the paper's measure) and/or
    redraw (the first listed of `actor.redraw` answers, as this run's actors play; needs actor.redraw > 1).
    Each mode is a full evaluation: two modes cost the loop's shared CPU twice."""


class LearnerConfig(Config, frozen=True, kw_only=True):
    lr: PosFloat = 3e-4
    """Paper scale is 1e-6; tiny models need larger."""
    betas: tuple[Fraction, Fraction] = (0.9, 0.999)
    weight_decay: NonNegFloat = 0.0
    grad_clip: PosFloat = 1.0
    clip: Fraction = 0.2
    kl_coef: NonNegFloat = 0.01
    """k3-KL to the proximal policy (the weights before this batch), the released code's 0.01."""
    ref_kl_coef: NonNegFloat = 0.0
    """k3-KL to the start weights (the preset), as TRL's and verl's reference KL; 0 = none. Costs one
    more forward per sample and a second copy of the model."""
    is_cap: PosFloat = 2.0
    """Truncation of the importance weight π_prox/π_behaviour."""
    micro_batch_tokens: PosInt = 4096
    batch_samples: PosInt = 256
    """A batch is whole sample groups (one rollout request each) until it holds at least this many.
    A mixed household group of 8 rollouts is ~100-250 policy samples: at 64, every group was a version
    of its own and the staleness gate dropped 60 % of the policy samples (eta 2) in a 10-minute run."""
    batch_wait_s: NonNegFloat = 45.0
    """With the samples topic idle, a partial batch trains once it has waited this long (0: at once).
    Training every group as it arrived made a version per group, and groups still queued at the judges
    aged past eta: the staleness gate dropped 55-60 % of the policy samples of a 12-minute run."""
    minibatches: PosInt = 4
    """Shuffled optimizer steps per batch; > 1 makes the clip and the KL act (every step after the first
    moves away from the proximal policy, whose logprobs are taken once per batch)."""
    epochs: Annotated[int, Meta(ge=1, le=64)] = 1
    """Passes over each batch (each reshuffled into `minibatches` steps, against the batch's one
    proximal policy, as PPO's epochs): more learning per sample where samples, not the learner's CPU,
    are scarce."""
    publish_every: PosInt = 1
    """Batches between published versions (a version covers whole batches, so whole groups)."""
    warmup_steps: NonNegInt = 8
    """Optimizer steps over which the learning rate rises linearly to `lr` (0 = none)."""
    checkpoint_every: PosInt = 1
    """Published versions between full checkpoints (model, optimizer, offsets)."""
    engine: Literal["torch", "deepspeed", "stub"] = "torch"
    """`stub`: system benchmarks only, a learner on a device of its own: no update, each optimizer
    step sleeps `stub_sample_s` per sample (no CPU), versions and checkpoints as usual."""
    stub_sample_s: NonNegFloat = 0.01
    zero_stage: Annotated[int, Meta(ge=0, le=3)] = 2
    lora_rank: NonNegInt = 0
    """0 = full fine-tuning; > 0 trains LoRA adapters (peft)."""
    poll_timeout_s: PosFloat = 1.0
    ranks: Annotated[int, Meta(ge=1, le=256)] = 1
    """Processes `up` starts for this learner, under torchrun on this machine: rank 0 reads Kafka and
    decides, every rank trains its share of each batch (gloo on CPU, NCCL with one GPU per rank).
    `forgestream run` starts one; launch torchrun yourself for more (README)."""


class PolicyLearnerConfig(LearnerConfig, frozen=True, kw_only=True):
    """The policy learner's section: its own defaults live in the class (as the reward model's), so a
    file that sets one field keeps the others."""

    ref_kl_coef: NonNegFloat = 0.1
    """0.1: a 12-minute `up` with fresher samples (two groups per version) and no reference KL drifted out
    of format: invalid answers 0.03 -> 0.42 on held-out level 4, success 0.28 (v12); with 0.1, 0.02 and
    0.47 (v11)."""
    lr: PosFloat = 1e-4
    """1e-4 with one pass (`epochs` 1): 4 optimizer steps per batch of >= 256 samples. From the start that
    answers by name, held-out level 6 (the training band; the preset 0.45 [0.38, 0.52]) after a 12-minute
    `up`: 0.565 [0.50, 0.63] and 0.45 (run seeds 0, 1), 0.47 after a 15-minute `make run`; at 3e-4 with 4
    passes (16 steps per batch) it fell to 0.31 [0.25, 0.38] (200 tasks, sampled, seed 7). Less harm,
    not yet a reliable gain."""
    listed_token_coef: NonNegFloat = 0.0
    """Weight of the listed-token loss: at the token where an invalid answer (played, or a draw passed
    over under `actor.redraw`) first left every listed answer, -log of the probability of the tokens that
    would have stayed on one, averaged over such answers. The mass of the leaving tokens goes to the
    staying ones in proportion to what the policy gave each; the tokens before (its choice of verb and
    object) are not trained. The actor records the listed answers when this is > 0 (domains with listed
    actions only), and signals then keeps every passed-over draw as a sample (advantage
    -`signals.invalid_penalty`, 0 by default). 0 = off: measured, it is no fix. At 1 with actor.redraw 8
    and lr 3e-5 (12 minutes, held-out level 8) it moved nothing (0.44 sampled, invalid 0.52, redrawn
    0.68; the preset 0.46 / 0.55 / 0.72); alone and strong, offline on the preset, it taught the staying
    tokens (0.12 -> 0.90 there) and the policy ended at 0.0, walking between two rooms: 98 % of the
    preset's invalid draws leave the list at the object or container after a listed verb (a wrong belief
    about the room), so staying listed there means doing something else, which this model learns as
    "go to" everywhere."""
    listed_conditional: bool | None = None
    """Unset: on whenever the actor redraws (`actor.redraw` > 1). Train each played valid answer as a
    draw from the policy it was played from under `actor.redraw`:
    the policy conditioned on naming a listed action, log pi(a) - log M (M: the state's listed mass,
    every listed answer scored; `algorithm.listed_conditional_loss`). Off, the loss treats it as a draw from
    the whole policy, and a negative advantage pushes its mass to the unlisted answers too. Needs
    actor.redraw > 1; the actor records the listed answers. With redraw 8 and lr 3e-5, 30 minutes (held-out
    level 8, 200 tasks): 0.54 [0.47, 0.61] sampled and 0.74 redrawn on run seed 0, where the same run without
    it lost the plan (0.345 / 0.51); 0.465 / 0.665 on seed 1; the preset 0.46 / 0.72. It keeps a long run at
    the preset and adds no gain yet (not the band's +0.15); it is on by default because redrawn play
    without it lost the plan."""


class RewardLearnerConfig(LearnerConfig, frozen=True, kw_only=True):
    """The reward learner's section, its own defaults in the class (as the policy learner's)."""

    eta: NonNegInt = 2
    """Reward-model samples older than current - eta reward versions are dropped and counted (the
    policy's bound is `off_policy.eta`)."""

    ref_kl_coef: NonNegFloat = 0.1
    """0.1: the consistency reward pays verdicts for agreeing with the outcome, which drifts a reward
    model that starts from the environment's step labels: after a 12-minute `up` process accuracy
    0.606 (balanced 0.633, says good 0.70) without the reference KL, 0.658 (0.675) and 0.653 (0.665)
    with it (the preset: 0.684, balanced 0.676; 2,801 held-out steps)."""


class OffPolicyConfig(Config, frozen=True, kw_only=True):
    """The off-policy contract between the scheduler and the policy learner, defined once for both."""

    eta: NonNegInt = 2
    """η, the staleness bound in policy versions: the scheduler admits a request only while its rollouts
    can still be trained (`min_policy_version` = version - eta), and the policy learner drops whole
    groups whose oldest sample is more than eta versions behind it."""


class ListedAnswers(Struct, frozen=True, kw_only=True):
    """What the policy learner's losses need of each turn's listed answers, derived from its section
    once (`RunConfig.listed_answers`): the actor records them, signals carries them onto the samples."""

    token_loss: bool
    """`policy_learner.listed_token_coef` > 0: passed-over invalid draws ride on the samples."""
    conditional: bool
    """`policy_learner.listed_conditional`: played answers carry every listed answer to score."""

    @property
    def recorded(self) -> bool:
        """Whether a step needs its listed answers at all."""
        return self.token_loss or self.conditional


class RunConfig(Config, frozen=True, kw_only=True):
    """Everything one `forgestream up` needs; each role reads its own section (and what
    `listed_answers` and `version_groups_at_least` derive from another's)."""

    workdir: str = ".work/run"
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    policy_model: ModelConfig = field(default_factory=ModelConfig)
    reward_model: RewardModelConfig = field(default_factory=lambda: RewardModelConfig())
    store: StoreConfig = field(default_factory=StoreConfig)
    off_policy: OffPolicyConfig = field(default_factory=OffPolicyConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    signals: SignalsConfig = field(default_factory=SignalsConfig)
    forge: ForgeConfig = field(default_factory=ForgeConfig)
    env_model: EnvModelConfig = field(default_factory=EnvModelConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    policy_learner: PolicyLearnerConfig = field(default_factory=PolicyLearnerConfig)
    reward_learner: RewardLearnerConfig = field(default_factory=RewardLearnerConfig)
    seed: NonNegInt = 0

    def __post_init__(self) -> None:
        """Defaults that depend on another section, then rules across sections: a bad combination
        fails at start-up, naming both fields."""
        self._resolve_defaults()
        for ok, problem in (
            (self.signals.policy_acc_low <= self.signals.policy_acc_high,
             f"signals.policy_acc_low ({self.signals.policy_acc_low}) > policy_acc_high ({self.signals.policy_acc_high})"),
            (self.signals.rm_acc_low <= self.signals.rm_acc_high,
             f"signals.rm_acc_low ({self.signals.rm_acc_low}) > rm_acc_high ({self.signals.rm_acc_high})"),
            (self.actor.redraw == 1 or self.scheduler.domain in LISTED_ACTION_DOMAINS,
             f"actor.redraw ({self.actor.redraw}) needs a domain that lists its actions "
             f"({', '.join(LISTED_ACTION_DOMAINS)}), not scheduler.domain {self.scheduler.domain!r}"),
            (self.policy_learner.listed_token_coef == 0 or self.scheduler.domain in LISTED_ACTION_DOMAINS,
             f"policy_learner.listed_token_coef ({self.policy_learner.listed_token_coef}) needs a domain that "
             f"lists its actions ({', '.join(LISTED_ACTION_DOMAINS)}), not scheduler.domain "
             f"{self.scheduler.domain!r}"),
            (not self.policy_learner.listed_conditional or self.actor.redraw > 1,
             f"policy_learner.listed_conditional needs actor.redraw > 1 (it is {self.actor.redraw}): only "
             "redrawn play draws from the policy conditioned on naming a listed action"),
            ("redraw" not in self.evaluator.modes or self.actor.redraw > 1,
             f"evaluator.modes {list(self.evaluator.modes)} plays as the actors redraw, and actor.redraw is "
             f"{self.actor.redraw}: set actor.redraw > 1 or leave \"redraw\" out"),
            (self.forge.low <= self.forge.high, f"forge.low ({self.forge.low}) > forge.high ({self.forge.high})"),
            *((learner.ranks == 1 or learner.engine == "deepspeed",
               f"{name}.ranks ({learner.ranks}) needs {name}.engine = \"deepspeed\": engine "
               f"{learner.engine!r} trains in one process")
              for name, learner in (("policy_learner", self.policy_learner), ("reward_learner", self.reward_learner))),
        ):  # fmt: skip
            if not ok:
                raise ValueError(problem)

    @property
    def listed_answers(self) -> ListedAnswers:
        """What the policy learner's losses need of the listed answers (one home for the actor and signals)."""
        learner = self.policy_learner
        return ListedAnswers(
            token_loss=learner.listed_token_coef > 0, conditional=bool(learner.listed_conditional)
        )

    @property
    def version_groups_at_least(self) -> int:
        """The fewest rollout groups one policy version takes: `policy_learner.publish_every` batches,
        each one whole group or more (the scheduler's gate, before the learner's first version)."""
        return self.policy_learner.publish_every

    def _resolve_defaults(self) -> None:
        # Fields left unset (None) take values that depend on another section; set once here, so every
        # role reads plain values. The struct is frozen to its readers, not to its own construction.
        redraw = self.actor.redraw
        if redraw is None:
            redraw = 8 if self.scheduler.domain in LISTED_ACTION_DOMAINS else 1
            structs.force_setattr(self, "actor", structs.replace(self.actor, redraw=redraw))
        if self.policy_learner.listed_conditional is None:
            structs.force_setattr(
                self, "policy_learner", structs.replace(self.policy_learner, listed_conditional=redraw > 1)
            )
