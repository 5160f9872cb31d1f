"""`ModelConfig`: the architecture of a Qwen3, Qwen2 (Qwen2.5) or Llama 3 decoder, read from and written to a Hugging
Face `config.json`.

Conventions:
- Field names are this package's (num_layers, num_heads, num_kv_heads); `from_hf_dict` / `to_hf_dict` translate
  the Hugging Face names (num_hidden_layers, num_attention_heads, num_key_value_heads).
- Both config layouts are read: transformers 4 (`rope_theta` and `rope_scaling` at the top level) and
  transformers 5 (`rope_parameters`, holding `rope_theta` and the scaling keys). Where both are present the
  precedence is transformers 5's own: `rope_scaling` over `rope_parameters`, a theta inside the dict over the
  top-level one.
- Supported RoPE types: "default" (`rope_scaling` None) and "llama3" (`Llama3RopeScaling`). Anything the decoder
  does not implement (another model type or RoPE type, sliding-window attention, MLP bias, an activation other
  than SiLU, partial rotary embeddings) is a ValueError naming it, never silently ignored.
- The dense families differ in their attention only (transformers' `Qwen3Attention`, `Qwen2Attention`,
  `LlamaAttention`): qwen3 normalises each query and key head (`qk_norm`); qwen2 always has q/k/v biases and no
  o_proj bias (`qkv_bias`, `o_proj_bias`; `attention_bias`, a key transformers' Qwen2 ignores, must be unset);
  qwen3 and llama have biases on all four projections exactly when `attention_bias` is set. Sliding-window
  attention, which Qwen2 and Qwen3 configs can switch on (`use_sliding_window`; the Qwen2.5 and Qwen3 checkpoints
  the papers train ship it off), is refused.
- qwen3_moe (Qwen3-MoE, `Qwen3MoeForCausalLM`) is qwen3's attention with a mixture-of-experts MLP in every layer
  that `sparse_layer` names (transformers' rule: not in `mlp_only_layers`, and (i + 1) a multiple of
  `decoder_sparse_step`); the other layers keep the dense MLP of `intermediate_size` (`models.moe`).
  `router_aux_loss_coef` and `output_router_logits` are training settings, not architecture: they are ignored here.
- Keys a config.json may leave out take the transformers config class's default: rope_theta 10000 and
  rms_norm_eps 1e-6 for every family, max_position_embeddings 32768 (qwen2, qwen3) or 2048 (llama).
"""

import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Union

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "llama": "LlamaForCausalLM"}

# The Hugging Face config classes' defaults for keys a config.json may leave out.
_HF_DEFAULT_MAX_POSITIONS = {"qwen3": 32768, "qwen3_moe": 32768, "qwen2": 32768, "llama": 2048}
# Qwen3MoeConfig's defaults for its mixture-of-experts keys.
_HF_DEFAULT_MOE = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                   "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": ()}
_HF_DEFAULT_RMS_NORM_EPS = 1e-6
_HF_DEFAULT_ROPE_THETA = 10000.0


