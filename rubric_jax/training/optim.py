"""The learner's optimizer: AdamW with decoupled weight decay, linear warmup, a constant or cosine schedule with a
floor, and global-norm gradient clipping, built with optax from a frozen `OptimizerConfig`.

Conventions:
- Steps count optimizer updates from 0. Warmup is linear and reaches the peak at the last warmup step:
  lr(s) = peak * (s + 1) / warmup_steps for s < warmup_steps, so the first update already moves (frameworks
  whose warmup starts at lr 0 spend their first update doing nothing).
- After warmup, "constant" stays at the peak; "cosine" decays from the peak to the floor min_lr_ratio * peak over
  the remaining total_steps - warmup_steps updates, lr = floor + (peak - floor) * (1 + cos(pi * p)) / 2 with
  p = (s - warmup_steps) / (total_steps - warmup_steps), and stays at the floor after total_steps.
- Clipping scales the whole gradient by min(1, max_grad_norm / ||g||_2) before AdamW sees it (None: no clipping).
- Weight decay (decoupled, AdamW's lr * weight_decay * param) applies to parameters of rank >= 2 only: matrices
  and embeddings, not RMSNorm scales or biases (the convention of Hugging Face's Trainer and most LLM recipes).
"""

import dataclasses
import math
from typing import Optional

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW and its schedule (module docstring). Validated on construction: ValueError naming the field."""

    learning_rate: float = 1e-6
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: str = "constant"
    total_steps: Optional[int] = None
    min_lr_ratio: float = 0.0
    max_grad_norm: Optional[float] = 1.0

    def __post_init__(self):
        def check(ok: bool, field: str, rule: str):
            if not ok:
                raise ValueError(f"optimizer.{field} must be {rule}, got {getattr(self, field)!r}")

        def is_number(value) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

        def is_count(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 0

        check(is_number(self.learning_rate) and self.learning_rate > 0, "learning_rate", "a finite number > 0")
        check(is_number(self.weight_decay) and self.weight_decay >= 0, "weight_decay", "a finite number >= 0")
        for field in ("b1", "b2"):
            check(is_number(getattr(self, field)) and 0 <= getattr(self, field) < 1, field, "in [0, 1)")
        check(is_number(self.eps) and self.eps > 0, "eps", "a finite number > 0")
        check(is_count(self.warmup_steps), "warmup_steps", "an int >= 0")
        check(self.schedule in SCHEDULES, "schedule", f"one of {SCHEDULES}")
        check(self.total_steps is None or is_count(self.total_steps), "total_steps", "None or an int >= 0")
        if self.schedule == "cosine":
            check(self.total_steps is not None and self.total_steps > self.warmup_steps, "total_steps",
                  f"an int > warmup_steps ({self.warmup_steps}) for the cosine schedule")
        check(is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "in [0, 1]")
        check(self.max_grad_norm is None or (is_number(self.max_grad_norm) and self.max_grad_norm > 0),
              "max_grad_norm", "None or a finite number > 0")


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
    """lr(step) of the module docstring, a jit-able function of the update count."""
    peak, warmup = config.learning_rate, config.warmup_steps
    floor = config.min_lr_ratio * peak

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warmup_lr = peak * jnp.minimum(1.0, (step + 1.0) / max(warmup, 1))
        if config.schedule == "constant":
            return warmup_lr
        progress = jnp.clip((step - warmup) / (config.total_steps - warmup), 0.0, 1.0)
        cosine_lr = floor + (peak - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(step < warmup, warmup_lr, cosine_lr)

    return schedule


def schedule_mismatch(config: OptimizerConfig, updates: int, section: str = "optimizer") -> Optional[str]:
    """The warning for a cosine schedule whose `total_steps` is not the run's number of `updates` (a `steps`
    override that left the schedule at the config's length: the decay then stops early or never finishes), else
    None."""
    if config.schedule != "cosine" or config.total_steps == updates:
        return None
    reached = min(1.0, max(0.0, (updates - config.warmup_steps) / (config.total_steps - config.warmup_steps)))
    return (f"{section}.total_steps is {config.total_steps} but the run makes {updates} optimizer updates: its cosine "
            f"schedule ends {reached:.0%} of the way through its decay (learning rate "
            f"{float(learning_rate_schedule(config)(updates - 1)):.3g} at the last update); set "
            f"{section}.total_steps={updates} to fit the schedule to the run")


def weight_decay_mask(params):
    """True for the parameters AdamW decays: rank >= 2 (module docstring)."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
    """Global-norm clipping (if configured), then AdamW on `learning_rate_schedule(config)`."""
    adamw = optax.adamw(
        learning_rate_schedule(config),
        b1=config.b1,
        b2=config.b2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        mask=weight_decay_mask,
    )
    if config.max_grad_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), adamw)
