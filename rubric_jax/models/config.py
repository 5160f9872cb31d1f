"""`ModelConfig`: the architecture of a Qwen3, Qwen3-MoE, Qwen2 (Qwen2.5), Llama 3 or Gemma 3 decoder, read from and
written to a Hugging Face `config.json`.

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
- gemma3_text (Gemma 3, `Gemma3ForCausalLM`; transformers' `Gemma3TextModel`): its layers interleave local
  attention over a sliding window of `sliding_window` positions with global attention (`layer_types`, or
  transformers' default: every `sliding_window_pattern`-th layer, 6, global); local layers rotate by
  `rope_local_theta` (the config's rope_local_base_freq, 10000) without scaling, global ones by `rope_theta`
  (1e6) with the config's linear `rope_scaling` (`LinearRopeScaling`: 8 on the 4B and larger models). Queries
  are scaled by query_pre_attn_scalar ** -0.5; q/k norms, RMSNorms computing (1 + weight) in float32, four
  norms per layer (before and after attention and MLP), a GeLU-tanh MLP, embeddings scaled by sqrt(hidden_size).
  A multimodal Gemma 3 checkpoint (model_type "gemma3", `Gemma3ForConditionalGeneration`: the 4B and larger
  models) reads as its language model: `text_config` over Gemma3TextConfig's defaults (`language_model`, True);
  its weights load from either name layout and its vision tower is left out (`models.safetensors_io`). Logit
  soft-capping (Gemma 2's) and bidirectional attention are refused.
- Keys a config.json may leave out take the transformers config class's default: rope_theta 10000 and
  rms_norm_eps 1e-6 for every family, max_position_embeddings 32768 (qwen2, qwen3) or 2048 (llama), Gemma 3's
  its own (`_GEMMA3_TEXT_DEFAULTS`).
"""

import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Union

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2": "Qwen2ForCausalLM",
                 "llama": "LlamaForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
# A multimodal checkpoint whose language model is read (`ModelConfig.language_model`).
MULTIMODAL_ARCHITECTURES = {"gemma3": "Gemma3ForConditionalGeneration"}
SLIDING, GLOBAL = "sliding_attention", "full_attention"

# The Hugging Face config classes' defaults for keys a config.json may leave out.
_HF_DEFAULT_MAX_POSITIONS = {"qwen3": 32768, "qwen3_moe": 32768, "qwen2": 32768, "llama": 2048,
                             "gemma3_text": 131072}
