"""Tiny random models of every decoder family the family suite checks (tests/test_families.py), built from
transformers configs with the tiny BPE tokenizer of tests/tiny.py, and by-hand knowledge of each family
written here independently of babelprobe/data/families.csv: where its MLP activation can be computed
from (`NEURONS`), used by the suite's reference hooks.
"""

from __future__ import annotations

import copy
import os

import torch
import transformers as T
from transformers import AutoModelForCausalLM

from babelprobe.models import LoadedModel, wrap_model
from tests.tiny import tiny_tokenizer

D, WIDTH, L, HEADS = 32, 48, 3, 4  # width, MLP width (not 4·D, so a width taken from the wrong place shows), blocks


def _common(vocab: int, **extra) -> dict:
    return dict(vocab_size=vocab, hidden_size=D, intermediate_size=WIDTH, num_hidden_layers=L, num_attention_heads=HEADS,
                num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=1,
                **extra)


def _ids(vocab: int) -> dict:
    return dict(vocab_size=vocab, pad_token_id=0, bos_token_id=2, eos_token_id=1)


# family -> config builder (vocab size -> config); the keys are what the suite and the README table name
CONFIGS = {
    "llama": lambda v: T.LlamaConfig(**_common(v)),
    "mistral": lambda v: T.MistralConfig(**_common(v)),
    "mixtral": lambda v: T.MixtralConfig(**_common(v, num_local_experts=4, num_experts_per_tok=2)),
    "qwen2": lambda v: T.Qwen2Config(**_common(v)),
    "qwen2_moe": lambda v: T.Qwen2MoeConfig(**_common(v, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                                      shared_expert_intermediate_size=WIDTH)),
    "qwen3": lambda v: T.Qwen3Config(**_common(v, head_dim=8)),
    "qwen3_moe": lambda v: T.Qwen3MoeConfig(**_common(v, head_dim=8, num_experts=4, num_experts_per_tok=2,
                                                      moe_intermediate_size=16)),
    "gemma": lambda v: T.GemmaConfig(**_common(v, head_dim=8)),
    "gemma2": lambda v: T.Gemma2Config(**_common(v, head_dim=8, sliding_window=4, final_logit_softcapping=3.0)),
    "gemma3": lambda v: T.Gemma3TextConfig(**_common(v, head_dim=8, sliding_window=4, layer_types=None,
                                                     final_logit_softcapping=3.0)),
    "phi": lambda v: T.PhiConfig(**_common(v)),
    "phi3": lambda v: T.Phi3Config(**_common(v)),
    "olmo": lambda v: T.OlmoConfig(**_common(v)),
    "olmo2": lambda v: T.Olmo2Config(**_common(v)),
    "olmoe": lambda v: T.OlmoeConfig(**_common(v, num_experts=4, num_experts_per_tok=2)),
    "cohere": lambda v: T.CohereConfig(**_common(v, logit_scale=0.25)),
    "cohere2": lambda v: T.Cohere2Config(**_common(v, logit_scale=0.25, sliding_window=4)),
    "granite": lambda v: T.GraniteConfig(**_common(v, logits_scaling=4.0, embedding_multiplier=3.0,
                                                   residual_multiplier=0.5, attention_multiplier=0.2)),
    "stablelm": lambda v: T.StableLmConfig(**_common(v)),
    "gpt2": lambda v: T.GPT2Config(n_embd=D, n_inner=WIDTH, n_layer=L, n_head=HEADS, n_positions=128, **_ids(v)),
    "gpt_neo": lambda v: T.GPTNeoConfig(hidden_size=D, intermediate_size=WIDTH, num_layers=L, num_heads=HEADS,
                                        attention_types=[[["global", "local"], 1], [["global"], 1]], window_size=4,
                                        max_position_embeddings=128, **_ids(v)),
    "gpt_neox": lambda v: T.GPTNeoXConfig(hidden_size=D, intermediate_size=WIDTH, num_hidden_layers=L,
                                          num_attention_heads=HEADS, max_position_embeddings=128, **_ids(v)),
    "gptj": lambda v: T.GPTJConfig(n_embd=D, n_inner=WIDTH, n_layer=L, n_head=HEADS, n_positions=128, rotary_dim=4,
                                   **_ids(v)),
    "bloom": lambda v: T.BloomConfig(hidden_size=D, n_layer=L, n_head=HEADS, **_ids(v)),
    "falcon": lambda v: T.FalconConfig(hidden_size=D, ffn_hidden_size=WIDTH, num_hidden_layers=L, num_attention_heads=HEADS,
                                       **_ids(v)),
    "xglm": lambda v: T.XGLMConfig(d_model=D, ffn_dim=WIDTH, num_layers=L, attention_heads=HEADS,
                                   max_position_embeddings=128, **_ids(v)),
    # not in babelprobe/data/families.csv: found by the structural rule
    "opt": lambda v: T.OPTConfig(hidden_size=D, ffn_dim=WIDTH, num_hidden_layers=L, num_attention_heads=HEADS,
                                 max_position_embeddings=128, word_embed_proj_dim=D, **_ids(v)),
    "starcoder2": lambda v: T.Starcoder2Config(**_common(v)),
}

