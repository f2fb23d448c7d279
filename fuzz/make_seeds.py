#!/usr/bin/env python3
"""Writes the committed seed corpus: a tiny valid llama GGUF (a 1-layer model with a 7-token
SentencePiece vocabulary), some text, and some conversations and templates."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, payload):
    return s(key) + struct.pack("<I", typ) + payload


def gguf(n_embd=8, n_ff=8, n_head=2, n_kv=1):
    toks = ["<unk>", "<s>", "</s>", "\u2581a", "b", "<0x0A>", "\u2581"]
    meta = [
        kv("general.architecture", 8, s("llama")),
        kv("llama.embedding_length", 4, struct.pack("<I", n_embd)),
        kv("llama.block_count", 4, struct.pack("<I", 1)),
        kv("llama.feed_forward_length", 4, struct.pack("<I", n_ff)),
        kv("llama.attention.head_count", 4, struct.pack("<I", n_head)),
        kv("llama.attention.head_count_kv", 4, struct.pack("<I", n_kv)),
        kv("llama.context_length", 4, struct.pack("<I", 16)),
        kv("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", 1e-5)),
        kv("tokenizer.ggml.model", 8, s("llama")),
        kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(toks)) + b"".join(s(t) for t in toks)),
        kv("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, len(toks)) + b"".join(struct.pack("<f", -i) for i in range(len(toks)))),
        kv("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(toks)) + struct.pack("<7i", 2, 3, 3, 1, 1, 6, 1)),
    ]
    hd = n_embd // n_head
    v = len(toks)
    tensors = [("token_embd.weight", [n_embd, v], 0), ("output_norm.weight", [n_embd], 0), ("output.weight", [n_embd, v], 1),
               ("blk.0.attn_norm.weight", [n_embd], 0), ("blk.0.attn_q.weight", [n_embd, n_embd], 0),
               ("blk.0.attn_k.weight", [n_embd, n_kv * hd], 0), ("blk.0.attn_v.weight", [n_embd, n_kv * hd], 0),
               ("blk.0.attn_output.weight", [n_embd, n_embd], 0), ("blk.0.ffn_norm.weight", [n_embd], 0),
               ("blk.0.ffn_gate.weight", [n_embd, n_ff], 0), ("blk.0.ffn_up.weight", [n_embd, n_ff], 0),
               ("blk.0.ffn_down.weight", [n_ff, n_embd], 1)]
    info, data = b"", b""
    for name, dims, typ in tensors:
        n = 1
        for d in dims:
            n *= d
        info += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", typ, len(data))
        blob = bytes((i * 7 + 3) % 251 for i in range(n * (4 if typ == 0 else 2)))
        if typ == 0:
            blob = b"".join(struct.pack("<f", ((i * 37) % 17 - 8) / 64) for i in range(n))
        data += blob + b"\0" * ((-len(blob)) % 32)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta) + info
    head += b"\0" * ((-len(head)) % 32)
    return head + data


def write(target, name, data):
    with open(os.path.join(HERE, "seeds", target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


write("gguf", "tiny-llama.gguf", gguf())
write("gguf", "vocab-only.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, 3) + kv("tokenizer.ggml.model", 8, s("gpt2"))
      + kv("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + s("a") + s("b") + s("ab"))
      + kv("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + s("a b")))
for i, t in enumerate(["\x00Hello world", "\x01 Hello  world!\n\tcode() {}", "\x02\u00fcber \U0001F600 \u4e2d\u6587 123456",
                       "\x80<s>x</s><|endoftext|>", "\x81   "]):
    write("tokenize", f"text{i}", t)
for i, t in enumerate(["\x00system\x1fBe brief.\x1fuser\x1fHi\x1fassistant\x1fHello!\x1fuser\x1fWho?",
                       "\x01user\x1f  spaced  \x1fassistant", "\x02system", "\x03user\x1f{{ x }}{% raw %}"]):
    write("chat_template", f"conv{i}", t)
write("chat_template", "tmpl-chatml", "\x81{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
write("chat_template", "tmpl-py", "\x80{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{{ m.content.strip().upper() }}|{% endfor %}{{ bos_token }}")