# Gemma3TextConfig's defaults (the multimodal checkpoints' text_config leaves most keys out).
_GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
                         "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                         "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
                         "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 10000.0,
                         "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
                         "tie_word_embeddings": True, "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
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
class LinearRopeScaling:
    """Linear RoPE scaling (transformers' "linear" type, Gemma 3's global layers): every frequency divided by
    `factor`."""

    factor: float

    def __post_init__(self):
        if self.factor <= 0:
            raise ValueError(f"linear rope_scaling factor must be positive, got {self.factor}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only model of the "qwen3", "qwen3_moe", "qwen2" (Qwen2 and Qwen2.5), "llama"
    (Llama 3) or "gemma3_text" (Gemma 3) family.

    `qk_norm` (RMSNorm on each query and key head before RoPE) follows from the family: True for qwen3 only.
    `qkv_bias` and `o_proj_bias` (biases of the attention's projections) follow from the family and
    `attention_bias` (the module docstring); a qwen2 config with `attention_bias` set is a ValueError, since
    transformers' Qwen2 ignores the key and a checkpoint written for it would not be one.
    `eos_token_id` is an int or a tuple of ints (Llama 3 Instruct lists several), as in the config.json.
    The mixture-of-experts fields (`num_experts` and on) are qwen3_moe's (module docstring): zero experts for the
    dense families. The attention fields after them are gemma3_text's: `layer_types` (one per layer, SLIDING or
    GLOBAL), `sliding_window`, `rope_local_theta`, `query_pre_attn_scalar` (None elsewhere: head_dim);
    `language_model` marks a config read from a multimodal checkpoint's text_config.
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
    layer_types: tuple[str, ...] = ()
    sliding_window: Optional[int] = None
    rope_local_theta: float = _HF_DEFAULT_ROPE_THETA
    query_pre_attn_scalar: Optional[int] = None
    language_model: bool = False

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
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, (Llama3RopeScaling,
                                                                                LinearRopeScaling)):
            raise ValueError(f"rope_scaling must be None, a Llama3RopeScaling or a LinearRopeScaling, got "
                             f"{self.rope_scaling!r}")
        if self.model_type == "qwen2" and self.attention_bias:
            raise ValueError("model_type 'qwen2' takes no attention_bias: its q/k/v projections always have biases "
                             "and o_proj none (transformers' Qwen2Attention)")
        if isinstance(self.eos_token_id, list):
            # A frozen dataclass must stay hashable (it is static under jit): lists become tuples.
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        self._check_experts()
        self._check_local_attention()

    def _check_local_attention(self) -> None:
        if self.model_type != "gemma3_text":
            if self.layer_types or self.sliding_window is not None:
                raise ValueError(f"model_type {self.model_type!r} has no sliding-window layers, got layer_types="
                                 f"{self.layer_types} and sliding_window={self.sliding_window}")
            return
        if len(self.layer_types) != self.num_layers or not set(self.layer_types) <= {SLIDING, GLOBAL}:
            raise ValueError(f"gemma3_text needs layer_types naming {SLIDING!r} or {GLOBAL!r} for each of its "
                             f"{self.num_layers} layers, got {self.layer_types}")
        if SLIDING in self.layer_types and not (self.sliding_window or 0) > 0:
            raise ValueError(f"sliding-window layers need a positive sliding_window, got {self.sliding_window}")
        if self.rope_local_theta <= 0 or (self.query_pre_attn_scalar is not None and self.query_pre_attn_scalar <= 0):
            raise ValueError(f"rope_local_theta and query_pre_attn_scalar must be positive, got "
                             f"{self.rope_local_theta} and {self.query_pre_attn_scalar}")

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

    def sliding_layer(self, index: int) -> bool:
        """Whether layer `index` attends over a sliding window (gemma3_text's local layers)."""
        return bool(self.layer_types) and self.layer_types[index] == SLIDING

    @property
    def gemma(self) -> bool:
        """Gemma's conventions (module docstring): (1 + weight) norms, four per layer, GeLU-tanh, scaled embeddings."""
        return self.model_type == "gemma3_text"

    @property
    def attention_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def embed_scale(self) -> Optional[float]:
        return self.hidden_size ** 0.5 if self.gemma else None

    @property
    def hidden_act(self) -> str:
        return "gelu_pytorch_tanh" if self.gemma else "silu"

    def sparse_layer(self, index: int) -> bool:
        """Whether layer `index` has the mixture-of-experts MLP (transformers' Qwen3MoeDecoderLayer rule)."""
        return (self.num_experts > 0 and index not in self.mlp_only_layers
                and (index + 1) % self.decoder_sparse_step == 0)

    @property
    def qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "qwen3_moe", "gemma3_text")

    @property
    def qkv_bias(self) -> bool:
        return self.model_type == "qwen2" or self.attention_bias

    @property
    def o_proj_bias(self) -> bool:
        return self.attention_bias

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any]) -> "ModelConfig":
        """Reads a Hugging Face config dict (transformers 4 or 5 layout); ValueError on anything unsupported."""
        if d.get("model_type") in MULTIMODAL_ARCHITECTURES:
            return cls.from_hf_dict(_language_model_config(d))
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
        if model_type == "gemma3_text":
            d = {**_GEMMA3_TEXT_DEFAULTS, **d}
        _reject_unsupported_features(d)
        max_positions = d.get("max_position_embeddings") or _HF_DEFAULT_MAX_POSITIONS[model_type]
        rope_theta, rope_scaling = (_read_gemma3_rope(d) if model_type == "gemma3_text" else
                                    _read_rope(d, max_positions))
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
            **(_read_gemma3_attention(d) if model_type == "gemma3_text" else {}),
        )

    @classmethod
    def from_pretrained(cls, path: Union[str, os.PathLike]) -> "ModelConfig":
        """Reads `config.json` from a local Hugging Face model directory."""
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f))

    def to_hf_dict(self) -> dict[str, Any]:
        """A config.json dict that transformers (4.51+ and 5) loads as this architecture.

        RoPE is written in both layouts: transformers 4 reads only `rope_theta` / `rope_scaling`, transformers 5
        prefers `rope_parameters`; both describe the same thing, so either reader gets it. gemma3_text's keys are
        its own (a multimodal checkpoint's language model is written as Gemma3ForCausalLM), with its RoPE per
        layer type.
        """
        rope_scaling = None
        if self.rope_scaling is not None:
            rope_type = "linear" if isinstance(self.rope_scaling, LinearRopeScaling) else "llama3"
            rope_scaling = {"rope_type": rope_type, **dataclasses.asdict(self.rope_scaling)}
        global_rope = {"rope_type": "default", "rope_theta": self.rope_theta, **(rope_scaling or {})}
        hf = {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_activation" if self.gemma else "hidden_act": self.hidden_act,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "rope_parameters": global_rope,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": list(self.eos_token_id) if isinstance(self.eos_token_id, tuple) else self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }
        if self.model_type == "qwen3_moe":
            hf.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                      moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                      decoder_sparse_step=self.decoder_sparse_step, mlp_only_layers=list(self.mlp_only_layers))
        if self.gemma:
            hf.update(rope_local_base_freq=self.rope_local_theta, layer_types=list(self.layer_types),
                      rope_parameters={GLOBAL: global_rope,
                                       SLIDING: {"rope_type": "default", "rope_theta": self.rope_local_theta}},
                      sliding_window=self.sliding_window,
                      query_pre_attn_scalar=self.query_pre_attn_scalar or self.head_dim,
                      final_logit_softcapping=None, attn_logit_softcapping=None)
        return hf


