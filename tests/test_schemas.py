"""Schemas: every event round-trips through msgpack; every malformed kind is rejected naming the field."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import codec
from schemas import events as ev
from schemas.topics import TOPICS, TopicNames

SHA = "ab" * 32


def task(**kw: Any) -> ev.TaskSpec:
    return ev.TaskSpec(task_id="t1", domain="arith", difficulty=1, params={"digits": 3}, seed=7, **kw)


def step(index: int = 0) -> ev.Step:
    return ev.Step(
        index=index,
        prompt="2+2=",
        response="\\boxed{4}",
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        behaviour_logprobs=[-0.1, -2.5],
        policy_version=3,
        observation="ok",
        listed_answers=[[4, 5], [6, 5]],
    )


def trajectory() -> ev.Trajectory:
    return ev.Trajectory(
        request_id="r1", rollout_index=1, group_size=8, task=task(), steps=[step(0), step(1)], outcome=1
    )


def judgement(verdict: int = 1) -> ev.Judgement:
    return ev.Judgement(
        verdict=verdict,
        prompt_token_ids=[1],
        response_token_ids=[2, 3],
        behaviour_logprobs=[-0.3, -0.4],
        text="ok",
    )


def samples() -> dict[type[msgspec.Struct], msgspec.Struct]:
    """One realistic instance of every topic's value type."""
    return {
        ev.TaskSpec: task(
            status="pending", parent_id="t0", direction="harder", parent_accuracy=0.9, generation=1
        ),
        ev.RolloutRequest: ev.RolloutRequest(request_id="r1", task=task(), n=8, min_policy_version=2),
        ev.Trajectory: trajectory(),
        ev.JudgedTrajectory: ev.JudgedTrajectory(
            trajectory=trajectory(),
            steps=[
                ev.StepJudgement(step_index=i, judgements=[judgement(1), judgement(-1), judgement(0)])
                for i in (0, 1)
            ],
            reward_version=4,
        ),
        ev.PolicySampleBatch: ev.PolicySampleBatch(
            request_id="r1",
            samples=[
                ev.PolicySample(
                    sample_key="r1/1/0",
                    task_id="t1",
                    prompt_token_ids=[1, 2],
                    response_token_ids=[3],
                    behaviour_logprobs=[-0.7],
                    policy_version=3,
                    advantage=-1.25,
                    reward=0.5,
                    unlisted_at=0,
                    listed_tokens=[4, 5],
                )
            ],
        ),
        ev.RewardSampleBatch: ev.RewardSampleBatch(
            request_id="r1",
            samples=[
                ev.RewardSample(
                    sample_key="r1/1/0/2",
                    prompt_token_ids=[1],
                    response_token_ids=[2],
                    behaviour_logprobs=[-0.2],
                    reward_version=1,
                    advantage=0.7,
                    reward=-2.0,
                )
            ],
        ),
        ev.GroupSettled: ev.GroupSettled(
            request_id="r1", task_id="t1", action="partial", rollouts=6, policy_samples=40, reward_samples=9
        ),
        ev.TaskEvent: ev.TaskEvent(
            event_id="e1",
            task_id="t1",
            task_version=2,
            kind="harder",
            accuracy=0.875,
            rollouts=8,
            critic=ev.CriticFeedback(high_risk_steps=[[0, 2]], failed_actions=["go north"]),
        ),
        ev.WeightsPublished: ev.WeightsPublished(
            model="policy", version=7, uri="/w/policy/v000007", sha256=SHA, bytes=10
        ),
        ev.Metric: ev.Metric(
            role="judge", name="judge/judged", value=3.0, step=2, labels={"domain": "arith"}
        ),
        ev.DeadLetter: ev.DeadLetter(
            source_topic="forge.trajectories",
            partition=3,
            offset=17,
            key=b"k",
            value=b"\xff\x00",
            error="decode",
        ),
        ev.Strike: ev.Strike(
            source_topic="forge.trajectories", partition=1, offset=5, group="judges", error="OSError: gone"
        ),
        ev.Redriven: ev.Redriven(
            dlq_partition=0, dlq_offset=4, source_topic="forge.trajectories", to_offset=90, group="judge"
        ),
    }