@dataclasses.dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1 RoPE frequency scaling (transformers' `_compute_llama3_parameters`).

    Wavelengths shorter than original_max_position_embeddings / high_freq_factor keep their frequency, longer
    than original_max_position_embeddings / low_freq_factor are slowed by `factor`, and those in between are
    interpolated smoothly.
    """

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        if self.factor <= 0:
            raise ValueError(f"llama3 rope_scaling factor must be positive, got {self.factor}")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            raise ValueError(
                "llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor, got "
                f"low_freq_factor={self.low_freq_factor}, high_freq_factor={self.high_freq_factor}"
            )
        if self.original_max_position_embeddings <= 0:
            raise ValueError(
                "llama3 rope_scaling original_max_position_embeddings must be positive, got "
                f"{self.original_max_position_embeddings}"
            )


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only model of the "qwen3", "qwen2" (Qwen2 and Qwen2.5) or "llama" (Llama 3) family.

    `qk_norm` (RMSNorm on each query and key head before RoPE) follows from the family: True for qwen3 only.
    `qkv_bias` and `o_proj_bias` (biases of the attention's projections) follow from the family and
    `attention_bias` (the module docstring); a qwen2 config with `attention_bias` set is a ValueError, since
    transformers' Qwen2 ignores the key and a checkpoint written for it would not be one.
    `eos_token_id` is an int or a tuple of ints (Llama 3 Instruct lists several), as in the config.json.
    The mixture-of-experts fields (`num_experts` and on) are qwen3_moe's (module docstring): zero experts for the
    dense families.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = _HF_DEFAULT_RMS_NORM_EPS
    rope_theta: float = _HF_DEFAULT_ROPE_THETA
    rope_scaling: Optional[Llama3RopeScaling] = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Union[int, tuple[int, ...]]] = None
    pad_token_id: Optional[int] = None
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self):
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"unsupported model_type {self.model_type!r}; supported: {sorted(ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "max_position_embeddings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads}) "
                "for grouped-query attention"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(
                f"rms_norm_eps and rope_theta must be positive, got {self.rms_norm_eps} and {self.rope_theta}"
            )
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise ValueError(f"rope_scaling must be None or a Llama3RopeScaling, got {self.rope_scaling!r}")
        if self.model_type == "qwen2" and self.attention_bias:
            raise ValueError("model_type 'qwen2' takes no attention_bias: its q/k/v projections always have biases "
                             "and o_proj none (transformers' Qwen2Attention)")
        if isinstance(self.eos_token_id, list):
            # A frozen dataclass must stay hashable (it is static under jit): lists become tuples.
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        self._check_experts()

    def _check_experts(self) -> None:
        if self.model_type != "qwen3_moe":
            if self.num_experts:
                raise ValueError(f"model_type {self.model_type!r} has no experts, got num_experts={self.num_experts}")
            return
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"qwen3_moe needs 0 < num_experts_per_tok <= num_experts, got "
                             f"{self.num_experts_per_tok} of {self.num_experts}")
        if self.moe_intermediate_size <= 0 or self.decoder_sparse_step <= 0:
            raise ValueError(f"moe_intermediate_size and decoder_sparse_step must be positive, got "
                             f"{self.moe_intermediate_size} and {self.decoder_sparse_step}")
        if any(not 0 <= i < self.num_layers for i in self.mlp_only_layers):
            raise ValueError(f"mlp_only_layers must name layers in [0, {self.num_layers}), got {self.mlp_only_layers}")

    def sparse_layer(self, index: int) -> bool:
        """Whether layer `index` has the mixture-of-experts MLP (transformers' Qwen3MoeDecoderLayer rule)."""
        return (self.num_experts > 0 and index not in self.mlp_only_layers
                and (index + 1) % self.decoder_sparse_step == 0)

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe")

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Reads a Hugging Face config dict (transformers 4 or 5 layout); ValueError on anything unsupported."""
        model_type = d.get("model_type")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(ARCHITECTURES)}")
        architectures = d.get("architectures") or [ARCHITECTURES[model_type]]
        if list(architectures) != [ARCHITECTURES[model_type]]:
            raise ValueError(
                f"unsupported architectures {architectures!r} for model_type {model_type!r}; "
                f"supported: [{ARCHITECTURES[model_type]!r}]"
            )
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if d.get(k) is None]
        if missing:
            raise ValueError(f"config is missing required keys {missing}")
        _reject_unsupported_features(d)
        max_positions = d.get("max_position_embeddings") or _HF_DEFAULT_MAX_POSITIONS[model_type]
        rope_theta, rope_scaling = _read_rope(d, max_positions)
        num_heads = d["num_attention_heads"]
        return cls(
            model_type=model_type,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=d.get("num_key_value_heads") or num_heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
            max_position_embeddings=max_positions,
            rms_norm_eps=d.get("rms_norm_eps", _HF_DEFAULT_RMS_NORM_EPS),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=bool(d.get("attention_bias", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=d.get("eos_token_id"),
            pad_token_id=d.get("pad_token_id"),
            **(_read_experts(d) if model_type == "qwen3_moe" else {}),
        )

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike]) -> "ModelConfig":
        """Reads `config.json` from a local Hugging Face model directory."""
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json dict that transformers (4.51+ and 5) loads as this architecture.

        RoPE is written in both layouts: transformers 4 reads only `rope_theta` / `rope_scaling`, transformers 5
        prefers `rope_parameters`; both describe the same thing, so either reader gets it.
        """
        rope_scaling = None
        if self.rope_scaling is not None:
            rope_scaling = {"rope_type": "llama3", **dataclasses.asdict(self.rope_scaling)}
        return {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta, **(rope_scaling or {})},
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
            **({"num_experts": self.num_experts, "num_experts_per_tok": self.num_experts_per_tok,
                "moe_intermediate_size": self.moe_intermediate_size, "norm_topk_prob": self.norm_topk_prob,
                "decoder_sparse_step": self.decoder_sparse_step, "mlp_only_layers": list(self.mlp_only_layers)}
               if self.model_type == "qwen3_moe" else {}),
        }


def _reject_unsupported_features(d: Mapping[str, Any]) -> None:
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {d['hidden_act']!r}; only 'silu' (SwiGLU MLP) is implemented")
    if d.get("use_sliding_window") or "sliding_attention" in (d.get("layer_types") or ()):
        # Refused whenever switched on, even where transformers would slide no layer (max_window_layers >=
        # num_hidden_layers, as in QwQ-32B's config.json): the fix is one key, and the decoder never guesses which
        # layers a config meant to slide.
        raise ValueError(
            f"unsupported sliding-window attention (use_sliding_window={d.get('use_sliding_window')!r}, "
            f"sliding_window={d.get('sliding_window')!r}, max_window_layers={d.get('max_window_layers')!r}, "
            f"layer_types={d.get('layer_types')!r}): only full attention is implemented; a checkpoint that slides "
            "no layer can set use_sliding_window to false")
    if d.get("mlp_bias"):
        raise ValueError("unsupported mlp_bias=True; the MLP projections have no bias")


def _read_experts(d: Mapping[str, Any]) -> dict[str, Any]:
    """qwen3_moe's expert fields of a config dict, Qwen3MoeConfig's defaults for absent keys. The expert count is
    `num_experts` in the published checkpoints and `num_local_experts` in what transformers 5 writes."""
    read = {key: d.get(key, default) for key, default in _HF_DEFAULT_MOE.items()}
    read["num_experts"] = d.get("num_experts", d.get("num_local_experts", _HF_DEFAULT_MOE["num_experts"]))
    return {**read, "norm_topk_prob": bool(read["norm_topk_prob"]), "mlp_only_layers": tuple(read["mlp_only_layers"])}


def _read_rope(d: Mapping[str, Any], max_positions: int) -> tuple[float, Optional[Llama3RopeScaling]]:
    rope = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
    theta = float(rope.get("rope_theta", d.get("rope_theta", _HF_DEFAULT_ROPE_THETA)))
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"unsupported partial_rotary_factor {partial}; rotary embeddings cover the whole head")
    # Old configs name the type "type" (transformers reads it the same way).
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ValueError(f"unsupported RoPE type {rope_type!r}; supported: 'default', 'llama3'")
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in rope]
    if missing:
        raise ValueError(f"llama3 rope_scaling is missing {missing}")
    scaling = Llama3RopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        # transformers' fallback when the key is absent.
        original_max_position_embeddings=int(rope.get("original_max_position_embeddings", max_positions)),
    )
    return theta, scaling