def _language_model_config(d: Mapping[str, Any]) -> dict[str, Any]:
    """A multimodal checkpoint's config dict as its language model's: `text_config` (missing keys take the text
    config class's defaults in `from_hf_dict`), with the top level's token ids and embedding tying where the text
    config leaves them out."""
    architectures = d.get("architectures") or [MULTIMODAL_ARCHITECTURES[d["model_type"]]]
    if list(architectures) != [MULTIMODAL_ARCHITECTURES[d["model_type"]]]:
        raise ValueError(f"unsupported architectures {architectures!r} for model_type {d['model_type']!r}; "
                         f"supported: [{MULTIMODAL_ARCHITECTURES[d['model_type']]!r}]")
    text = {key: value for key, value in dict(d.get("text_config") or {}).items() if value is not None}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
        if key not in text and d.get(key) is not None:
            text[key] = d[key]
    text.pop("architectures", None)
    return {**text, "model_type": "gemma3_text", "language_model": True}


def _read_gemma3_attention(d: Mapping[str, Any]) -> dict[str, Any]:
    """gemma3_text's attention fields (`ModelConfig`): transformers' default layer types when the dict has none,
    every `sliding_window_pattern`-th layer global."""
    if d.get("final_logit_softcapping") is not None or d.get("attn_logit_softcapping") is not None:
        raise ValueError(f"unsupported logit soft-capping (final_logit_softcapping="
                         f"{d.get('final_logit_softcapping')!r}, attn_logit_softcapping="
                         f"{d.get('attn_logit_softcapping')!r}): Gemma 3 has none")
    if d.get("use_bidirectional_attention"):
        raise ValueError("unsupported use_bidirectional_attention=True: the decoder is causal")
    pattern = d["sliding_window_pattern"]
    layer_types = d.get("layer_types") or [SLIDING if (i + 1) % pattern else GLOBAL
                                           for i in range(d["num_hidden_layers"])]
    rope = d.get("rope_parameters") or {}
    local_theta = (rope.get(SLIDING) or {}).get("rope_theta", d["rope_local_base_freq"])
    return {"layer_types": tuple(layer_types), "sliding_window": d["sliding_window"],
            "rope_local_theta": float(local_theta), "query_pre_attn_scalar": int(d["query_pre_attn_scalar"]),
            "language_model": bool(d.get("language_model", False))}


def _read_gemma3_rope(d: Mapping[str, Any]) -> tuple[float, Optional[LinearRopeScaling]]:
    """The global layers' theta and scaling: transformers 4's `rope_theta` / `rope_scaling`, or transformers 5's
    `rope_parameters` keyed by layer type ("default" or "linear" types only)."""
    rope = dict(d.get("rope_scaling") or (d.get("rope_parameters") or {}).get(GLOBAL) or {})
    theta = float(rope.get("rope_theta", d["rope_theta"]))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "linear":
        raise ValueError(f"unsupported Gemma 3 RoPE type {rope_type!r}; supported: 'default', 'linear'")
    return theta, LinearRopeScaling(float(rope["factor"]))


def _reject_unsupported_features(d: Mapping[str, Any]) -> None:
    activation = d.get("hidden_activation", d.get("hidden_act", "silu"))
    supported = "gelu_pytorch_tanh" if d.get("model_type") == "gemma3_text" else "silu"
    if activation != supported:
        raise ValueError(f"unsupported hidden activation {activation!r} for model_type {d.get('model_type')!r}; "
                         f"only {supported!r} is implemented")
    if d.get("model_type") == "gemma3_text":
        return
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


def _gemma3(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, *, head_dim: int = 256,
            window: int = 1024, scaling: Optional[float] = 8.0, vocab: int = 262208, max_positions: int = 131072,
            query_pre_attn_scalar: int = 256) -> ModelConfig:
    """A Gemma 3 language model: every sixth layer global, the others local (transformers' default pattern)."""
    return ModelConfig(model_type="gemma3_text", vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                       max_position_embeddings=max_positions, rope_theta=1e6,
                       rope_scaling=None if scaling is None else LinearRopeScaling(scaling), tie_word_embeddings=True,
                       layer_types=tuple(SLIDING if (i + 1) % 6 else GLOBAL for i in range(layers)),
                       sliding_window=window, rope_local_theta=10000.0, query_pre_attn_scalar=query_pre_attn_scalar)


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
    # Gemma 3: the 1B is a text model (Gemma3ForCausalLM); the others are the language models of the multimodal
    # checkpoints (their text_config), which is what a run trains of them.
    "gemma-3-1b": _gemma3(1152, 6912, 26, 4, 1, window=512, scaling=None, vocab=262144, max_positions=32768),
    "gemma-3-4b": _gemma3(2560, 10240, 34, 8, 4),
    "gemma-3-12b": _gemma3(3840, 15360, 48, 16, 8),
    "gemma-3-27b": _gemma3(5376, 21504, 62, 32, 16, head_dim=128, query_pre_attn_scalar=168),
}


def preset_config(name: str) -> ModelConfig:
    """The `MODEL_PRESETS` architecture `name`; ValueError naming the presets for an unknown one."""
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; presets: {', '.join(MODEL_PRESETS)}")
    return MODEL_PRESETS[name]
