"""Create a tiny random-weight Llama (no tokenizer) in OUT_DIR.

2 layers, hidden 128, 2 heads, 1 KV head, head_dim 64, intermediate 256,
vocab 1024, bf16, max_position_embeddings 4096. Deterministic (seed 0).
Usage: python make_tiny_llama.py OUT_DIR
"""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
torch.manual_seed(0)
cfg = LlamaConfig(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    torch_dtype="bfloat16",
)
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out)
print("saved", out, sum(p.numel() for p in model.parameters()), "params")
