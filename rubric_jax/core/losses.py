"""Per-token policy-gradient losses [B, T] for PPO-style RL of LLMs, to be minimised.

Every loss here is the negated per-token objective; how tokens are combined into one scalar (token mean,
sequence mean, Dr.GRPO's constant) is `aggregation.py`'s job, so every loss composes with every mode.

Shared conventions:
- Array names carry their axes: `logp_bt` is log pi_theta(y_t) of the policy being trained (the gradient
  flows through it), `old_logp_bt` log pi_old(y_t) of the policy the advantages were estimated for,
  `advantages_bt` the per-token advantage, `mask_bt` the response mask [B, T] (bool; other types are cast).
- Computation runs in float32 (or the inputs' wider float type): bfloat16 inputs are promoted first.
- A masked token's loss, ratio and diagnostics are 0 (False). Its inputs are replaced by 0 before any
  exp or log, so padding values (NaN, +-inf) reach neither the value nor the gradient.
- log r = clip(logp - old_logp, -log_ratio_clamp, log_ratio_clamp), clamp 20 as in verl: e^20 ~ 4.9e8
  keeps exp finite in float32. Where a clamp is active it passes no gradient (as torch.clamp in verl).
- Per-token diagnostics come back as small NamedTuples so the trainer can log clip fractions
  (masked mean of `clipped_bt`) without recomputing ratios.
"""

from typing import NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp

from rubric_jax.core.segments import as_stats_dtype


class PolicyLossInfo(NamedTuple):
    """Per-token diagnostics of a ratio-based loss; 0 / False on masked tokens."""

    ratio_bt: jax.Array  # value of the importance ratio the loss used (float32)
    clipped_bt: jax.Array  # bool: the clip decided this token's loss (see each loss for the exact rule)


class DualClipInfo(NamedTuple):
    """`PolicyLossInfo` plus the tokens whose loss the dual clip capped at -A c (verl's pg_clipfrac_lower)."""

    ratio_bt: jax.Array
    clipped_bt: jax.Array
    dual_clipped_bt: jax.Array


class OffPolicyWeight(NamedTuple):
    """The weight an off-policy token's loss -w A uses, after LUFFY's clips, and which clip bound it met;
    0 / False on masked tokens. LUFFY logs the masked means of the flags (off_ratio_max_clip_frac,
    off_ratio_min_clip_frac)."""

    weight_bt: jax.Array
    clipped_high_bt: jax.Array  # bool: weight >= max_clip
    clipped_low_bt: jax.Array  # bool: weight <= min_clip


class MixedPolicyInfo(NamedTuple):
    """Diagnostics of the RGR-GRPO mixed-policy loss: on-policy tokens' ratio r (0 on off-policy tokens) and
    off-policy tokens' shaped probability f(p) after the optional clips (0 on on-policy tokens); the paper's
    Figure 4 tracks both. The clip flags are `OffPolicyWeight`'s (all False when no clip is set)."""

    ratio_bt: jax.Array
    shaped_prob_bt: jax.Array
    off_clipped_high_bt: jax.Array
    off_clipped_low_bt: jax.Array


def _check_tokens(*arrays_bt: jax.Array) -> None:
    chex.assert_rank(list(arrays_bt), 2)
    chex.assert_equal_shape(list(arrays_bt))


def _masked(mask_bt: jax.Array, values_bt: jax.Array) -> jax.Array:
    return jnp.where(mask_bt, as_stats_dtype(values_bt), 0)