def test_every_topic_value_type_has_a_sample() -> None:
    assert {spec.value_type for spec in TOPICS.values()} == set(samples())


@pytest.mark.parametrize("event", list(samples().values()), ids=lambda e: type(e).__name__)
def test_round_trip(event: msgspec.Struct) -> None:
    data = codec.encode(event)
    back = codec.decode(data, type(event))
    assert back == event
    assert back.schema_version == ev.SCHEMA_VERSION


def mutated(event: msgspec.Struct, path: list[Any], value: Any) -> bytes:
    """msgpack of `event` with the item at `path` replaced (or deleted when value is DELETE)."""
    tree = msgspec.to_builtins(event)
    node = tree
    for part in path[:-1]:
        node = node[part]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return msgspec.msgpack.encode(tree)


DELETE = object()
S = samples()

MALFORMED = [
    # (id, event, path, bad value, text the error must contain)
    ("wrong-type-int", S[ev.TaskSpec], ["seed"], "seven", "$.seed"),
    ("wrong-type-str", S[ev.Metric], ["name"], 5, "$.name"),
    ("wrong-type-list", S[ev.Trajectory], ["steps"], {"a": 1}, "$.steps"),
    ("missing-field", S[ev.RolloutRequest], ["request_id"], DELETE, "request_id"),
    (
        "nan-advantage",
        S[ev.PolicySampleBatch],
        ["samples", 0, "advantage"],
        math.nan,
        "$.samples[0].advantage",
    ),
    ("inf-reward", S[ev.RewardSampleBatch], ["samples", 0, "reward"], math.inf, "$.samples[0].reward"),
    ("nan-metric", S[ev.Metric], ["value"], math.nan, "$.value"),
    ("nan-accuracy", S[ev.TaskEvent], ["accuracy"], math.nan, "$.accuracy"),
    ("negative-step-index", S[ev.Trajectory], ["steps", 1, "index"], -1, "$.steps[1].index"),
    (
        "negative-token-id",
        S[ev.Trajectory],
        ["steps", 0, "response_token_ids", 0],
        -5,
        "$.steps[0].response_token_ids[0]",
    ),
    ("negative-offset", S[ev.DeadLetter], ["offset"], -3, "$.offset"),
    ("negative-version", S[ev.WeightsPublished], ["version"], -1, "$.version"),
    (
        "positive-logprob",
        S[ev.Trajectory],
        ["steps", 0, "behaviour_logprobs", 1],
        0.5,
        "behaviour_logprobs[1]",
    ),
    ("bad-verdict", S[ev.JudgedTrajectory], ["steps", 0, "judgements", 0, "verdict"], 2, "verdict"),
    ("bad-domain", S[ev.TaskSpec], ["domain"], "chess", "$.domain"),
    ("bad-outcome", S[ev.Trajectory], ["outcome"], 0, "$.outcome"),
    ("zero-group", S[ev.RolloutRequest], ["n"], 0, "$.n"),
    ("huge-group", S[ev.RolloutRequest], ["n"], 10**9, "$.n"),
    ("no-judgements", S[ev.JudgedTrajectory], ["steps", 0, "judgements"], [], "$.steps[0].judgements"),
    ("huge-group-size", S[ev.Trajectory], ["group_size"], 10**9, "$.group_size"),
    ("logprob-length", S[ev.Trajectory], ["steps", 0, "behaviour_logprobs"], [-0.1], "behaviour_logprobs"),
    ("rollout-index", S[ev.Trajectory], ["rollout_index"], 8, "rollout_index"),
    ("listed-prefix", S[ev.Trajectory], ["steps", 0, "listed_prefix_tokens"], 2, "listed_prefix_tokens"),
    (
        "rejected-prefix",
        S[ev.Trajectory],
        ["steps", 0, "rejected"],
        [{"response_token_ids": [4, 5], "behaviour_logprobs": [-0.1, -0.2], "listed_prefix_tokens": 2}],
        "rejected answer: listed_prefix_tokens",
    ),
    (
        "rejected-logprobs",
        S[ev.Trajectory],
        ["steps", 0, "rejected"],
        [{"response_token_ids": [4, 5], "behaviour_logprobs": [-0.1]}],
        "rejected answer: behaviour_logprobs",
    ),
    (
        "empty-listed-answer",
        S[ev.Trajectory],
        ["steps", 0, "listed_answers"],
        [[4, 2], []],
        "listed_answers[1]",
    ),
    ("bad-sha", S[ev.WeightsPublished], ["sha256"], "xyz", "sha256"),
    ("accuracy-range", S[ev.TaskEvent], ["accuracy"], 1.5, "$.accuracy"),
    ("bad-group-action", S[ev.GroupSettled], ["action"], "kept", "$.action"),
    ("negative-samples", S[ev.GroupSettled], ["policy_samples"], -1, "$.policy_samples"),
]


