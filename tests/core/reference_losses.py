"""Slow NumPy references for rubric_jax.core.losses, kl and aggregation, the random batches they are fed,
and the tolerances the comparisons use.

Each reference is a plain Python loop over rows b and tokens t that transcribes the equation in float64,
token by token, skipping masked tokens (their outputs stay 0). Losses also return the analytic per-token
derivative d loss[b, t] / d logp[b, t], written out by hand from the equation (0 where a clip or clamp is
the active branch), to check the JAX gradients against something that does not use autodiff.
"""

import math
from typing import NamedTuple

import numpy as np


class PolicyBatch(NamedTuple):
    logp: np.ndarray  # [B, T] float32, log-probabilities of the trained policy
    old_logp: np.ndarray  # [B, T] float32
    rollout_logp: np.ndarray  # [B, T] float32, a few non-finite values on valid tokens
    ref_logp: np.ndarray  # [B, T] float32
    advantages: np.ndarray  # [B, T] float32
    entropy: np.ndarray  # [B, T] float32
    mask: np.ndarray  # [B, T] bool
    off_policy: np.ndarray  # [B] bool


class RefLoss(NamedTuple):
    loss: np.ndarray
    ratio: np.ndarray
    clipped: np.ndarray
    grad: np.ndarray  # d loss[b, t] / d logp[b, t]


# ---------------------------------------------------------------- random batches and tolerances

SEEDS = range(25)
# float32 inputs: the reference runs in float64 on the same values; float32 differences of log-probabilities
# up to ~30 in size round at ~2e-6, which exp turns into a relative error of the same size.
F32 = dict(rtol=2e-5, atol=1e-6)
# bfloat16 inputs are promoted before any arithmetic and the reference gets the same rounded values, so values
# keep float32's tolerance (arithmetic in bfloat16 would miss it by ~1e-2). Gradients come back in the
# input's dtype: the cotangent is rounded to bfloat16 (8 significant bits, relative error <= 2^-9 ~ 2e-3).
BF16_GRAD = dict(rtol=8e-3, atol=1e-6)


def random_policy_batch(rng: np.random.RandomState, num_rows: int = 6, num_tokens: int = 7) -> PolicyBatch:
    """A fixed-shape batch with ragged, empty, full and holed masks; per-row regimes of the log-ratio (near
    on-policy, wide enough to hit every clip, beyond the dual clip, beyond the +-10 and +-20 clamps); KL deltas
    beyond the output and input clamps; zero, per-sequence and per-token advantages; non-finite rollout
    log-probabilities on some valid tokens; and NaN / inf / huge garbage on masked tokens."""
    shape = (num_rows, num_tokens)
    lengths = rng.randint(0, num_tokens + 1, num_rows)
    lengths[rng.randint(num_rows)] = num_tokens
    mask = np.arange(num_tokens)[None, :] < lengths[:, None]
    holes = (rng.rand(*shape) < 0.15) & (rng.rand(num_rows, 1) < 0.3)
    mask &= ~holes

    logp = -rng.exponential(1.5, shape)
    log_ratio = np.empty(shape)
    for b in range(num_rows):
        regime = rng.randint(4)
        if regime == 0:
            log_ratio[b] = rng.normal(0, 0.3, num_tokens)
        elif regime == 1:
            log_ratio[b] = rng.normal(0, 1.5, num_tokens)
        elif regime == 2:
            log_ratio[b] = rng.choice([-1, 1]) * rng.uniform(12, 30) + rng.normal(0, 0.5, num_tokens)
        else:
            log_ratio[b] = 0.0
    old_logp = logp - log_ratio
    rollout_logp = old_logp - rng.normal(0, 0.5, shape) * (rng.rand(num_rows, 1) < 0.8)
    rollout_logp = np.where(rng.rand(*shape) < 0.05, rng.choice([-np.inf, np.nan], shape), rollout_logp)
    delta = rng.normal(0, 2.0, shape)
    delta = np.where(rng.rand(*shape) < 0.06, rng.choice([-25.0, 25.0], shape), delta)
    ref_logp = logp + delta

    advantages = np.empty(shape)
    for b in range(num_rows):
        kind = rng.randint(3)
        advantages[b] = 0.0 if kind == 0 else rng.normal() if kind == 1 else rng.normal(size=num_tokens)

    arrays = [logp, old_logp, rollout_logp, ref_logp, advantages, rng.uniform(0, 3, shape)]
    garbage = np.array([np.nan, -np.inf, np.inf, 1e30, -1e4])
    arrays = [
        np.where(~mask & (rng.rand(*shape) < 0.5), rng.choice(garbage, shape), x).astype(np.float32) for x in arrays
    ]
    return PolicyBatch(*arrays, mask=mask, off_policy=rng.rand(num_rows) < 0.35)


