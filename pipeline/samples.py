"""Judged groups -> training samples: the wire-level half of the signals math.

Shared by the signals role (live) and replay (recomputing reward-model samples from the judged
topic with today's settings), so both apply `algorithm.group_signals` and key samples identically:
policy samples `request_id/rollout/step` (`.../r<k>` for the k-th invalid draw passed over at that
step), reward samples `request_id/rollout/step/judgement`.
"""

from __future__ import annotations

import algorithm
from schemas.config import SignalsConfig
from schemas.events import (
    JudgedTrajectory,
    PolicySample,
    PolicySampleBatch,
    RejectedAnswer,
    RewardSample,
    RewardSampleBatch,
    Step,
    Trajectory,
    finite,
)


def build_samples(
    request_id: str,
    judged: list[JudgedTrajectory],
    config: SignalsConfig,
    *,
    listed_token_loss: bool = False,
    listed_conditional: bool = False,
) -> tuple[PolicySampleBatch, RewardSampleBatch, algorithm.GroupSignals]:
    """Policy and reward-model sample batches of one request's judged rollouts (pure). With
    `listed_token_loss` (the policy learner trains it) the invalid draws passed over are kept at any
    penalty, 0 included, for where they left the listed answers; with `listed_conditional` (the
    listed-conditional term) each played valid answer carries its state's listed answers."""
    for j in judged:
        if len(j.steps) != len(j.trajectory.steps):
            raise ValueError(f"{j.key}: {len(j.steps)} step judgements for {len(j.trajectory.steps)} steps")
    outcomes = [j.trajectory.outcome for j in judged]
    verdicts = [[s.verdicts for s in j.steps] for j in judged]
    scores = [[[x.score for x in s.judgements] for s in j.steps] for j in judged]
    states = [[s.prompt for s in j.trajectory.steps] for j in judged] if config.baseline == "state" else None
    # invalid answers: their verdicts stay out of the policy's R when the config says so; with
    # invalid_penalty they leave the baseline and are pushed down by a fixed amount
    invalid = [[not s.valid_action for s in j.trajectory.steps] for j in judged]
    signals = algorithm.group_signals(
        outcomes,
        verdicts,
        lam=config.lam,
        rm_lam=config.rm_lam,
        rm_acc_low=config.rm_acc_low,
        rm_acc_high=config.rm_acc_high,
        policy_acc_low=config.policy_acc_low,
        policy_acc_high=config.policy_acc_high,
        episode_weighting=config.episode_weighting,
        rm_outcome_balance=config.rm_outcome_balance,
        scores=scores,
        states=states,
        unjudged=None if config.judge_invalid_steps else invalid,
        invalid=invalid,
        invalid_penalty=config.invalid_penalty,
    )
    penalize_after_prefix = (
        config.invalid_penalty > 0 and config.invalid_penalty_tokens == "after_listed_prefix"
    )

    def policy_sample(trajectory: Trajectory, step: Step, answer: Step | RejectedAnswer, key: str,
                      advantage: float, reward: float, advantage_from: int) -> PolicySample:  # fmt: skip
        # an invalid answer of a step that lists its answers: where it left them (the listed-token loss)
        left = None
        if step.listed_answers and not (answer is step and step.valid_action):
            left = algorithm.first_unlisted_token(answer.response_token_ids, step.listed_answers)
        return PolicySample(
            sample_key=f"{request_id}/{trajectory.rollout_index}/{step.index}{key}",
            task_id=trajectory.task.task_id,
            prompt_token_ids=step.prompt_token_ids,
            response_token_ids=answer.response_token_ids,
            behaviour_logprobs=answer.behaviour_logprobs,
            policy_version=step.policy_version,
            advantage=finite(advantage),
            reward=finite(reward),
            advantage_from=advantage_from,
            unlisted_at=left[0] if left else 0,
            listed_tokens=left[1] if left else [],
            # a played valid answer was drawn from the policy conditioned on naming a listed action
            listed_answers=step.listed_answers
            if listed_conditional and answer is step and step.valid_action
            else [],
        )

    policy: list[PolicySample] = []
    for target in signals.policy:
        trajectory = judged[target.rollout].trajectory
        step = trajectory.steps[target.step]
        start = step.listed_prefix_tokens if penalize_after_prefix and not step.valid_action else 0
        policy.append(policy_sample(trajectory, step, step, "", target.advantage, target.reward, start))
    # the invalid draws an actor passed over (actor.redraw > 1) are pushed down as a played invalid
    # answer is; they had no turn, so no R (reward is the penalty too) and no baseline. For the
    # listed-token loss they are kept at any penalty, 0 included (at advantage 0 and without that loss
    # they would train nothing and only thin each batch's mean)
    penalty = 0.0 - config.invalid_penalty  # (0.0 - 0.0 is 0.0, not -0.0)
    for trajectory in (j.trajectory for j in judged):
        for step in trajectory.steps:
            if config.invalid_penalty > 0 or (listed_token_loss and step.listed_answers):
                for k, draw in enumerate(step.rejected):
                    start = draw.listed_prefix_tokens if penalize_after_prefix else 0
                    policy.append(policy_sample(trajectory, step, draw, f"/r{k}", penalty, penalty, start))
    reward: list[RewardSample] = []
    for target in signals.reward:
        jt = judged[target.rollout]
        step_index = jt.trajectory.steps[target.step].index
        judgement = jt.steps[target.step].judgements[target.judgement]
        reward.append(
            RewardSample(
                sample_key=f"{request_id}/{jt.trajectory.rollout_index}/{step_index}/{target.judgement}",
                prompt_token_ids=judgement.prompt_token_ids,
                response_token_ids=judgement.response_token_ids,
                behaviour_logprobs=judgement.behaviour_logprobs,
                reward_version=jt.reward_version,
                advantage=finite(target.advantage),
                reward=finite(target.reward),
            )
        )
    return (
        PolicySampleBatch(request_id=request_id, samples=policy),
        RewardSampleBatch(request_id=request_id, samples=reward),
        signals,
    )
