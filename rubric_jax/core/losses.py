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


def _token_form_row_mean(x_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """[B, T] whose value on every token of row b is the masked mean of x over the row's valid tokens (0 for a
    row with none) and whose gradient at token t is x_t's own: (x_t - sg(x_t)) + sg(mean_b). Summed over a
    row's tokens with weight 1 / |y_b| (seq-mean-token-mean), the gradient is that of the row mean itself."""
    count_b = jnp.sum(mask_bt, axis=-1)
    mean_b = jnp.sum(jnp.where(mask_bt, x_bt, 0), axis=-1) / jnp.maximum(count_b, 1)
    return (x_bt - jax.lax.stop_gradient(x_bt)) + jax.lax.stop_gradient(mean_b)[:, None]


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
    log_s_bt = _token_form_row_mean(log_ratio_bt, mask_bt)
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
    entropy aggregated with that same mode, the way verl's `agg_loss(entropy, loss_agg_mode)` applies it; with
    `entropy_bt` times `aggregation.token_mean_weights` it is coeff times the token-mean entropy whatever the
    mode (LUFFY's and early verl's `masked_mean(entropy)`).
    """
    _check_tokens(loss_bt, entropy_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    return jnp.where(mask_bt, _masked(mask_bt, loss_bt) - coeff * _masked(mask_bt, entropy_bt), 0)


# ---------------------------------------------------------------- soft gates, covariance control, geometric means


class SoftGateInfo(NamedTuple):
    """Per-token diagnostics of SAPO: the ratio r and the gate f(r) that replaced it; 0 on masked tokens."""

    ratio_bt: jax.Array
    gate_bt: jax.Array


class ClipCovInfo(NamedTuple):
    """`PolicyLossInfo` of Clip-Cov: `clipped_bt` marks every token that passes no gradient (PPO-clipped or
    detached by the covariance rule); `cov_detached_bt` the latter alone (verl's pg_clipfrac for clip_cov)."""

    ratio_bt: jax.Array
    clipped_bt: jax.Array
    cov_detached_bt: jax.Array


class KlCovInfo(NamedTuple):
    """Per-token diagnostics of KL-Cov: the ratio r and the tokens that carry the |log r| penalty."""

    ratio_bt: jax.Array
    penalised_bt: jax.Array


class SequenceWeightInfo(NamedTuple):
    """Per-token diagnostics of VESPO: the sequence ratio w_b and the detached weight phi that scales the
    token's -A logp; 0 on masked tokens."""

    ratio_bt: jax.Array
    weight_bt: jax.Array


def _floor_fraction(fraction: float, count: jax.Array) -> jax.Array:
    """floor(fraction * count) as int32, computed as floor(count / (1 / fraction)) in float32: exact where the
    product is an integer and 1 / fraction is one (2e-4 -> 5000, 0.2 -> 5), as verl's float64 int(ratio * n)
    is there; float32 count * fraction would give 1.9999999 for 2e-4 * 10000. fraction 0 gives 0."""
    if fraction == 0:
        return jnp.zeros_like(count, jnp.int32)
    return jnp.floor(count.astype(jnp.float32) / jnp.float32(1 / fraction)).astype(jnp.int32)


def abs_zero_subgradient(x: jax.Array) -> jax.Array:
    """|x| whose derivative is sign(x), 0 at x = 0, as torch's abs (verl's |log r| and "abs" KL); jnp.abs's is
    1 at 0, which would push an on-policy token (log r = 0 exactly) in an arbitrary direction."""
    return jnp.sign(x) * x


def _descending_ranks(scores_bt: jax.Array, candidates_bt: jax.Array) -> jax.Array:
    """Each candidate's 0-based rank among the candidates by descending score, equal scores ranked by row-major
    position (the lower first); B * T for non-candidates. scores must be finite on candidates."""
    size = scores_bt.size
    keys = jnp.where(candidates_bt, -scores_bt, jnp.inf).ravel()
    order = jnp.argsort(keys, stable=True)
    ranks = jnp.zeros(size, jnp.int32).at[order].set(jnp.arange(size, dtype=jnp.int32))
    return jnp.where(candidates_bt, ranks.reshape(scores_bt.shape), size)


def top_k_tokens(scores_bt: jax.Array, candidates_bt: jax.Array, k: jax.Array) -> jax.Array:
    """bool [B, T]: the min(k, number of candidates) candidates of highest score, over the whole batch; equal
    scores are taken in row-major order (the lower position first), so the choice is deterministic. k may be a
    traced integer; k <= 0 selects nothing. Scores must be finite on candidates."""
    _check_tokens(scores_bt, candidates_bt)
    candidates_bt = candidates_bt.astype(bool)
    return candidates_bt & (_descending_ranks(as_stats_dtype(scores_bt), candidates_bt) < k)


def token_covariance(logp_bt: jax.Array, advantages_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """Each valid token's term of the covariance of log-probability and advantage over the batch's valid tokens,
    (A_t - mean A)(logp_t - mean logp), the means over every valid token of the [B, T] it is given (Cui et al.
    2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", section 4: the
    entropy change is driven by this covariance; verl's clip_cov / kl_cov). Detached (a selection score, no
    gradient), float32, 0 on masked tokens; an all-masked batch gives zeros.
    """
    _check_tokens(logp_bt, advantages_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    logp_bt = jax.lax.stop_gradient(_masked(mask_bt, logp_bt))
    advantages_bt = jax.lax.stop_gradient(_masked(mask_bt, advantages_bt))
    count = jnp.maximum(jnp.sum(mask_bt), 1)
    centred_logp_bt = logp_bt - jnp.sum(logp_bt) / count
    centred_advantages_bt = advantages_bt - jnp.sum(advantages_bt) / count
    return jnp.where(mask_bt, centred_advantages_bt * centred_logp_bt, 0)


def sapo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, SoftGateInfo]:
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347; verl's and TRL's "sapo"):
    loss = -f(r) A with the soft gate f(r) = (4 / tau) sigmoid(tau (r - 1)) in place of PPO's hard clip, tau =
    tau_pos where A > 0 and tau_neg where A <= 0 (as verl and TRL; the paper's defaults 1.0 and 1.05, the
    negative side decaying faster).

    d loss / d logp = -A r f'(r) = -A * 4 r s (1 - s), s = sigmoid(tau (r - 1)): exactly the unclipped
    surrogate's -A r at r = 1, and smoothly attenuated as r leaves 1 (never more than r, and at most
    4 r e^(-tau |r - 1|)), so no token's gradient is cut off abruptly. The value at r = 1 is -2 A / tau, not -A:
    only the gradient matches PPO's on-policy. verl and TRL aggregate it with seq-mean-token-mean; it is a
    token-level loss and composes with any mode. Temperatures are static numbers > 0. Returns (loss_bt,
    SoftGateInfo).
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"SAPO needs temperatures > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    mask_bt = mask_bt.astype(bool)
    ratio_bt = jnp.exp(clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp))
    _check_tokens(ratio_bt, advantages_bt)
    advantages_bt = _masked(mask_bt, advantages_bt)
    tau_bt = jnp.where(advantages_bt > 0, tau_pos, tau_neg)
    # exp(log_sigmoid) rather than sigmoid: its derivative comes out as s * sigmoid(-x), not s * (1 - s), which
    # cancels to nothing in float32 where r >> 1 and the gate saturates
    gate_bt = jnp.where(mask_bt, 4 / tau_bt * jnp.exp(jax.nn.log_sigmoid(tau_bt * (ratio_bt - 1))), 0)
    return jnp.where(mask_bt, -gate_bt * advantages_bt, 0), SoftGateInfo(jnp.where(mask_bt, ratio_bt, 0), gate_bt)