def draw(seed: int, dtype) -> tuple[PolicyBatch, PolicyBatch]:
    """`random_policy_batch(RandomState(seed))` with its float arrays cast to `dtype` (float32 or bfloat16),
    and the same batch as float64 arrays of the rounded values, for the references."""
    batch = random_policy_batch(np.random.RandomState(seed))
    floats = [x.astype(dtype) for x in batch[:6]]
    return (
        PolicyBatch(*floats, mask=batch.mask, off_policy=batch.off_policy),
        PolicyBatch(*[x.astype(np.float64) for x in floats], mask=batch.mask, off_policy=batch.off_policy),
    )


# ---------------------------------------------------------------- policy losses


def _clip(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def _log_ratio(numerator: float, denominator: float, clamp: float) -> tuple[float, bool]:
    """Clamped log ratio and whether the clamp lets the gradient through."""
    difference = float(numerator) - float(denominator)
    return _clip(difference, -clamp, clamp), abs(difference) < clamp


def _empty(shape) -> RefLoss:
    return RefLoss(np.zeros(shape), np.zeros(shape), np.zeros(shape, bool), np.zeros(shape))


def _surrogate_token(out: RefLoss, b: int, t: int, ratio: float, advantage: float, eps_low, eps_high, live: bool):
    """-min(r A, clip(r) A), shared by PPO and GSPO; `live`: the ratio's own gradient d r / d logp = r passes."""
    unclipped = -advantage * ratio
    clipped = -advantage * _clip(ratio, 1 - eps_low, 1 + eps_high)
    out.ratio[b, t] = ratio
    if clipped > unclipped:
        out.loss[b, t], out.clipped[b, t] = clipped, True
    else:
        out.loss[b, t] = unclipped
        out.grad[b, t] = -advantage * ratio if live else 0.0


def ppo_clip(logp, old_logp, advantages, mask, eps_low, eps_high, clamp=20.0) -> RefLoss:
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                log_ratio, live = _log_ratio(logp[b, t], old_logp[b, t], clamp)
                _surrogate_token(out, b, t, math.exp(log_ratio), float(advantages[b, t]), eps_low, eps_high, live)
    return out


def dual_clip(logp, old_logp, advantages, mask, eps_low, eps_high, clip_ratio_c) -> tuple[RefLoss, np.ndarray]:
    out = ppo_clip(logp, old_logp, advantages, mask, eps_low, eps_high)
    dual = np.zeros(logp.shape, bool)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            advantage = float(advantages[b, t])
            if mask[b, t] and advantage < 0 and out.loss[b, t] > -advantage * clip_ratio_c:
                out.loss[b, t], out.grad[b, t], dual[b, t] = -advantage * clip_ratio_c, 0.0, True
    return out, dual


def gspo(logp, old_logp, advantages, mask, eps_low, eps_high, clamp=20.0, seq_clamp=10.0) -> RefLoss:
    """s_b = exp(clip(mean_t log r, +-seq_clamp)); per token -min(s A, clip(s) A). GSPO-token's per-token
    derivative: d s_{b,t} / d logp[b, t] = s_b (when neither clamp is active), other tokens' s do not move."""
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        tokens = [t for t in range(logp.shape[1]) if mask[b, t]]
        if not tokens:
            continue
        log_ratios = {t: _log_ratio(logp[b, t], old_logp[b, t], clamp) for t in tokens}
        mean = sum(value for value, _ in log_ratios.values()) / len(tokens)
        ratio = math.exp(_clip(mean, -seq_clamp, seq_clamp))
        for t in tokens:
            live = log_ratios[t][1] and abs(mean) < seq_clamp
            _surrogate_token(out, b, t, ratio, float(advantages[b, t]), eps_low, eps_high, live)
    return out


def cispo(logp, old_logp, advantages, mask, eps_low, eps_high, clamp=20.0) -> RefLoss:
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                ratio = math.exp(_log_ratio(logp[b, t], old_logp[b, t], clamp)[0])
                weight = _clip(ratio, 1 - eps_low, 1 + eps_high)
                advantage = float(advantages[b, t])
                out.loss[b, t] = -weight * advantage * float(logp[b, t])
                out.ratio[b, t], out.clipped[b, t], out.grad[b, t] = ratio, weight != ratio, -weight * advantage
    return out


def no_clip(logp, old_logp, advantages, mask, clamp=20.0) -> RefLoss:
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                log_ratio, live = _log_ratio(logp[b, t], old_logp[b, t], clamp)
                ratio, advantage = math.exp(log_ratio), float(advantages[b, t])
                out.loss[b, t], out.ratio[b, t] = -advantage * ratio, ratio
                out.grad[b, t] = -advantage * ratio if live else 0.0
    return out


def shaped_off_policy(logp, advantages, mask, gamma) -> RefLoss:
    """-f(p) A with f(p) = p / (p + gamma); d/dlogp = -A * p * gamma / (p + gamma)^2. `ratio` holds f(p)."""
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                p, advantage = math.exp(float(logp[b, t])), float(advantages[b, t])
                shaped = p / (p + gamma)
                out.loss[b, t], out.ratio[b, t] = -shaped * advantage, shaped
                out.grad[b, t] = -advantage * p * gamma / (p + gamma) ** 2
    return out


def mixed_policy(logp, old_logp, advantages, mask, off_policy, gamma) -> tuple[RefLoss, np.ndarray]:
    """RGR-GRPO eq 10 per token: rows off_policy[b] use the shaped term, the others the unclipped ratio.
    Returns (loss with on-policy ratios, shaped probabilities of the off-policy tokens)."""
    on_mask = mask & ~off_policy[:, None]
    on = no_clip(logp, old_logp, advantages, on_mask)
    off = shaped_off_policy(logp, advantages, mask & off_policy[:, None], gamma)
    return RefLoss(on.loss + off.loss, on.ratio, on.clipped, on.grad + off.grad), off.ratio


def mismatch_weights(old_logp, rollout_logp, mask, mode: str, low: float, high: float) -> np.ndarray:
    """mode tis: min(w, high); icepop: w if low <= w <= high else 0; seq_mask_tis: w on rows whose geometric
    mean over finite valid tokens lies in [low, high], else 0. Non-finite log w and masked tokens: 0."""
    weights = np.zeros(old_logp.shape)
    for b in range(old_logp.shape[0]):
        log_weights = {}
        for t in range(old_logp.shape[1]):
            difference = float(old_logp[b, t]) - float(rollout_logp[b, t])
            if mask[b, t] and math.isfinite(difference):
                log_weights[t] = _clip(difference, -20.0, 20.0)
        keep_row = True
        if mode == "seq_mask_tis":
            geo_mean = math.exp(sum(log_weights.values()) / len(log_weights)) if log_weights else 0.0
            keep_row = bool(log_weights) and low <= geo_mean <= high
        for t, log_weight in log_weights.items():
            w = math.exp(log_weight)
            if mode == "tis":
                weights[b, t] = min(w, high)
            elif mode == "icepop":
                weights[b, t] = w if low <= w <= high else 0.0
            else:
                weights[b, t] = w if keep_row else 0.0
    return weights


def entropy_bonus(loss, entropy, mask, coeff) -> np.ndarray:
    out = np.zeros(loss.shape)
    for b in range(loss.shape[0]):
        for t in range(loss.shape[1]):
            if mask[b, t]:
                out[b, t] = float(loss[b, t]) - coeff * float(entropy[b, t])
    return out


# ---------------------------------------------------------------- KL estimators


def kl(logp, ref_logp, mask, estimator: str, input_clamp=20.0, output_clamp=10.0) -> tuple[np.ndarray, np.ndarray]:
    """delta = clip(ref - logp, +-input_clamp); k1 = -delta, k2 = delta^2 / 2, k3 = e^delta - delta - 1, value
    clipped to +-output_clamp. Returns (value, d value / d logp). d delta / d logp = -1, so
    d k1 = 1, d k2 = -delta, d k3 = 1 - e^delta, each 0 where a clamp is active. The "_k2_grad" estimators take
    the value of k1 / k3 and the derivative of k2 with only the input clamp."""
    value, grad = np.zeros(logp.shape), np.zeros(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if not mask[b, t]:
                continue
            delta, live = _log_ratio(ref_logp[b, t], logp[b, t], input_clamp)
            base = estimator.removesuffix("_k2_grad")
            raw, raw_grad = {
                "k1": (-delta, 1.0),
                "k2": (0.5 * delta**2, -delta),
                "k3": (math.exp(delta) - delta - 1, 1 - math.exp(delta)),
            }[base]
            value[b, t] = _clip(raw, -output_clamp, output_clamp)
            if estimator.endswith("_k2_grad"):
                grad[b, t] = -delta if live else 0.0
            else:
                grad[b, t] = raw_grad if live and abs(raw) < output_clamp else 0.0
    return value, grad


# ---------------------------------------------------------------- aggregation


def aggregate(loss, mask, mode: str, norm_constant: float = 1.0) -> tuple[float, float]:
    """(loss_sum, denominator) of verl's modes, valid sequences = rows with at least one valid token;
    "token-sum-norm" is verl's own seq-mean-token-sum-norm (sum / constant), its constant carried by every row."""
    loss_sum, tokens, sequences = 0.0, 0, 0
    for b in range(loss.shape[0]):
        row = [float(loss[b, t]) for t in range(loss.shape[1]) if mask[b, t]]
        if not row:
            continue
        sequences += 1
        tokens += len(row)
        loss_sum += sum(row) / len(row) if mode == "seq-mean-token-mean" else sum(row)
    denominator = {
        "token-mean": tokens,
        "seq-mean-token-mean": sequences,
        "seq-mean-token-sum": sequences,
        "seq-mean-token-sum-norm": sequences * norm_constant,
        "token-sum-norm": loss.shape[0] * norm_constant,
    }[mode]
    return loss_sum, float(denominator)


# ---------------------------------------------------------------- LUFFY's off-policy clips


def clip_off_policy_weight(weight, mask, max_clip, min_clip) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """LUFFY (mix_core_alg.py): off_ratio = clamp(off_ratio, max=max_clip), then clamp(off_ratio, min=min_clip);
    clip fractions count off_ratio == bound after the clamps. Returns (weight, clipped_high, clipped_low,
    d weight / d input: 1 where min_clip <= w <= max_clip, as torch.clamp's backward, else 0)."""
    out, high, low, passes = (np.zeros(weight.shape), np.zeros(weight.shape, bool), np.zeros(weight.shape, bool),
                              np.zeros(weight.shape))
    for b in range(weight.shape[0]):
        for t in range(weight.shape[1]):
            if mask[b, t]:
                w = float(weight[b, t])
                passes[b, t] = float((max_clip is None or w <= max_clip) and (min_clip is None or w >= min_clip))
                if max_clip is not None:
                    w = min(w, max_clip)
                    high[b, t] = w == max_clip
                if min_clip is not None:
                    w = max(w, min_clip)
                    low[b, t] = w == min_clip
                out[b, t] = w
    return out, high, low, passes


def mixed_policy_off_clips(logp, old_logp, advantages, mask, off_policy, gamma, max_clip, min_clip):
    """`mixed_policy` with LUFFY's clips on the off-policy tokens' f(p): loss -clip(f(p)) A, derivative
    -A f'(p) where the clamp passes the gradient, 0 where a bound is active. Returns (RefLoss with on-policy
    ratios, clipped f(p) of the off-policy tokens, clipped_high, clipped_low)."""
    off_mask = mask & off_policy[:, None]
    on = no_clip(logp, old_logp, advantages, mask & ~off_policy[:, None])
    shaped = shaped_off_policy(logp, np.ones(logp.shape), off_mask, gamma)  # ratio: f(p); grad: -f'(p)
    weight, high, low, passes = clip_off_policy_weight(shaped.ratio, off_mask, max_clip, min_clip)
    off_loss, off_grad = np.zeros(logp.shape), np.zeros(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if off_mask[b, t]:
                off_loss[b, t] = -weight[b, t] * float(advantages[b, t])
                off_grad[b, t] = float(advantages[b, t]) * shaped.grad[b, t] * passes[b, t]
    return RefLoss(on.loss + off_loss, on.ratio, on.clipped, on.grad + off_grad), weight, high, low


# ---------------------------------------------------------------- SAPO, Clip-Cov, KL-Cov, GMPO, VESPO, entropy mask


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def sapo(logp, old_logp, advantages, mask, tau_pos, tau_neg, clamp=20.0) -> tuple[RefLoss, np.ndarray]:
    """f(r) = 4 / tau * sigmoid(tau (r - 1)), tau = tau_pos if A > 0 else tau_neg; loss -f(r) A;
    d loss / d logp = -A f'(r) r = -A * 4 r s (1 - s), s = sigmoid(tau (r - 1)). Returns (loss, gates)."""
    out, gates = _empty(logp.shape), np.zeros(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                log_ratio, live = _log_ratio(logp[b, t], old_logp[b, t], clamp)
                ratio, advantage = math.exp(log_ratio), float(advantages[b, t])
                tau = tau_pos if advantage > 0 else tau_neg
                s = _sigmoid(tau * (ratio - 1))
                gates[b, t] = 4 / tau * s
                out.loss[b, t], out.ratio[b, t] = -gates[b, t] * advantage, ratio
                out.grad[b, t] = -advantage * 4 * ratio * s * (1 - s) if live else 0.0
    return out, gates


def token_covariance(logp, advantages, mask) -> np.ndarray:
    """(A - mean A)(logp - mean logp), both means over every valid token of the batch."""
    cells = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    out = np.zeros(mask.shape)
    if not cells:
        return out
    mean_logp = sum(float(logp[c]) for c in cells) / len(cells)
    mean_advantage = sum(float(advantages[c]) for c in cells) / len(cells)
    for c in cells:
        out[c] = (float(advantages[c]) - mean_advantage) * (float(logp[c]) - mean_logp)
    return out


def top_k(scores, candidates, k: int) -> np.ndarray:
    """The k candidates of highest score, equal scores by row-major position (lower first)."""
    cells = [(b, t) for b in range(scores.shape[0]) for t in range(scores.shape[1]) if candidates[b, t]]
    cells.sort(key=lambda c: (-float(scores[c]), c))
    chosen = np.zeros(scores.shape, bool)
    for c in cells[:max(k, 0)]:
        chosen[c] = True
    return chosen


def clip_cov(logp, old_logp, advantages, mask, priority, eps_low, eps_high, ratio, lb, ub) -> tuple[RefLoss, ...]:
    """verl's compute_policy_loss_clip_cov with its random choice replaced by the given priorities: PPO clip;
    candidates = valid, not PPO-clipped, lb < cov < ub; the max(int(ratio * n), 1) of highest priority get loss
    0 and gradient 0. Returns (loss with clipped = PPO-clipped or detached, detached)."""
    out = ppo_clip(logp, old_logp, advantages, mask, eps_low, eps_high)
    cov = token_covariance(logp, advantages, mask)
    candidates = mask & ~out.clipped & (cov > lb) & (cov < ub)
    detached = top_k(priority, candidates, max(int(ratio * int(mask.sum())), 1))
    for b, t in zip(*np.nonzero(detached)):
        out.loss[b, t], out.grad[b, t], out.clipped[b, t] = 0.0, 0.0, True
    return out, detached


def kl_cov(logp, old_logp, advantages, mask, ratio, coef, clamp=20.0) -> tuple[RefLoss, np.ndarray]:
    """verl's compute_policy_loss_kl_cov: -r A on every valid token, + coef |log r| on the top max(int(ratio n), 1)
    tokens by covariance; d/dlogp = -A r + coef sign(log r) (0 where the clamp is active)."""
    out = no_clip(logp, old_logp, advantages, mask, clamp)
    n = int(mask.sum())
    penalised = top_k(token_covariance(logp, advantages, mask), mask, max(int(ratio * n), 1) if n else 0)
    for b, t in zip(*np.nonzero(penalised)):
        log_ratio, live = _log_ratio(logp[b, t], old_logp[b, t], clamp)
        out.loss[b, t] += coef * abs(log_ratio)
        out.grad[b, t] += coef * float(np.sign(log_ratio)) if live else 0.0
    return out, penalised


def gmpo(logp, old_logp, advantages, mask, eps_low, eps_high, clamp=20.0) -> RefLoss:
    """verl's compute_policy_loss_geo_mean per row: l_t = sgn(A_t) min(sgn(A_t) log r, sgn(A_t) clip(log r,
    -eps_low, eps_high)); s = exp(mean_t l_t); loss_b = -mean_t(A_t) s on each valid token. Per-token derivative
    of the token form: -mean(A) s where l_t is the unclipped log r (and A_t != 0, no clamp), else 0."""
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        tokens = [t for t in range(logp.shape[1]) if mask[b, t]]
        if not tokens:
            continue
        terms, live = {}, {}
        for t in tokens:
            log_ratio, unclamped = _log_ratio(logp[b, t], old_logp[b, t], clamp)
            sign = float(np.sign(advantages[b, t]))
            terms[t] = sign * min(sign * log_ratio, sign * _clip(log_ratio, -eps_low, eps_high))
            clipped = (sign > 0 and log_ratio > eps_high) or (sign < 0 and log_ratio < -eps_low)
            out.clipped[b, t] = clipped
            live[t] = unclamped and sign != 0 and not clipped
        ratio = math.exp(sum(terms.values()) / len(tokens))
        advantage = sum(float(advantages[b, t]) for t in tokens) / len(tokens)
        for t in tokens:
            out.loss[b, t], out.ratio[b, t] = -advantage * ratio, ratio
            out.grad[b, t] = -advantage * ratio if live[t] else 0.0
    return out


def vespo(logp, old_logp, advantages, mask, k_pos, lambda_pos, k_neg, lambda_neg, clamp=20.0):
    """TRL's get_gamma_weights and vespo loss: log w = clip(sum_t clip(log r, +-20), log 1e-8, 20);
    phi = exp(lambda + k log w - lambda w) by the sign of A (>= 0: pos); loss -phi A logp, d/dlogp = -phi A.
    Returns (loss with ratio = w, phi)."""
    out, phi = _empty(logp.shape), np.zeros(logp.shape)
    for b in range(logp.shape[0]):
        tokens = [t for t in range(logp.shape[1]) if mask[b, t]]
        log_w = _clip(sum(_log_ratio(logp[b, t], old_logp[b, t], clamp)[0] for t in tokens), math.log(1e-8), 20.0)
        for t in tokens:
            advantage = float(advantages[b, t])
            k, lam = (k_pos, lambda_pos) if advantage >= 0 else (k_neg, lambda_neg)
            phi[b, t] = math.exp(lam + k * log_w - lam * math.exp(log_w))
            out.loss[b, t] = -phi[b, t] * advantage * float(logp[b, t])
            out.ratio[b, t], out.grad[b, t] = math.exp(log_w), -phi[b, t] * advantage
    return out, phi


def high_entropy_mask(entropy, mask, top_fraction) -> np.ndarray:
    """TRL's get_high_entropy_mask: keep valid tokens whose entropy >= torch.quantile(valid entropies,
    1 - top_fraction) (linear interpolation, as numpy's default)."""
    valid = [float(entropy[b, t]) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    out = np.zeros(mask.shape, bool)
    if not valid:
        return out
    threshold = float(np.quantile(np.asarray(valid), 1 - top_fraction))
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            out[b, t] = bool(mask[b, t]) and float(entropy[b, t]) >= threshold
    return out


def kl_abs(logp, ref_logp, mask, input_clamp=20.0, output_clamp=10.0) -> tuple[np.ndarray, np.ndarray]:
    """verl's "abs": |delta|, delta = clip(ref - logp, +-input_clamp), value clipped to output_clamp. Returns
    (value, d value / d logp = -sign(delta), torch's 0 at delta = 0, and 0 where a clamp is active)."""
    value, grad = np.zeros(logp.shape), np.zeros(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                delta, live = _log_ratio(ref_logp[b, t], logp[b, t], input_clamp)
                value[b, t] = min(abs(delta), output_clamp)
                grad[b, t] = -float(np.sign(delta)) if live and abs(delta) < output_clamp else 0.0
    return value, grad


def policy_gradient(logp, advantages, mask) -> RefLoss:
    """GPG / REINFORCE: loss -A logp, d/dlogp = -A; no ratio (0) and no clip."""
    out = _empty(logp.shape)
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t]:
                out.loss[b, t] = -float(advantages[b, t]) * float(logp[b, t])
                out.grad[b, t] = -float(advantages[b, t])
    return out
