#!/usr/bin/env python3
"""Writes spm_llamacpp.json: token ids that llama.cpp's llama-tokenize gives for SentencePiece
("llama") vocabularies that llama.cpp's own vocab tests do not cover, which tests/tokenizer.rs
holds kiln to.

- the synthetic models' vocabularies (`kiln synth`: "▁" and upper case are not pieces, so
  most words start with a merge across a character that is not a piece itself);
- small hand-made vocabularies: merges through characters that are not pieces, score ties,
  byte fallback, whitespace runs, and one without byte tokens (where llama.cpp falls back to
  "<0xXX>" pieces it does not have and aborts: kiln's `<unk>` ids for those texts are kiln's
  own rule, listed apart, one `<unk>` per character).

Usage (needs llama.cpp's llama-tokenize, gguf-py, and kiln synth files):
    python3 make_spm_cases.py LLAMA_TOKENIZE OUT_DIR tiny-test.gguf mini-llama.gguf \
        tinyllama.gguf qwen3-0.6b.gguf
where the GGUF files are `kiln synth --preset P:q8_0 -o FILE` for the presets tiny-test,
mini-llama, tinyllama-1.1b (q4_k_m) and qwen3-0.6b (1024, 8192, 32000, 151936 tokens).
"""

import json
import os
import subprocess
import sys

import gguf

LLAMA_CPP_COMMIT = "0c1e57098"

# Texts for every synthetic vocabulary.
SYNTH_TEXTS = [
    "the quick brown fox",
    "the quick brown fox jumps over the lazy dog",
    "Hello, World!",
    " leading space",
    "trailing space ",
    "two  spaces and   three",
    "   ",
    " ",
    "line one\nline two\n\n",
    "tab\tseparated\tvalues",
    "numbers 1234 and 3.14",
    "café naïve résumé",
    "emoji 🦙 and 🚀",
    "日本語のテキスト",
    "aaaaaaaaaaaaaaaaaaaaa",
    "zzzzzz zzzz zz z",
    "abcdefghijklmnopqrstuvwxyz",
    "xyzzy plugh qwerty",
    "<s>the</s>end",
    "once upon a time there was a little girl named lily she liked to play outside in the "
    "sun one day she saw a big red ball in the park and she wanted to play with it",
]

BYTES = [f"<0x{b:02X}>" for b in range(256)]

# A hand-made vocabulary with byte tokens. Scores are chosen to exercise the merge order;
# "▁", "é", "🦙" and "x" are not pieces.
MERGES_PIECES = [
    ("h", -1.0), ("e", -2.0), ("l", -3.0), ("o", -4.0), ("w", -5.0), ("r", -6.0), ("d", -7.0),
    ("a", -8.0), ("b", -9.0), ("c", -10.0), ("t", -11.0), ("y", -12.0), ("z", -13.0),
    ("he", -20.0), ("ll", -21.0), ("or", -22.0), ("ld", -23.0),
    # across "▁", which is not a piece
    ("▁h", -30.0), ("▁w", -31.0), ("▁a", -32.0), ("▁he", -33.0), ("▁hell", -34.0),
    ("▁hello", -35.0), ("▁wor", -36.0), ("▁world", -37.0),
    # across "é", which is not a piece
    ("ét", -40.0), ("été", -41.0), ("▁ét", -42.0), ("▁été", -43.0),
    # across "🦙", which is not a piece
    ("🦙🦙", -44.0), ("▁🦙", -45.0),
    # ties: the leftmost pair merges first
    ("ab", -50.0), ("bc", -50.0), ("ty", 0.0), ("yz", -0.0),
    # unreachable: no pair of pieces makes it
    ("abc", 10.0),
    # whitespace runs, all with one score (as Llama 2's runs of "▁")
    ("▁▁", -1e9), ("▁▁▁", -1e9), ("▁▁▁▁", -1e9), ("\n\n", -60.0),
]