def _qwen3(hidden: int, intermediate: int, layers: int, heads: int, tied: bool) -> ModelConfig:
    return ModelConfig(model_type="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=intermediate,
                       num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128,
                       max_position_embeddings=40960, rope_theta=1e6, tie_word_embeddings=tied)


def _qwen2_5(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, *, vocab: int, tied: bool,
             max_positions: int, rms_norm_eps: float = 1e-6) -> ModelConfig:
    return ModelConfig(model_type="qwen2", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=max_positions, rms_norm_eps=rms_norm_eps, rope_theta=1e6,
                       tie_word_embeddings=tied)


# The published architectures (their Hugging Face config.json) of the models the papers train, for planning
# (`rubric-jax plan --model-preset`) without a checkpoint. Token ids are left unset: a plan needs only shapes.
# Qwen2.5 presets are the base models' (RGR-GRPO trains Qwen2.5-3B and -7B base, DAPO Qwen2.5-32B base): the 3B's
# context is 32768 and its embeddings tied, the 7B's and 32B's context 131072 (their Instruct models': 32768) and
# the 32B's rms_norm_eps 1e-5.
MODEL_PRESETS: Mapping[str, ModelConfig] = {
    "Qwen3-0.6B": _qwen3(1024, 3072, 28, 16, tied=True),
    "Qwen3-1.7B": _qwen3(2048, 6144, 28, 16, tied=True),
    "Qwen3-4B": _qwen3(2560, 9728, 36, 32, tied=True),
    "Qwen3-8B": _qwen3(4096, 12288, 36, 32, tied=False),
    "Qwen3-14B": _qwen3(5120, 17408, 40, 40, tied=False),
    "Qwen3-32B": _qwen3(5120, 25600, 64, 64, tied=False),
    # SRaR's alternative judge; 128 experts of width 768, 8 per token, renormalised, in every layer.
    "Qwen3-30B-A3B": ModelConfig(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48,
        num_heads=32, num_kv_heads=4, head_dim=128, max_position_embeddings=40960, rope_theta=1e6,
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True),
    "Llama-3.1-8B": ModelConfig(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
        num_heads=32, num_kv_heads=8, head_dim=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
        rope_theta=500000.0, rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 8192)),
    "Qwen2.5-3B": _qwen2_5(2048, 11008, 36, 16, 2, vocab=151936, tied=True, max_positions=32768),
    "Qwen2.5-7B": _qwen2_5(3584, 18944, 28, 28, 4, vocab=152064, tied=False, max_positions=131072),
    "Qwen2.5-32B": _qwen2_5(5120, 27648, 64, 40, 8, vocab=152064, tied=False, max_positions=131072,
                            rms_norm_eps=1e-5),
}


def preset_config(name: str) -> ModelConfig:
    """The `MODEL_PRESETS` architecture `name`; ValueError naming the presets for an unknown one."""
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]