@pytest.mark.parametrize(
    ("event", "path", "bad", "names"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_is_rejected_naming_the_field(
    event: msgspec.Struct, path: list[Any], bad: Any, names: str
) -> None:
    with pytest.raises(codec.DecodeError) as err:
        codec.decode(mutated(event, path, bad), type(event))
    assert names in str(err.value)


def test_wire_logprobs_are_what_the_schema_takes() -> None:
    """Backends can stamp +1e-8 (float rounding) or -inf (a masked token); the wire takes [-1e30, 0]."""
    clamped = ev.wire_logprobs([1e-8, -math.inf, -0.5, 0.0])
    assert clamped == [0.0, -1e30, -0.5, 0.0]
    step = msgspec.structs.replace(judgement(), response_token_ids=[1, 2, 3, 4], behaviour_logprobs=clamped)
    assert codec.decode(codec.encode(step), ev.Judgement).behaviour_logprobs == clamped
    raw = msgspec.structs.replace(step, behaviour_logprobs=[1e-8, -0.5, -0.5, -0.5])
    with pytest.raises(codec.DecodeError, match="behaviour_logprobs"):
        codec.decode(codec.encode(raw), ev.Judgement)


def test_garbage_bytes_are_decode_errors() -> None:
    for data in (b"", b"\xc1", b"not msgpack at all", codec.encode(S[ev.Metric])[:-3]):
        with pytest.raises(codec.DecodeError):
            codec.decode(data, ev.Metric)


def test_wrong_schema_is_rejected() -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode(codec.encode(S[ev.Metric]), ev.Trajectory)


def test_forward_compatible_unknown_fields_are_ignored() -> None:
    tree = msgspec.to_builtins(S[ev.Trajectory])
    tree["new_field_from_v2"] = {"anything": [1, 2]}
    tree["steps"][0]["another_new_field"] = 1.5
    back = codec.decode(msgspec.msgpack.encode(tree), ev.Trajectory)
    assert back == S[ev.Trajectory]


def test_old_events_without_defaulted_fields_decode() -> None:
    tree = msgspec.to_builtins(S[ev.TaskSpec])
    for name in ("status", "version", "signature", "parent_id", "generation", "schema_version", "created_at"):
        del tree[name]
    back = codec.decode(msgspec.msgpack.encode(tree), ev.TaskSpec)
    assert (back.status, back.version, back.parent_id, back.schema_version) == ("active", 0, None, 1)


def test_topic_names_prefix() -> None:
    names = TopicNames("run7.")
    assert names.of("forge.trajectories") == "run7.forge.trajectories"
    assert names.logical("run7.forge.dlq") == "forge.dlq"
    assert len(names.all()) == len(TOPICS)
    with pytest.raises(KeyError):
        names.of("forge.nope")
    with pytest.raises(KeyError):
        names.logical("other.forge.dlq")


@given(
    value=st.floats(min_value=-1e30, max_value=1e30, allow_nan=False),
    step=st.integers(min_value=0, max_value=2**40),
    labels=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
)
def test_metric_round_trip_property(value: float, step: int, labels: dict[str, str]) -> None:
    metric = ev.Metric(role="r", name="x/y", value=value, step=step, labels=labels)
    assert codec.decode(codec.encode(metric), ev.Metric) == metric


def test_overriding_one_reward_model_field_keeps_its_other_defaults() -> None:
    """`up` hands FORGESTREAM_REWARD_MODEL__PRESET to every role: the judges must build the same
    reward preset as `up` (they once rebuilt the section from the policy's defaults)."""
    from infra.config import load_config

    plain = load_config(environ={})
    overridden = load_config(environ={"FORGESTREAM_REWARD_MODEL__PRESET": "tiny"})
    assert overridden.reward_model == plain.reward_model
    assert plain.reward_model.bootstrap_sft_seconds != plain.policy_model.bootstrap_sft_seconds
    flagged = load_config(environ={}, flags={"reward_model.temperature": 0.8, "policy_model.preset": "tiny"})
    assert flagged.reward_model.max_new_tokens == 24


def test_process_variables_are_not_config_fields() -> None:
    from infra.config import ConfigError, load_config

    # tool locations and the sandbox mode: a config load must not fail on "unknown field tansu"
    tools = {
        "FORGESTREAM_TANSU": "/opt/tansu",
        "FORGESTREAM_S3RVER": "/opt/s3rver",
        "FORGESTREAM_SANDBOX": "bwrap",
    }
    assert load_config(environ=tools) == load_config(environ={})
    with pytest.raises(ConfigError, match="tansu_typo"):
        load_config(environ={"FORGESTREAM_TANSU_TYPO": "x"})


def test_secrets_never_appear_in_a_config_repr() -> None:
    from schemas.config import KafkaConfig, RunConfig

    kafka = KafkaConfig(sasl_username="alice", sasl_password="hunter2")
    for shown in (repr(kafka), str(kafka), repr(msgspec.structs.replace(RunConfig(), kafka=kafka))):
        assert "hunter2" not in shown and "sasl_password=***" in shown and "alice" in shown
    assert "sasl_password=None" in repr(KafkaConfig())  # an unset secret says so
    assert kafka.sasl_password == "hunter2"  # the value itself is intact for the client


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"FORGESTREAM_SIGNALS__POLICY_ACC_LOW": "0.9"}, ("policy_acc_low", "policy_acc_high")),
        ({"FORGESTREAM_SIGNALS__RM_ACC_HIGH": "0.1"}, ("rm_acc_low", "rm_acc_high")),
        ({"FORGESTREAM_FORGE__LOW": "0.9"}, ("forge.low", "forge.high")),
        ({"FORGESTREAM_REWARD_LEARNER__RANKS": "2"}, ("reward_learner.ranks", "reward_learner.engine")),
        (
            {"FORGESTREAM_EVALUATOR__MODES": '["sampled", "redraw"]', "FORGESTREAM_ACTOR__REDRAW": "1"},
            ("evaluator.modes", "actor.redraw"),
        ),
    ],
)
def test_cross_field_rules_fail_at_load_naming_both_fields(
    env: dict[str, str], names: tuple[str, str]
) -> None:
    from infra.config import ConfigError, load_config

    with pytest.raises(ConfigError) as failed:
        load_config(environ=env)
    assert all(name in str(failed.value) for name in names)