MERGES_TEXTS = [
    "hello world",
    "hello",
    " hello",
    "helloworld",
    "hello  world",
    "hello   world",
    "hello    world",
    "hello         world",
    "  ",
    "hello\n\nworld\n",
    "\t\r\n",
    "été",
    " été été",
    "étété",
    "é",
    "🦙🦙🦙",
    " 🦙",
    "abc",
    "cabcab",
    "tyz",
    "x",
    "xhellox",
    "a b c",
    "Hello World",
    "hello, world!",
    "<s>hello</s>",
    "",
]

# Without byte tokens, and without the dummy prefix.
NO_BYTES_PIECES = [
    ("▁", -1.0), ("a", -2.0), ("b", -3.0), ("c", -4.0), ("é", -5.0), ("ab", -6.0), ("▁a", -7.0),
    ("▁ab", -8.0), ("▁▁", -9.0), ("\n", -10.0),
]
NO_BYTES_TEXTS = ["ab", " ab", "ab ab", "  ab", "abc", "é ab\n", "cab  c"]
# llama.cpp aborts on these (a character that is not a piece, and no byte tokens): the ids
# are kiln's rule, one <unk> (id 0) per such character.
NO_BYTES_UNK = {
    "abd": [8, 0],
    "a d": [4, 3, 0],
    "ab 🦙": [8, 3, 0],
    "xyz": [0, 0, 0],
    " x ab": [3, 0, 10],
}


def vocab_gguf(path, pieces, byte_tokens, add_space_prefix):
    tokens = ["<unk>", "<s>", "</s>"]
    scores = [0.0, 0.0, 0.0]
    types = [2, 3, 3]
    if byte_tokens:
        tokens += BYTES
        scores += [0.0] * 256
        types += [6] * 256
    for piece, score in pieces:
        tokens.append(piece)
        scores.append(score)
        types.append(1)
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(512)
    w.add_embedding_length(256)
    w.add_block_count(2)
    w.add_feed_forward_length(512)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(64)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_space_prefix(add_space_prefix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"tokens": tokens, "scores": scores, "types": types, "add_space_prefix": add_space_prefix}


def llama_tokenize(tool, model, text, tmp):
    with open(tmp, "wb") as f:
        f.write(text.encode("utf-8"))
    r = subprocess.run(
        [tool, "-m", model, "-f", tmp, "--no-escape", "--ids", "--no-bos", "--log-disable"],
        capture_output=True,
    )
    if r.returncode != 0:
        return None
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main():
    tool, out_dir, *synth = sys.argv[1:]
    tmp = os.path.join(out_dir, "text.txt")
    data = {
        "about": (
            "Expected ids from llama.cpp's llama-tokenize (commit %s): "
            "llama-tokenize -m VOCAB.gguf -f TEXT --no-escape --ids --no-bos --log-disable. "
            "Written by make_spm_cases.py." % LLAMA_CPP_COMMIT
        ),
        "synthetic": [],
        "hand_made": [],
    }
    for path in synth:
        n_vocab = len(gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"].data)
        cases = [{"text": t, "ids": llama_tokenize(tool, path, t, tmp)} for t in SYNTH_TEXTS]
        assert all(c["ids"] is not None for c in cases), path
        data["synthetic"].append({"n_vocab": n_vocab, "cases": cases})

    for name, pieces, byte_tokens, prefix, texts in [
        ("merges", MERGES_PIECES, True, True, MERGES_TEXTS),
        ("no-byte-tokens", NO_BYTES_PIECES, False, False, NO_BYTES_TEXTS),
    ]:
        path = os.path.join(out_dir, f"{name}.gguf")
        vocab = vocab_gguf(path, pieces, byte_tokens, prefix)
        cases = [{"text": t, "ids": llama_tokenize(tool, path, t, tmp)} for t in texts]
        assert all(c["ids"] is not None for c in cases), name
        entry = {"name": name, **vocab, "cases": cases}
        if not byte_tokens:
            for text in NO_BYTES_UNK:
                assert llama_tokenize(tool, path, text, tmp) is None, f"llama.cpp tokenized {text!r}"
            entry["kiln_unk_cases"] = [{"text": t, "ids": ids} for t, ids in NO_BYTES_UNK.items()]
        data["hand_made"].append(entry)

    with open(os.path.join(os.path.dirname(__file__), "spm_llamacpp.json"), "w") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