def clamped_log_ratio(
    logp_bt: jax.Array, old_logp_bt: jax.Array, mask_bt: jax.Array, *, clamp: float = 20.0
) -> jax.Array:
    """log(pi / pi_old) per token = clip(logp - old_logp, -clamp, clamp), float32; 0 on masked tokens.

    Shared by every ratio in the core (PPO ratios, rollout-mismatch weights, KL's delta = ref_logp - logp).
    The difference is masked before the clamp and before any exp, so masked padding never produces NaN.
    """
    _check_tokens(logp_bt, old_logp_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    return jnp.clip(jnp.where(mask_bt, as_stats_dtype(logp_bt) - as_stats_dtype(old_logp_bt), 0), -clamp, clamp)


def _clipped_surrogate(
    ratio_bt: jax.Array, advantages_bt: jax.Array, mask_bt: jax.Array, eps_low: float, eps_high: float
) -> tuple[jax.Array, PolicyLossInfo]:
    advantages_bt = _masked(mask_bt, advantages_bt)
    unclipped = -advantages_bt * ratio_bt
    clipped = -advantages_bt * jnp.clip(ratio_bt, 1 - eps_low, 1 + eps_high)
    loss = jnp.where(mask_bt, jnp.maximum(unclipped, clipped), 0)
    # verl's pg_clipfrac: the clipped branch is strictly the larger loss, so the token gets no gradient.
    return loss, PolicyLossInfo(jnp.where(mask_bt, ratio_bt, 0), mask_bt & (clipped > unclipped))


def ppo_clip_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, PolicyLossInfo]:
    """PPO clipped surrogate (Schulman et al. 2017, eq 7), asymmetric as in DAPO's clip-higher (Yu et al. 2025).

    loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(clamped log r). Symmetric PPO by default;
    DAPO's clip-higher is eps_low=0.2, eps_high=0.28. `clipped_bt` marks tokens where the clipped term is
    strictly the smaller objective (zero gradient). Returns (loss_bt, PolicyLossInfo).
    """
    mask_bt = mask_bt.astype(bool)
    ratio_bt = jnp.exp(clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp))
    _check_tokens(ratio_bt, advantages_bt)
    return _clipped_surrogate(ratio_bt, advantages_bt, mask_bt, eps_low, eps_high)


def dual_clip_ppo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, DualClipInfo]:
    """Dual-clip PPO (Ye et al. 2020, "Mastering complex control in MOBA games"; verl's clip_ratio_c):
    for A < 0, loss = min(ppo_clip_loss, -A c); for A >= 0 it is ppo_clip_loss.

    Bounds the loss of a negative-advantage token whose ratio exploded; tokens so capped get no gradient.
    c must be a static Python number > 1 (verl default 3; the SRaR run script uses 10): c <= 1 would cap the
    loss at or below its on-policy value -A (r = 1), so it is rejected with ValueError. Returns (loss_bt, DualClipInfo).
    """
    if not clip_ratio_c > 1:
        raise ValueError(f"dual clip needs clip_ratio_c > 1, got {clip_ratio_c}")
    mask_bt = mask_bt.astype(bool)
    clip = dict(eps_low=eps_low, eps_high=eps_high, log_ratio_clamp=log_ratio_clamp)
    loss_bt, info = ppo_clip_loss(logp_bt, old_logp_bt, advantages_bt, mask_bt, **clip)
    advantages_bt = _masked(mask_bt, advantages_bt)
    cap_bt = -advantages_bt * clip_ratio_c
    dual_clipped_bt = mask_bt & (advantages_bt < 0) & (loss_bt > cap_bt)
    return jnp.where(dual_clipped_bt, cap_bt, loss_bt), DualClipInfo(info.ratio_bt, info.clipped_bt, dual_clipped_bt)


