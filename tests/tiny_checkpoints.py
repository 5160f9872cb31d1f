"""Tiny random Hugging Face checkpoints saved to disk, the way every model test gets weights without a download.

Each fixture is a directory holding what `save_pretrained` writes for a Qwen3, Qwen3-MoE, Qwen2, Llama or Gemma 3
model (config.json, model.safetensors, generation_config.json, float32) and a tiny byte-level BPE tokenizer with a
chat template (tokenizer.json, tokenizer_config.json, chat_template.jinja), loadable by AutoModelForCausalLM (the
multimodal Gemma 3: AutoModelForImageTextToText) and AutoTokenizer. Gemma's tokenizer has Gemma's special tokens
at their ids and its template.

Shapes: hidden 64, 2 layers, 4 query heads, 2 key/value heads, head_dim 16, MLP 128. The vocabulary is 320: the
tokenizer's 256 bytes + merges + 3 special tokens (TOKENIZER_VOCAB_SIZE), padded up as real checkpoints pad
theirs, so some model ids have no token.

transformers initialises weights with std 0.02 and norms to 1, which makes logits tiny and every norm scale the
same; the weights are redrawn at unit scale (norm scales around 1, biases nonzero) so that a wrong transpose,
a swapped norm or a dropped bias shows in the logits.
"""

import pytest
import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 320
TOKENIZER_VOCAB_SIZE = 300
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PAD_ID, IM_START_ID, IM_END_ID = 0, 1, 2  # the BPE trainer numbers special tokens first
# Qwen3's template reads `enable_thinking`: false opens the assistant turn with an empty think block.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
EMPTY_THINK_BLOCK = "<think>\n\n</think>\n\n"
# Gemma's special tokens at its own ids (pad 0, eos 1, bos 2), then its turn markers; an instruction-tuned Gemma 3
# ends a turn with <end_of_turn>, which its config lists as an eos beside <eos>.
GEMMA_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")
GEMMA_EOS_ID, GEMMA_BOS_ID, GEMMA_END_OF_TURN_ID = 1, 2, 4
# Gemma 3's template, as its tokenizer_config.json ships it (less the image items): no system role, a system
# message is folded into the first user turn; the assistant's role is "model".
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
_CORPUS = [
    "The rubric awards two points for a correct final answer and one point for showing each step.",
    "### Step 1: add the numbers. ### Step 2: check the sum. The answer is 42.",
    "what is two plus two? the answer is four.",
]

SHAPES = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    bos_token_id=None,
    pad_token_id=PAD_ID,
    eos_token_id=IM_END_ID,
)
# Llama 3 RoPE scaling with a short original context, so that test positions run past it; theta 500000 as in
# Llama 3 puts the 8 frequencies of head_dim 16 in all three bands (kept, interpolated, divided by factor).
LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)