def clip_cov_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    key: jax.Array,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, ClipCovInfo]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", section 5.2; verl's "clip_cov"): PPO's clipped loss (`ppo_clip_loss`), with a few high-covariance
    tokens detached, so that they cannot drive the entropy down.

    Candidates: valid tokens that PPO's clip did not already decide and whose `token_covariance` lies strictly
    inside (clip_cov_lb, clip_cov_ub). Of them, max(floor(clip_cov_ratio * n), 1) are detached (n the number
    of valid tokens; all of them if fewer), chosen uniformly at random as in verl (torch.randperm): a token's
    priority is jax.random.uniform(key, [B, T])[b, t] and the highest priorities win (`top_k_tokens`), so the
    choice is a pure function of `key`. A detached token's loss is 0 (verl multiplies it by 0), value and
    gradient. The covariance and the count are over the [B, T] the loss is given: in the accumulated train
    step that is one micro-batch (all its data shards), as in verl, whose loss also sees one micro-batch.
    Defaults are verl's (ratio 2e-4, band (1, 5)); clip_cov_ratio > 0 and lb < ub are static numbers.
    Returns (loss_bt, ClipCovInfo).
    """
    if not clip_cov_ratio > 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(f"clip_cov_lb must be < clip_cov_ub, got ({clip_cov_lb}, {clip_cov_ub})")
    mask_bt = mask_bt.astype(bool)
    loss_bt, info = ppo_clip_loss(
        logp_bt, old_logp_bt, advantages_bt, mask_bt, eps_low=eps_low, eps_high=eps_high,
        log_ratio_clamp=log_ratio_clamp,
    )
    cov_bt = token_covariance(logp_bt, advantages_bt, mask_bt)
    candidates_bt = mask_bt & ~info.clipped_bt & (cov_bt > clip_cov_lb) & (cov_bt < clip_cov_ub)
    count = jnp.maximum(_floor_fraction(clip_cov_ratio, jnp.sum(mask_bt)), 1)
    detached_bt = top_k_tokens(jax.random.uniform(key, mask_bt.shape), candidates_bt, count)
    return jnp.where(detached_bt, 0, loss_bt), ClipCovInfo(info.ratio_bt, info.clipped_bt | detached_bt, detached_bt)


def kl_cov_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    kl_cov_ratio: float = 2e-4,
    kl_coef: float = 1.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, KlCovInfo]:
    """KL-Cov (Cui et al. 2025, section 5.2; verl's "kl_cov"): the unclipped surrogate -r A on every token, plus
    kl_coef * |log r| on the max(floor(kl_cov_ratio * n), 1) valid tokens of largest `token_covariance` (n the
    number of valid tokens; none when n = 0). There is no PPO clip: the penalty is the trust region.

    Deterministic: the top-k by covariance (torch.topk in verl), equal covariances taken in row-major order.
    |log r| uses the clamped log r; its gradient at r = 1 is 0 (as torch's), so the penalty acts from the second
    update on a batch on. Covariance and count are over the [B, T] the loss is given (one micro-batch of the
    accumulated step, as in verl). Defaults: ratio 2e-4 (verl's), kl_coef 1 (verl's function default; its YAML
    says 0.1). Returns (loss_bt, KlCovInfo).
    """
    if not kl_cov_ratio > 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    mask_bt = mask_bt.astype(bool)
    log_ratio_bt = clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp)
    ratio_bt = jnp.exp(log_ratio_bt)
    _check_tokens(ratio_bt, advantages_bt)
    count_valid = jnp.sum(mask_bt)
    count = jnp.where(count_valid > 0, jnp.maximum(_floor_fraction(kl_cov_ratio, count_valid), 1), 0)
    penalised_bt = top_k_tokens(token_covariance(logp_bt, advantages_bt, mask_bt), mask_bt, count)
    penalty_bt = jnp.where(penalised_bt, kl_coef * abs_zero_subgradient(log_ratio_bt), 0)
    loss_bt = -_masked(mask_bt, advantages_bt) * ratio_bt + penalty_bt
    return jnp.where(mask_bt, loss_bt, 0), KlCovInfo(jnp.where(mask_bt, ratio_bt, 0), penalised_bt)


def gmpo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, PolicyLossInfo]:
    """GMPO (Zhao et al. 2025, "Geometric-Mean Policy Optimization", arXiv 2507.20673, eq 4; verl's "geo_mean"):
    per sequence, loss_b = -A_b exp(mean_t l_t), the geometric mean of the token ratios with each token's log r
    clipped in log space, on the side its advantage makes pessimistic: l_t = min(log r, eps_high) where A_t > 0,
    max(log r, -eps_low) where A_t < 0, and 0 where A_t = 0 (verl's sgn(A) min(sgn(A) log r, sgn(A)
    clip(log r))). A_b is the masked mean of A over the row (GMPO's sequence advantage; verl supports only
    per-sequence advantages). Defaults (0.4, 0.4): the paper's range (e^-0.4, e^0.4).

    Per token: loss_b on every valid token, with the gradient of `_token_form_row_mean` (token t's own clipped
    log r), so that seq-mean-token-mean gives exactly (1 / #valid rows) sum_b loss_b and its gradient: aggregate
    with that mode. verl averages over all rows, fully masked ones included; here they are not counted. The
    log r is first clamped to +-log_ratio_clamp (verl leaves it unclamped). `ratio_bt` is the row's ratio;
    `clipped_bt` marks tokens whose clip is active (no gradient). Returns (loss_bt, PolicyLossInfo).
    """
    mask_bt = mask_bt.astype(bool)
    log_ratio_bt = clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp)
    _check_tokens(log_ratio_bt, advantages_bt)
    advantages_bt = _masked(mask_bt, advantages_bt)
    clipped_high_bt = (advantages_bt > 0) & (log_ratio_bt > eps_high)
    clipped_low_bt = (advantages_bt < 0) & (log_ratio_bt < -eps_low)
    token_log_ratio_bt = jnp.where(
        clipped_high_bt, eps_high, jnp.where(clipped_low_bt, -eps_low, jnp.where(advantages_bt == 0, 0, log_ratio_bt))
    )
    ratio_bt = jnp.where(mask_bt, jnp.exp(_token_form_row_mean(token_log_ratio_bt, mask_bt)), 0)
    count_b = jnp.maximum(jnp.sum(mask_bt, axis=-1), 1)
    sequence_advantage_b = jnp.sum(advantages_bt, axis=-1) / count_b
    loss_bt = jnp.where(mask_bt, -sequence_advantage_b[:, None] * ratio_bt, 0)
    return loss_bt, PolicyLossInfo(ratio_bt, mask_bt & (clipped_high_bt | clipped_low_bt))


def vespo_loss(
    logp_bt: jax.Array,
    old_logp_bt: jax.Array,
    advantages_bt: jax.Array,
    mask_bt: jax.Array,
    *,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    log_ratio_clamp: float = 20.0,
) -> tuple[jax.Array, SequenceWeightInfo]:
    """VESPO (arXiv 2602.10693, "Variational Sequence-Level Soft Policy Optimization"; TRL's loss_type "vespo",
    GRPOTrainer.get_gamma_weights): loss = -sg(phi) A logp, phi = e^lambda w^k e^(-lambda w) (so phi(1) = 1), a
    smooth weight of the sequence ratio w_b = exp(clip(sum_t log r_t, log 1e-8, 20)) (a sum, not a mean) that
    replaces hard clipping. (k, lambda) = (k_pos, lambda_pos) where A >= 0, (k_neg, lambda_neg) where A < 0 (as
    TRL; its defaults). phi is computed in log space and detached, a non-finite phi is 0 (TRL's nan_to_num).
    Like CISPO's, the loss value is a surrogate; only its gradient -phi A is meaningful. TRL aggregates it as
    token-mean. TRL folds its rollout importance ratio into w; here a rollout correction multiplies the loss
    afterwards, as for every loss. k >= 0 and lambda > 0 are static numbers. Returns (loss_bt, SequenceWeightInfo).
    """
    if not (k_pos >= 0 and k_neg >= 0 and lambda_pos > 0 and lambda_neg > 0):
        raise ValueError(f"VESPO needs k >= 0 and lambda > 0, got k=({k_pos}, {k_neg}), "
                         f"lambda=({lambda_pos}, {lambda_neg})")
    mask_bt = mask_bt.astype(bool)
    log_ratio_bt = clamped_log_ratio(logp_bt, old_logp_bt, mask_bt, clamp=log_ratio_clamp)
    _check_tokens(log_ratio_bt, advantages_bt)
    log_w_b = jax.lax.stop_gradient(jnp.clip(jnp.sum(log_ratio_bt, axis=-1), jnp.log(1e-8), 20.0))[:, None]
    advantages_bt = _masked(mask_bt, advantages_bt)
    non_negative_bt = advantages_bt >= 0
    k_bt = jnp.where(non_negative_bt, k_pos, k_neg)
    lambda_bt = jnp.where(non_negative_bt, lambda_pos, lambda_neg)
    phi_bt = jnp.exp(lambda_bt + k_bt * log_w_b - lambda_bt * jnp.exp(log_w_b))
    phi_bt = jnp.where(mask_bt & jnp.isfinite(phi_bt), phi_bt, 0)
    loss_bt = jnp.where(mask_bt, -phi_bt * advantages_bt * _masked(mask_bt, logp_bt), 0)
    return loss_bt, SequenceWeightInfo(jnp.where(mask_bt, jnp.exp(log_w_b), 0), phi_bt)


def high_entropy_mask(entropy_bt: jax.Array, mask_bt: jax.Array, *, top_fraction: float) -> jax.Array:
    """Token selection of "Beyond the 80/20 Rule" (Wang et al. 2025, arXiv 2506.01939; TRL's
    top_entropy_quantile rho): bool [B, T], True on the valid tokens whose entropy is among the top fraction of
    the batch's valid tokens; multiply the policy loss by it to train on the high-entropy "forking" tokens only.

    Rule, with n valid tokens: k = 1 + floor(top_fraction * (n - 1)); keep every valid token whose entropy is
    >= the k-th largest valid entropy. Ties at that threshold are all kept (so possibly more than k tokens),
    which makes the selection independent of token order. This is TRL's rule exactly: it keeps entropies >=
    torch.quantile(valid entropies, 1 - rho), and that linearly interpolated quantile lies in (s_(j-1), s_j],
    s_j the ceil((1 - rho)(n - 1))-th order statistic, i.e. the k-th largest. top_fraction 1 keeps every valid
    token, 0 the maximal ones only; the paper uses 0.2. The fraction is of the [B, T] given: in the
    accumulated train step one micro-batch (all its data shards), as TRL's per-micro-batch gather. No gradient
    flows through the selection. An all-masked batch selects nothing. top_fraction is a static number in [0, 1].
    """
    if not 0 <= top_fraction <= 1:
        raise ValueError(f"top_fraction must be in [0, 1], got {top_fraction}")
    _check_tokens(entropy_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    entropy_bt = jax.lax.stop_gradient(_masked(mask_bt, entropy_bt))
    count = jnp.sum(mask_bt)
    k = 1 + _floor_fraction(top_fraction, jnp.maximum(count - 1, 0))
    descending = -jnp.sort(jnp.where(mask_bt, -entropy_bt, jnp.inf).ravel())
    threshold = descending[jnp.clip(k - 1, 0, entropy_bt.size - 1)]
    return mask_bt & (entropy_bt >= threshold) & (count > 0)


def policy_gradient_loss(logp_bt: jax.Array, advantages_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """The plain policy-gradient surrogate -A logp (REINFORCE, Williams 1992): GPG's policy loss (Chu et al. 2025,
    "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"; verl's "gpg"). No ratio and no
    clip: its gradient -A grad(logp) is PPO's at r = 1, and stays the on-policy gradient on later updates of the
    same batch, with no importance correction. The value is a surrogate; only its gradient is meaningful.
    Returns loss_bt, 0 on masked tokens.
    """
    _check_tokens(logp_bt, advantages_bt, mask_bt)
    mask_bt = mask_bt.astype(bool)
    return jnp.where(mask_bt, -_masked(mask_bt, advantages_bt) * _masked(mask_bt, logp_bt), 0)