def gspo_sequence_ratio(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    log_ratio_clamp: float = 20.0,
    seq_log_ratio_clamp: float = 10.0,
) -> jax.Array:
    """GSPO sequence ratio in its GSPO-token form (Zheng et al. 2025, sections 4.1 and 4.3), on tokens [B, T].

    Value: s_b = exp(clip(L_b, -seq_log_ratio_clamp, seq_log_ratio_clamp)), L_b the masked mean over the
    sequence's valid tokens of the clamped per-token log r: a geometric mean, so the value does not depend on
    the sequence's length. Gradient: s_{b,t} = sg(s_b) * pi(y_t) / sg(pi(y_t)), built in log space as
    (log r_t - sg(log r_t)) + sg(L_b), whose value is exactly L_b. Summed over t with weight 1/|y_b| (the
    seq-mean-token-mean aggregation) its gradient is s_b * grad(mean_t log pi) = grad s_b, GSPO's gradient.
    The sequence clamp (verl's 10) applies to the sum as a whole, so a saturated sequence passes no gradient
    and every gradient is bounded by e^10. A fully masked row has ratio 0 (it carries no loss).
    """
    mask_bt = mask_bt.astype(bool)
    log_ratio_bt = clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp)
    count_b = jnp.sum(mask_bt, axis=-1)
    seq_log_ratio_b = jnp.sum(log_ratio_bt, axis=-1) / jnp.maximum(count_b, 1)
    token_part_bt = log_ratio_bt - jax.lax.stop_gradient(log_ratio_bt)
    log_s_bt = token_part_bt + jax.lax.stop_gradient(seq_log_ratio_b)[:, None]
    return jnp.where(mask_bt, jnp.exp(jnp.clip(log_s_bt, -seq_log_ratio_clamp, seq_log_ratio_clamp)), 0)


def gspo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    log_ratio_clamp: float = 20.0,
    seq_log_ratio_clamp: float = 10.0,
) -> tuple[jax.Array, PolicyLossInfo]:
    """GSPO / GSPO-token (Zheng et al. 2025): -min(s A, clip(s, 1 - eps_low, 1 + eps_high) A)
    per token, with s the sequence ratio of `gspo_sequence_ratio`.

    Aggregate with seq-mean-token-mean: with a per-sequence advantage the result is exactly GSPO's
    objective (1/G) sum_i min(s_i A_i, clip(s_i) A_i), with no weighting by length; with per-token
    advantages it is GSPO-token. Default clip range (3e-4, 4e-4) is the paper's. Returns
    (loss_bt, PolicyLossInfo) whose ratio is s and whose clipped rule is PPO's.
    """
    mask_bt = mask_bt.astype(bool)
    ratio_bt = gspo_sequence_ratio(
        logp_bt, old_logp_bt, mask_bt, log_ratio_clamp=log_ratio_clamp, seq_log_ratio_clamp=seq_log_ratio_clamp
    )
    _check_tokens(ratio_bt, advantages_bt)
    return _clipped_surrogate(ratio_bt, advantages_bt, mask_bt, eps_low, eps_high)


def cispo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    eps_high: float,
    eps_low: float = 1.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, PolicyLossInfo]:
    """CISPO (MiniMax-M1, 2025, section 3.1): loss = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A logp.

    The clipped ratio is a detached weight, so every token keeps the REINFORCE gradient -w A grad(logp),
    clipped ones included. MiniMax-M1 sets no lower bound (eps_low large: the default 1.0 clips at 0, which
    r never goes below) and tunes only eps_high, so eps_high has no default. The loss value itself is a
    surrogate (logp times a weight), only its gradient is meaningful. `clipped_bt` marks tokens whose
    weight was clipped. Returns (loss_bt, PolicyLossInfo).
    """
    mask_bt = mask_bt.astype(bool)
    ratio_bt = jnp.exp(clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp))
    _check_tokens(ratio_bt, advantages_bt)
    low, high = 1 - eps_low, 1 + eps_high
    weight_bt = jax.lax.stop_gradient(jnp.clip(ratio_bt, low, high))
    loss_bt = jnp.where(mask_bt, -weight_bt * _masked(mask_bt, advantages_bt) * _masked(mask_bt, logp_bt), 0)
    clipped_bt = mask_bt & ((ratio_bt < low) | (ratio_bt > high))
    return loss_bt, PolicyLossInfo(jnp.where(mask_bt, ratio_bt, 0), clipped_bt)