def test_the_evaluator_plays_at_least_one_known_mode() -> None:
    from infra.config import ConfigError, load_config

    assert load_config(environ={"FORGESTREAM_EVALUATOR__MODES": '["redraw"]'}).evaluator.modes == ("redraw",)
    with pytest.raises(ConfigError, match=r"length >= 1 - at `\$\.evaluator\.modes`"):
        load_config(environ={"FORGESTREAM_EVALUATOR__MODES": "[]"})
    with pytest.raises(ConfigError, match=r"evaluator\.modes"):
        load_config(environ={"FORGESTREAM_EVALUATOR__MODES": '["greedy"]'})


def test_the_judges_temperature_is_the_reward_models_set_once() -> None:
    """Verdicts are sampled, and rescored by the reward learner, at reward_model.temperature: a judge
    setting of its own could only disagree, so it is refused by name."""
    from infra.config import ConfigError, load_config

    assert (
        load_config(environ={"FORGESTREAM_REWARD_MODEL__TEMPERATURE": "0.5"}).reward_model.temperature == 0.5
    )
    with pytest.raises(ConfigError, match=r"unknown field `temperature` - at `\$\.judge`"):
        load_config(environ={"FORGESTREAM_JUDGE__TEMPERATURE": "0.5"})


def test_eta_is_set_once_for_the_scheduler_and_the_policy_learner() -> None:
    """η lives in `off_policy`: the policy learner drops by the bound the scheduler admits by, so the two
    cannot disagree; the reward learner's bound counts reward versions and stays its own."""
    from infra.config import ConfigError, load_config
    from learners import policy, reward

    config = load_config(environ={"FORGESTREAM_OFF_POLICY__ETA": "5", "FORGESTREAM_REWARD_LEARNER__ETA": "3"})
    assert (config.off_policy.eta, policy.spec(config).eta, reward.spec(config).eta) == (5, 5, 3)
    for old in ("FORGESTREAM_SCHEDULER__ETA", "FORGESTREAM_POLICY_LEARNER__ETA"):
        with pytest.raises(ConfigError, match="eta"):
            load_config(environ={old: "5"})