def _tokenizer(special_tokens=SPECIAL_TOKENS, **tokens) -> transformers.PreTrainedTokenizerFast:
    """The tiny BPE tokenizer: Qwen's special tokens and template by default; `tokens` (eos_token, pad_token,
    bos_token, chat_template) for another family's."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB_SIZE,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    assert [tokenizer.token_to_id(t) for t in special_tokens] == list(range(len(special_tokens)))
    assert tokenizer.get_vocab_size() == TOKENIZER_VOCAB_SIZE
    tokens = tokens or dict(eos_token="<|im_end|>", pad_token="<|endoftext|>", chat_template=CHAT_TEMPLATE)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **tokens)


def _gemma_tokenizer() -> transformers.PreTrainedTokenizerFast:
    return _tokenizer(GEMMA_SPECIAL_TOKENS, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>",
                      chat_template=GEMMA_CHAT_TEMPLATE)


def _redraw_weights(model: torch.nn.Module) -> None:
    # Gemma's norms multiply by 1 + weight: the same multipliers around 1 are weights around 0. Its embeddings are
    # multiplied by sqrt(hidden_size): drawn that much smaller, the scaled embedding stays at unit scale beside the
    # layers' outputs instead of drowning them (a policy that only repeats its input).
    gemma = model.config.model_type.startswith("gemma")
    norm_offset, embedding_std = (0.0, model.config.get_text_config().hidden_size ** -0.5) if gemma else (1.0, 1.0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif param.ndim == 1:  # an RMSNorm scale
                param.copy_(norm_offset + 0.2 * torch.randn_like(param))
            elif "embed_tokens" in name:
                param.normal_(0.0, embedding_std)
            else:  # a Linear weight [out, in] (or experts' [E, out, in]): unit-variance outputs for unit inputs
                param.normal_(0.0, param.shape[-1] ** -0.5)


def _save_tiny_model(tmp_path_factory, name: str, config: transformers.PretrainedConfig, tokenizer=None,
                     model_class=transformers.AutoModelForCausalLM):
    torch.manual_seed(0)
    model = model_class.from_config(config, dtype=torch.float32)
    _redraw_weights(model)
    directory = tmp_path_factory.mktemp(name)
    model.save_pretrained(directory, safe_serialization=True)
    (tokenizer or _tokenizer()).save_pretrained(directory)
    return directory


# A Gemma 3 language model: a window of 4 positions on local layers 0 and 2, layer 1 global (pattern 2), the
# global layers' RoPE linearly scaled by 2, and queries scaled by 24 ** -0.5 (not head_dim's 16), so that each
# of Gemma's conventions shows in the logits.
GEMMA3_TEXT = dict(**{**SHAPES, "num_hidden_layers": 3, "pad_token_id": 0, "eos_token_id": [GEMMA_EOS_ID,
                                                                                              GEMMA_END_OF_TURN_ID],
                      "bos_token_id": GEMMA_BOS_ID},
                   sliding_window=4, sliding_window_pattern=2, query_pre_attn_scalar=24,
                   rope_scaling={"rope_type": "linear", "factor": 2.0}, max_position_embeddings=512)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory):
    """Qwen3 with tied embeddings (as Qwen3-0.6B to 4B)."""
    config = transformers.Qwen3Config(**SHAPES, tie_word_embeddings=True, max_position_embeddings=512)
    return _save_tiny_model(tmp_path_factory, "tiny_qwen3", config)


@pytest.fixture(scope="session")
def tiny_qwen3_untied_dir(tmp_path_factory):
    """Qwen3 with a separate lm_head (as Qwen3-8B and up)."""
    config = transformers.Qwen3Config(**SHAPES, tie_word_embeddings=False, max_position_embeddings=512)
    return _save_tiny_model(tmp_path_factory, "tiny_qwen3_untied", config)


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tmp_path_factory):
    """Qwen3-MoE: 4 experts of width 32, 2 per token, renormalised (as Qwen3-30B-A3B), layer 1 kept dense
    (`mlp_only_layers`) so both MLPs are read; an untied lm_head."""
    config = transformers.Qwen3MoeConfig(**SHAPES, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         norm_topk_prob=True, mlp_only_layers=[1], tie_word_embeddings=False,
                                         max_position_embeddings=512)
    return _save_tiny_model(tmp_path_factory, "tiny_qwen3_moe", config)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    """Qwen2 (Qwen2.5's architecture: q/k/v biases, no o_proj bias, no q/k norms) with tied embeddings, as
    Qwen2.5-0.5B to 3B, and Qwen2.5's rope_theta 1e6."""
    config = transformers.Qwen2Config(**SHAPES, tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=512)
    return _save_tiny_model(tmp_path_factory, "tiny_qwen2", config)


@pytest.fixture(scope="session")
def tiny_qwen2_untied_dir(tmp_path_factory):
    """Qwen2 with a separate lm_head (as Qwen2.5-7B and up)."""
    config = transformers.Qwen2Config(**SHAPES, tie_word_embeddings=False, rope_theta=1e6, max_position_embeddings=512)
    return _save_tiny_model(tmp_path_factory, "tiny_qwen2_untied", config)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """Llama 3 with llama3 RoPE scaling, an untied lm_head, and attention biases (which no released Llama 3 has,
    but the config allows and the decoder implements) so the bias path is tested too."""
    config = transformers.LlamaConfig(
        **{**SHAPES, "eos_token_id": [IM_END_ID, PAD_ID]},  # a list, as Llama 3 Instruct's
        tie_word_embeddings=False,
        attention_bias=True,
        rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE,
        max_position_embeddings=256,
    )
    return _save_tiny_model(tmp_path_factory, "tiny_llama", config)


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory):
    """Gemma 3 text (`Gemma3ForCausalLM`, as gemma-3-1b), with Gemma's tokenizer tokens and chat template."""
    config = transformers.Gemma3TextConfig(**GEMMA3_TEXT)
    return _save_tiny_model(tmp_path_factory, "tiny_gemma3", config, _gemma_tokenizer())


@pytest.fixture(scope="session")
def tiny_gemma3_multimodal_dir(tmp_path_factory):
    """A multimodal Gemma 3 (`Gemma3ForConditionalGeneration`, as gemma-3-4b and up) with a one-layer SigLIP
    vision tower: its language model is GEMMA3_TEXT's."""
    vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)
    config = transformers.Gemma3Config(text_config=transformers.Gemma3TextConfig(**GEMMA3_TEXT),
                                       vision_config=vision, mm_tokens_per_image=4, image_token_index=5,
                                       boi_token_index=6, eoi_token_index=7)
    return _save_tiny_model(tmp_path_factory, "tiny_gemma3_multimodal", config, _gemma_tokenizer(),
                            transformers.AutoModelForImageTextToText)