def no_clip_pg_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, PolicyLossInfo]:
    """Unclipped importance-weighted policy gradient: loss = -r A (RGR-GRPO eq 10's on-policy term; the paper
    removes PPO's clip and the KL term in its experimental setup). Only the log-ratio clamp bounds r. `clipped_bt` is
    all False. Returns (loss_bt, PolicyLossInfo).
    """
    mask_bt = mask_bt.astype(bool)
    ratio_bt = jnp.exp(clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp))
    _check_tokens(ratio_bt, advantages_bt)
    loss_bt = jnp.where(mask_bt, -_masked(mask_bt, advantages_bt) * ratio_bt, 0)
    return loss_bt, PolicyLossInfo(jnp.where(mask_bt, ratio_bt, 0), jnp.zeros_like(mask_bt))


def off_policy_shaping(logp_bt: jax.Array, *, gamma: float = 0.1) -> jax.Array:
    """Policy shaping f(p) = p / (p + gamma), p = exp(logp) (LUFFY, Yan et al. 2025; RGR-GRPO eq 11).

    Applied to the current policy's probability of an off-policy token, not to a ratio: RGR-GRPO writes
    f_shape(r_t) but its eq 11 is pi_theta / (pi_theta + gamma), as LUFFY's code computes it. Its gradient
    f'(p) = gamma / (p + gamma)^2 grows as p falls, lifting low-probability tokens of the refined trajectory.
    Computed as sigmoid(logp - log gamma), the same function, stable for any logp <= 0. gamma must
    be a static number > 0 (the papers use 0 < gamma < 1 and set 0.1). No masking: callers mask.
    """
    if not gamma > 0:
        raise ValueError(f"shaping needs gamma > 0, got {gamma}")
    return jax.nn.sigmoid(as_stats_dtype(logp_bt) - jnp.log(gamma))