def test_environment_values_for_text_fields_are_taken_verbatim() -> None:
    """A numeric or quoted password set by environment variable stays the text the user wrote; other
    fields still read TOML literals (numbers, booleans, arrays)."""
    from infra.config import ConfigError, load_config

    cfg = load_config(
        environ={
            "FORGESTREAM_KAFKA__SASL_PASSWORD": "12345",
            "FORGESTREAM_KAFKA__SASL_USERNAME": '"alice"',
            "FORGESTREAM_KAFKA__SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "FORGESTREAM_POLICY_LEARNER__LR": "0.001",
            "FORGESTREAM_POLICY_LEARNER__BETAS": "[0.9, 0.99]",
            "FORGESTREAM_EVALUATOR__ENABLED": "false",
        }
    )
    assert cfg.kafka.sasl_password == "12345"
    assert cfg.kafka.sasl_username == '"alice"'
    assert cfg.kafka.security_protocol == "SASL_PLAINTEXT"
    assert cfg.policy_learner.lr == 0.001 and cfg.policy_learner.betas == (0.9, 0.99)
    assert cfg.policy_learner.ref_kl_coef == 0.1 and cfg.reward_learner.lr == 3e-4  # own defaults per section
    assert cfg.evaluator.enabled is False
    with pytest.raises(ConfigError, match="lr"):
        load_config(environ={"FORGESTREAM_POLICY_LEARNER__LR": "fast"})
    with pytest.raises(ConfigError, match="no_such_field"):
        load_config(environ={"FORGESTREAM_KAFKA__NO_SUCH_FIELD": "1"})


def test_a_domain_flag_is_also_the_presets_bootstrap_domain() -> None:
    """`up` / `eval` / `prepare --domain X` bootstrap the tiny presets on X (a household preset answered
    TextWorld out of format), and `up` hands that to its roles as an environment override they parse."""
    import json

    from app.cli import domain_flags
    from infra.config import load_config

    assert load_config(environ={}).policy_model.bootstrap_domains == ("household",)
    cfg = load_config(environ={}, flags=domain_flags("textworld"))
    assert cfg.scheduler.domain == "textworld"
    assert cfg.policy_model.bootstrap_domains == cfg.reward_model.bootstrap_domains == ("textworld",)
    role_env = {"FORGESTREAM_POLICY_MODEL__BOOTSTRAP_DOMAINS": json.dumps(["textworld", "household"])}
    assert load_config(environ=role_env).policy_model.bootstrap_domains == ("textworld", "household")
    assert domain_flags(None) == {}