MOE = ("mixtral", "qwen3_moe", "olmoe")  # routed experts: neuron e·I + j is unit j of expert e
SHARED_EXPERT = ("qwen2_moe",)  # routed experts beside a shared one: neurons refused
STRUCTURAL = ("opt", "starcoder2")


def _act(config):
    from transformers.activations import ACT2FN

    name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) \
        or getattr(config, "activation_function", None)
    return ACT2FN[name]


def _gelu_bloom():
    # BLOOM's bloom_gelu_forward (eval): the tanh approximation, written out (modeling_bloom.py)
    return lambda x: x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


# family -> (per block, the module a hook reads, and how the neurons' activation follows from what it sees):
#   ("gate", path): act(output of path), the config's activation applied here (gated MLPs)
#   ("fused", path): act(first half of the output of path) (Phi-3's gate_up_proj)
#   ("down", path): the input of the down projection at path, which is the activation itself (plain MLPs)
NEURONS = {
    **{f: ("gate", "mlp.gate_proj") for f in ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                                              "olmo", "olmo2", "cohere", "cohere2", "granite", "stablelm")},
    "phi3": ("fused", "mlp.gate_up_proj"),
    "phi": ("down", "mlp.fc2"), "gpt2": ("down", "mlp.c_proj"), "gpt_neo": ("down", "mlp.c_proj"),
    "gpt_neox": ("down", "mlp.dense_4h_to_h"), "gptj": ("down", "mlp.fc_out"), "bloom": ("down", "mlp.dense_4h_to_h"),
    "falcon": ("down", "mlp.dense_4h_to_h"), "xglm": ("down", "fc2"), "opt": ("down", "fc2"),
    "starcoder2": ("down", "mlp.c_proj"),
    **{f: ("experts", "mlp.experts") for f in MOE},
}
# where each family keeps its decoder blocks (the reference of extraction's last layer: a hook on the last one)
BLOCKS = {**{f: "model.layers" for f in CONFIGS}, "opt": "model.decoder.layers", "gpt_neox": "gpt_neox.layers",
          **{f: "transformer.h" for f in ("gpt2", "gpt_neo", "gptj", "bloom", "falcon")}}
# the down projection of each dense family, where switching neurons off is written by hand
DOWN = {**{f: "mlp.down_proj" for f, (kind, _) in NEURONS.items() if kind in ("gate", "fused")},
        **{f: path for f, (kind, path) in NEURONS.items() if kind == "down"}}

_BUILT: dict = {}


def build(family: str, seed: int = 0, attention: str = "eager"):
    """(HF model, tokenizer) of a tiny random `family` model, float32, with transformers' `attention`
    implementation (eager, or sdpa: what `from_pretrained` gives a model that has it; built once)."""
    if (family, attention) not in _BUILT:
        tokenizer = tiny_tokenizer()
        torch.manual_seed(seed)
        config = CONFIGS[family](len(tokenizer))
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention)
        model.eval()
        _BUILT[(family, attention)] = (model, tokenizer)
    return _BUILT[(family, attention)]


# Where babelprobe's side of the suite runs: the CPU, or the device named by BABELPROBE_TEST_DEVICE (cuda on a GPU
# machine: `bash perf/gpu_check.sh tests`), where each check's model is a copy and its reference stays HF's
# forward on the CPU
DEVICE = torch.device(os.environ.get("BABELPROBE_TEST_DEVICE", "cpu"))


def family_lm(family: str, attention: str = "eager") -> LoadedModel:
    model, tokenizer = build(family, attention=attention)
    if DEVICE != torch.device("cpu"):  # `cpu:0` tries the copy on the CPU
        model = copy.deepcopy(model).to(DEVICE)
    return wrap_model(model, tokenizer, name=f"tiny-{family}" + ("" if attention == "eager" else f"-{attention}"))


def has_sdpa(family: str) -> bool:
    """Whether transformers runs `family` with torch's SDPA (the default of `from_pretrained` where it can)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[type(CONFIGS[family](600))]._supports_sdpa


# (family, attention) of the checks that run both: every family eagerly, and through SDPA where it has it
ATTENTIONS = [*((f, "eager") for f in CONFIGS), *((f, "sdpa") for f in CONFIGS if has_sdpa(f))]