def clip_off_policy_weight(
    weight_bt: jax.Array, mask_bt: jax.Array, *, max_clip: Optional[float] = None, min_clip: Optional[float] = None
) -> OffPolicyWeight:
    """LUFFY's off-policy clips (Yan et al. 2025, code: luffy/verl/verl/mix_src/mix_core_alg.py,
    compute_token_on_off_policy_loss, options off_policy_max_clip / off_policy_min_clip; -1 there = None here).

    LUFFY clamps the off-policy token's weight w, whatever it is: with shaping ("p_div_p_0.1") w = f(p), without
    it ("no_reshape") w = p itself, never a ratio to a behaviour policy. It clamps at max_clip, then at
    min_clip; with min_clip <= max_clip (required here) that is clip(w, min_clip, max_clip). As torch.clamp, a
    token passes its gradient where min_clip <= w <= max_clip (bounds included) and none where a bound is
    active. The flags follow LUFFY's counts `off_ratio == bound` after the clamps: w >= max_clip, w <= min_clip.
    Both clips are off (None) in LUFFY's released run script and RGR-GRPO mentions none.
    Bounds are static Python numbers; weight_bt [B, T] float, masked tokens give weight 0 and no flags.
    """
    if max_clip is not None and min_clip is not None and min_clip > max_clip:
        raise ValueError(f"min_clip {min_clip} must not exceed max_clip {max_clip}")
    _check_tokens(weight_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    weight_bt = _masked(mask_bt, weight_bt)
    clipped_high_bt = mask_bt & (weight_bt >= max_clip) if max_clip is not None else jnp.zeros_like(mask_bt)
    clipped_low_bt = mask_bt & (weight_bt <= min_clip) if min_clip is not None else jnp.zeros_like(mask_bt)
    # where(), not jnp.clip: at w == bound jnp.clip's min/max split the gradient in halves, torch.clamp passes it
    if max_clip is not None:
        weight_bt = jnp.where(weight_bt > max_clip, max_clip, weight_bt)
    if min_clip is not None:
        weight_bt = jnp.where(weight_bt < min_clip, min_clip, weight_bt)
    return OffPolicyWeight(jnp.where(mask_bt, weight_bt, 0), clipped_high_bt, clipped_low_bt)


def shaped_off_policy_loss(
    logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    gamma: float = 0.1,
    max_clip: Optional[float] = None,
    min_clip: Optional[float] = None,
) -> tuple[jax.Array, OffPolicyWeight]:
    """LUFFY / RGR-GRPO off-policy term: loss = -w A with w = `off_policy_shaping` f(p), no ratio to a behaviour
    policy, and `clip_off_policy_weight`'s optional clips on w (None: none, LUFFY's and RGR-GRPO's default).
    The gradient flows through p. Returns (loss_bt, OffPolicyWeight), 0 on masked tokens.
    """
    _check_tokens(logp_bt, advantages_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    off = clip_off_policy_weight(off_policy_shaping(_masked(mask_bt, logp_bt), gamma=gamma), mask_bt,
                                 max_clip=max_clip, min_clip=min_clip)
    return jnp.where(mask_bt, -off.weight_bt * _masked(mask_bt, advantages_bt), 0), off


def rgr_mixed_policy_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    off_policy_b: jax.Array,
    *,
    gamma: float = 0.1,
    log_ratio_clamp: float = 20.0,
    off_max_clip: Optional[float] = None,
    off_min_clip: Optional[float] = None,
) -> tuple[jax.Array, MixedPolicyInfo]:
    """RGR-GRPO mixed-policy objective (eqs 10 and 12), per token, as LUFFY applies it.

    Rows with off_policy_b [B] False were sampled from pi_old for this prompt: loss = -r A
    (`no_clip_pg_loss`). Rows marked True are the rubric-guided refinement o_G, sampled from pi_old under a
    different context (q, o_best, failed criteria): loss = -f(p) A (`shaped_off_policy_loss`), p the current
    policy's probability of the token under the training prompt, f(p) optionally clipped to
    [off_min_clip, off_max_clip] (LUFFY's off-policy clips, `clip_off_policy_weight`; off by default). Their
    `old_logp_bt` is not used (it is not the behaviour policy's probability), so any value there is harmless.
    Eq 10 sums each response's tokens and divides by the group size G (the paper drops token-level
    normalisation, after Dr.GRPO): that is seq-mean-token-sum, or seq-mean-token-sum-norm up to its constant.
    Returns (loss_bt, MixedPolicyInfo).
    """
    chex.assert_rank(off_policy_b, 1)
    chex.assert_equal_shape_prefix([logp_bt, off_policy_b], 1)
    mask_bt = mask_bt.astype(bool)
    off_bt = off_policy_b.astype(bool)[:, None]
    on_loss_bt, on_info = no_clip_pg_loss(
        logp_bt, old_logp_bt, advantages_bt, mask_bt & ~off_bt, log_ratio_clamp=log_ratio_clamp
    )
    off_loss_bt, off = shaped_off_policy_loss(logp_bt, advantages_bt, mask_bt & off_bt, gamma=gamma,
                                              max_clip=off_max_clip, min_clip=off_min_clip)
    return on_loss_bt + off_loss_bt, MixedPolicyInfo(on_info.ratio_bt, off.weight_bt, off.clipped_high_bt,
                                                     off.clipped_low_bt)


def _mismatch_log_weights(
    old_logp_bt: jax.Array, rollout_logp_bt: jax.Array, mask_bt: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Detached log w = log(pi_old / pi_rollout) (clamped) and the tokens where it is usable: valid and finite."""
    _check_tokens(old_logp_bt, rollout_logp_bt, mask_bt)
    usable_bt = mask_bt.astype(bool) & jnp.isfinite(as_stats_dtype(old_logp_bt) - as_stats_dtype(rollout_logp_bt))
    return jax.lax.stop_gradient(clamped_log_ratio(old_logp_bt, rollout_logp_bt, usable_bt)), usable_bt


def tis_weights(
    old_logp_bt: jax.Array, rollout_logp_bt: jax.Array, mask_bt: jax.Array, *, cap: float = 2.0
) -> jax.Array:
    """Truncated importance sampling for rollout/train mismatch (Yao et al. 2025, "Your efficient RL framework
    secretly brings you off-policy RL training"; verl's rollout_is): weight = min(w, cap), w = pi_old / pi_rollout.

    Shared conventions of the three mismatch corrections: w = exp(clip(old_logp - rollout_logp, -20, 20)),
    detached (stop_gradient); a token whose log w is not finite (NaN or +-inf log-probabilities from the
    engine) and a masked token get weight 0. Multiply the per-token loss by the returned weights [B, T].
    Default cap 2 as verl's rollout_is_threshold.
    """
    log_w_bt, usable_bt = _mismatch_log_weights(old_logp_bt, rollout_logp_bt, mask_bt)
    return jnp.where(usable_bt, jnp.minimum(jnp.exp(log_w_bt), cap), 0)


def icepop_weights(
    old_logp_bt: jax.Array, rollout_logp_bt: jax.Array, mask_bt: jax.Array, *, low: float = 0.5, high: float = 5.0
) -> jax.Array:
    """IcePop token masking (inclusionAI Ling team, 2025): weight = w where low <= w <= high, else 0 (bounds
    inclusive; defaults 0.5 and 5, OpenRLHF's). Conventions as `tis_weights`.
    """
    log_w_bt, usable_bt = _mismatch_log_weights(old_logp_bt, rollout_logp_bt, mask_bt)
    w_bt = jnp.exp(log_w_bt)
    return jnp.where(usable_bt & (w_bt >= low) & (w_bt <= high), w_bt, 0)


def seq_mask_tis_weights(
    old_logp_bt: jax.Array, rollout_logp_bt: jax.Array, mask_bt: jax.Array, *, low: float = 0.5, high: float = 5.0
) -> jax.Array:
    """Sequence-masked IS (OpenRLHF's and NeMo-RL's seq-mask-tis): a sequence whose geometric-mean weight exp(mean_t log w) lies outside [low, high] gets weight
    0 on every token; a kept sequence keeps its per-token weights w, untruncated, as in OpenRLHF.

    The mean runs over the sequence's usable tokens (valid, finite log w), so it does not grow with length;
    non-finite tokens weigh 0 and do not enter it; a row with no usable token is masked. Defaults as
    `icepop_weights` (OpenRLHF shares one band); narrow bands (e.g. [0.99, 1.01]) discard much more.
    Conventions as `tis_weights`.
    """
    log_w_bt, usable_bt = _mismatch_log_weights(old_logp_bt, rollout_logp_bt, mask_bt)
    count_b = jnp.sum(usable_bt, axis=-1)
    geo_mean_b = jnp.exp(jnp.sum(log_w_bt, axis=-1) / jnp.maximum(count_b, 1))
    keep_b = (count_b > 0) & (geo_mean_b >= low) & (geo_mean_b <= high)
    return jnp.where(usable_bt & keep_b[:, None], jnp.exp(log_w_bt), 0)


def subtract_entropy_bonus(
    loss_bt: jax.Array, entropy_bt: jax.Array, mask_bt: jax.Array, *, coeff: float
) -> jax.Array:
    """Entropy bonus (verl's entropy_coeff; RGR-GRPO uses 0.01): loss - coeff * entropy per token, 0 on masked.

    `entropy_bt` is the policy's per-token entropy from the model layer; the gradient flows through it.
    Aggregation is linear, so aggregating the result with any mode equals subtracting coeff times the
    entropy aggregated with that same mode, the way verl applies it.
    """
    _check_tokens(loss_bt, entropy_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    return jnp.where(mask_bt, _masked(mask_bt, loss_bt) - coeff * _masked(mask_bt, entropy_bt), 0)
