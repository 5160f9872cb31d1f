"""Flax NNX decoders (Qwen3, Qwen3-MoE, Qwen2.5, Llama 3, Gemma 3), Hugging Face safetensors load/save, sharding
rules, logprob functions.

The contract the pieces of this package share:

config.py      `ModelConfig`, a frozen dataclass read from a Hugging Face `config.json` (`ModelConfig.from_hf_dict`,
               `ModelConfig.from_pretrained(directory)`), with `to_hf_dict()` for saving. Families: "qwen3" (q/k
               RMSNorm, explicit head_dim), "qwen3_moe" (Qwen3's attention, mixture-of-experts MLPs), "qwen2" (Qwen2
               and Qwen2.5: q/k/v biases), "llama" (Llama 3, incl. "llama3" RoPE scaling) and "gemma3_text" (Gemma 3:
               local and global layers, read from a Gemma3ForCausalLM or the language model of a multimodal
               Gemma3ForConditionalGeneration checkpoint).
decoder.py     `Decoder(config, *, rngs, dtype, param_dtype)`, an `nnx.Module` whose attribute tree mirrors the
               Hugging Face parameter names (so one table maps between them):
                 embed_tokens.embedding            [V, D]      <-> model.embed_tokens.weight           [V, D]
                 layers[i].input_layernorm.scale   [D]         <-> model.layers.i.input_layernorm.weight
                 layers[i].self_attn.{q,k,v,o}_proj.kernel [in, out] <-> model.layers.i.self_attn.{q,k,v,o}_proj.weight [out, in]
                 layers[i].self_attn.{q,k,v}_proj.bias   [out] <-> ....bias (qwen2, or attention_bias)
                 layers[i].self_attn.o_proj.bias         [D]   <-> ....bias (attention_bias only)
                 layers[i].self_attn.{q,k}_norm.scale [head_dim] <-> ....{q,k}_norm.weight   (qwen3 only)
                 layers[i].post_attention_layernorm.scale [D]
                 layers[i].{pre,post}_feedforward_layernorm.scale [D]      (gemma3_text only)
                 layers[i].mlp.{gate,up,down}_proj.kernel [in, out] <-> model.layers.i.mlp.{...}_proj.weight [out, in]
                 layers[i].mlp.gate.kernel         [D, E]      <-> model.layers.i.mlp.gate.weight [E, D]  (qwen3_moe)
                 layers[i].mlp.experts.{gate,up}_edf [E, D, F] <-> model.layers.i.mlp.experts.j.{gate,up}_proj.weight
                                                                   [F, D], one per expert j (qwen3_moe)
                 layers[i].mlp.experts.down_efd    [E, F, D]   <-> model.layers.i.mlp.experts.j.down_proj.weight [D, F]
                 norm.scale                        [D]         <-> model.norm.weight
                 lm_head.kernel                    [D, V]      <-> lm_head.weight [V, D]   (untied only)
               `Decoder.__call__(tokens_bt, positions_bt, attention_mask_bt, cache=None) -> (hidden_btd, cache)`:
               final-norm hidden states (not logits: the learner never materialises [B, T, V]);
               `Decoder.unembed_kernel() -> [D, V]` (tied: embedding.T); `Decoder.logits(hidden_btd)`.
               `KVCache` for the incremental decode path (`init_cache(config, batch, max_len, dtype)`).
safetensors_io.py  load a local HF directory (model.safetensors or a sharded index) straight into sharded params;
               save back to the same layout.
sharding.py    the one place mapping parameter paths to PartitionSpecs over a mesh with axes
               (data, fsdp, expert, tensor).
moe.py         Qwen3-MoE's top-k router, experts by grouped matmuls (`jax.lax.ragged_dot`), load-balancing loss.
ragged_decode.py  the ragged Pallas decode-attention kernel (each row reads its own cache blocks).
logprobs.py    chunked per-token logprobs and entropy of response tokens, float32, never the full [B, T, V].
train_step.py  jitted, sharded step: logprobs -> a core policy loss -> grads -> optax update, with donation.
"""
