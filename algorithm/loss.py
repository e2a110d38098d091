"""Decoupled PPO loss with a truncated importance weight and k3-KL to the proximal policy.

Three policies meet here (DESIGN section 2, "off-policy correction"):
- behaviour: the (possibly stale) weights an actor sampled with; logprobs recorded per token;
- proximal: the learner's weights before this update (recomputed by the learner, no grad);
- current: the weights being optimised (`logp`, with grad).
The clip acts on ratio = pi/pi_prox, so the trust region is around the proximal policy however
stale the behaviour policy was; the importance weight w = min(pi_prox/pi_behav, is_cap) corrects
the off-policy sampling and is a constant (detached). With behav == prox, w == 1 and this is plain
PPO-clip plus the KL term. Optionally a fourth, the reference (the start weights), anchors a long run
with a second k3-KL term, as TRL's and verl's reference KL.
"""

from __future__ import annotations

import torch
from torch import Tensor


def policy_loss(
    logp: Tensor,
    prox_logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip: float = 0.2,
    kl_coef: float = 0.01,
    is_cap: float = 2.0,
    ref_logp: Tensor | None = None,
    ref_kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Loss of a batch of samples and its diagnostics.

    Shapes: `logp`, `prox_logp`, `behav_logp`, `mask` are [B, T] (mask is 1 on response tokens);
    `advantages` is [B] (one scalar per sample, applied to each of its tokens) or [B, T].

    Per token: `-w * min(ratio * A, clamp(ratio, 1 - clip, 1 + clip) * A) + kl_coef * k3`, with
    ratio = exp(logp - prox), w = min(exp(prox - behav), is_cap) (detached) and
    k3 = exp(prox - logp) - (prox - logp) - 1 (>= 0, an unbiased estimate of KL(current || prox)).
    With `ref_logp` ([B, T], the reference policy's logprobs) the per-token loss adds
    `ref_kl_coef * k3_ref`, k3_ref = exp(ref - logp) - (ref - logp) - 1 (KL(current || reference)).
    The loss is the masked token mean per sample, then the mean over samples that have at least
    one response token (0 if none has).

    Diagnostics (floats, over all response tokens of the batch): clip_fraction (|ratio - 1| > clip),
    is_weight_mean, is_weight_max (of the truncated weight), is_truncated_fraction (raw weight >
    is_cap), kl (mean k3), ref_kl (mean k3_ref, 0 without a reference), ratio_mean; advantage_mean
    over the samples counted in the loss.
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must be [B, T], got shape {tuple(logp.shape)}")
    named = [("prox_logp", prox_logp), ("behav_logp", behav_logp), ("mask", mask)]
    for name, t in named + ([("ref_logp", ref_logp)] if ref_logp is not None else []):
        if t.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logp has {tuple(logp.shape)}")
    if advantages.dim() == 1:
        if advantages.shape[0] != logp.shape[0]:
            raise ValueError(f"advantages has {advantages.shape[0]} samples, logp has {logp.shape[0]}")
        token_adv = advantages.unsqueeze(1).expand_as(logp)
    elif advantages.shape == logp.shape:
        token_adv = advantages
    else:
        raise ValueError(f"advantages must be [B] or [B, T], got shape {tuple(advantages.shape)}")

    mask = mask.to(logp.dtype)
    prox_logp = prox_logp.detach()
    token_adv = token_adv.detach().to(logp.dtype)

    log_ratio = logp - prox_logp
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * token_adv, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * token_adv)
    raw_weight = torch.exp(prox_logp - behav_logp.detach())
    weight = torch.clamp(raw_weight, max=is_cap)
    k3 = torch.exp(-log_ratio) + log_ratio - 1.0
    per_token = -weight * surrogate + kl_coef * k3
    if ref_logp is not None:
        ref_log_ratio = logp - ref_logp.detach()
        k3_ref = torch.exp(-ref_log_ratio) + ref_log_ratio - 1.0
        per_token = per_token + ref_kl_coef * k3_ref
    else:
        k3_ref = torch.zeros_like(k3)

    tokens_per_sample = mask.sum(dim=1)
    has_tokens = tokens_per_sample > 0
    per_sample = (per_token * mask).sum(dim=1) / tokens_per_sample.clamp(min=1.0)
    n_samples = has_tokens.sum()
    if n_samples > 0:
        loss = per_sample[has_tokens].mean()
    else:
        loss = (per_token * mask).sum()  # 0, still attached to the graph

    with torch.no_grad():
        n_tokens = mask.sum()
        selected = mask > 0

        def token_mean(x: Tensor) -> float:
            return float((x * mask).sum() / n_tokens) if n_tokens > 0 else 0.0

        diagnostics = {
            "clip_fraction": token_mean(((ratio - 1.0).abs() > clip).to(logp.dtype)),
            "is_weight_mean": token_mean(weight),
            "is_weight_max": float(weight[selected].max()) if n_tokens > 0 else 0.0,
            "is_truncated_fraction": token_mean((raw_weight > is_cap).to(logp.dtype)),
            "kl": token_mean(k3),
            "ref_kl": token_mean(k3_ref),
            "ratio_mean": token_mean(ratio),
            "advantage_mean": (
                float((token_adv * mask).sum(dim=1)[has_tokens].div(tokens_per_sample[has_tokens]).mean())
                if n_samples > 0
                else 0.0
            ),
        }
    return loss, diagnostics


def listed_token_loss(next_logprobs: Tensor, allowed: list[list[int]]) -> tuple[Tensor, Tensor]:
    """The listed-token loss of a batch of answers that left the listed answers, and each one's mass.

    `next_logprobs` is [N, V]: the policy's next-token logprobs at the token where answer i left every
    listed answer; `allowed[i]` the tokens that would have stayed on one (`first_unlisted_token`). The
    mass of row i is the probability of an allowed token there; the loss is the mean over rows of -log
    of it. At one softmax its gradient moves the logits toward the distribution renormalised over the
    allowed tokens: the mass of the tokens that leave the list goes to those that stay, in proportion to
    what the policy gave each, and nothing before that token is trained. Returns (loss, masses [N],
    detached).
    """
    if next_logprobs.dim() != 2 or next_logprobs.shape[0] != len(allowed) or not allowed:
        raise ValueError(
            f"next_logprobs must be [N, V] with N = {len(allowed)} > 0, got shape {tuple(next_logprobs.shape)}"
        )
    for i, tokens in enumerate(allowed):
        if not tokens:
            raise ValueError(f"row {i}: no allowed token")
    rows = zip(next_logprobs, allowed, strict=True)
    log_mass = torch.stack([torch.logsumexp(row[torch.tensor(tokens)], dim=0) for row, tokens in rows])
    return -log_mass.mean(), log_mass.detach().exp()


def listed_conditional_loss(
    answer_logprobs: list[Tensor], advantages: Tensor, tokens: Tensor
) -> tuple[Tensor, Tensor]:
    """The term that turns the policy loss of answers played under `actor.redraw` into the loss of the
    policy they were drawn from: the policy conditioned on naming a listed action.

    A played answer a was drawn from pi(a | listed) = pi(a) / M, M = sum over the state's listed answers
    of pi(answer) (the listed mass). The policy loss trains -A * log pi(a) per token (its per-sample token
    mean: a sample's sequence weighs 1 / its `tokens`); this adds A * log M / tokens for each sample, so
    the pair trains -A * log pi(a | listed): an answer's advantage moves mass among the listed answers and
    never to or from the unlisted ones. The term is neither clipped nor importance-weighted: exact where
    the samples are on-policy, as the loop's small versions nearly are. `answer_logprobs[i]` is [K_i], the
    sequence logprob of each of state i's listed answers; `advantages` and `tokens` are [N]. Returns (the
    mean over the N samples, each state's mass M [N], detached).
    """
    if len(answer_logprobs) != advantages.shape[0] or advantages.shape != tokens.shape:
        raise ValueError(f"{len(answer_logprobs)} states, advantages {tuple(advantages.shape)}, "
                         f"tokens {tuple(tokens.shape)}: one of each per sample")  # fmt: skip
    for i, lp in enumerate(answer_logprobs):
        if lp.dim() != 1 or lp.shape[0] == 0:
            raise ValueError(
                f"state {i}: answer logprobs must be a non-empty [K], got shape {tuple(lp.shape)}"
            )
    log_mass = torch.stack([torch.logsumexp(lp, dim=0) for lp in answer_logprobs])
    per_sample = advantages.detach().to(log_mass.dtype) * log_mass / tokens.to(log_mass.dtype).clamp(min=1.0)
    return per_sample.mean(), log_mass.detach().exp()
