"""Tiny random causal LMs with a real (small, trained-in-test) BPE tokenizer, for fast unit tests.

`tiny_lm(arch)` builds one in well under a second, offline and deterministically: a byte-level BPE
tokenizer trained on a few multilingual sentences (so there are real multi-byte, multi-script tokens
and character offsets) and a randomly initialised Llama-, Gemma-3- or GPT-2-style model.
"""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerFast,
)

from babelprobe.models import LoadedModel, wrap_model

CORPUS = [
    "A dog can bark.", "A cat can climb trees.", "An eagle can fly.", "A chair has four legs.",
    "Ein Hund kann bellen.", "Eine Katze kann klettern.", "Un chien peut aboyer.", "Une chaise a quatre pieds.",
    "Un perro puede ladrar.", "Собака умеет лаять.", "Кошка умеет лазить по деревьям.", "狗会汪汪叫。",
    "猫会爬树。", "犬は吠える。", "猫は木に登る。", "개는 짖을 수 있다.", "Köpek havlayabilir.",
    "Con chó có thể sủa.", "The answer is yes.", "Which concept has the property?",
]


def tiny_tokenizer(bos: bool = True) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 3, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", bos_token="<bos>" if bos else None)


def tiny_config(arch: str, vocab_size: int, max_positions: int = 128):
    common = dict(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                  pad_token_id=0, bos_token_id=2, eos_token_id=1)
    if arch == "llama":
        return LlamaConfig(**common, tie_word_embeddings=False)
    if arch == "gemma3":
        return Gemma3TextConfig(**common, head_dim=8, sliding_window=4, layer_types=None,
                                final_logit_softcapping=30.0)
    if arch == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=3, n_head=4, n_positions=max_positions,
                          bos_token_id=2, eos_token_id=1)
    raise ValueError(arch)


def tiny_lm(arch: str = "llama", bos: bool = True, max_positions: int = 128, seed: int = 0) -> LoadedModel:
    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer(bos=bos)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, len(tokenizer), max_positions),
                                             dtype=torch.float32, attn_implementation="eager")
    return wrap_model(model, tokenizer, name=f"tiny-{arch}")
