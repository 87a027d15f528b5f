"""A tiny random-weight LLaMA GGUF for tests that need a real engine (llama.cpp) on CPU.

The weights are noise, so the text it generates is gibberish; what matters is that llama.cpp
loads it in well under a second, tokenizes English into word pieces (not raw bytes) and decodes
500–2,000 tokens per second on a 2-core machine. The file is under 1 MB and the same bytes
come out for the same seed.

One coordinate is not noise: every token embedding carries 1.0 in dimension 0, which the final
RMSNorm turns into a near-constant ~sqrt(n_embd) in every hidden state, so column 0 of the
output matrix acts as a per-token logit bias. It is used to
- never sample byte or control tokens: a lone byte token such as <0xE3> is an incomplete UTF-8
  sequence, and llama-cpp-python then holds back stream chunks and generates past max_tokens;
  a sampled <s> would stream an empty chunk. Without them one streamed chunk is one token;
- set how likely EOS is (``eos_bias``, roughly added to its logit). At the llama-cpp-python server's
  default sampling (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), measured over 60
  replies: 0 → EOS never came in 200 tokens, so replies run to max_tokens; 0.5 → mean reply
  23 tokens; 1.0 → 13; 2.0 → 5; 3.0 → 1.5 (most end at once).
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class LlamaShape:
    """A LLaMA model's size: what the file's header says and its tensors have."""

    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 128
    n_ctx: int = 4096
    #: Vocabulary size (0: just the pieces). More entries cost every decoding request its
    #: output projection and sampling, as a real vocabulary does; text never tokenizes into them.
    n_vocab: int = 0
    #: Width of one attention head (0: n_embd ÷ n_head). Narrower heads make attention, which
    #: grows with the context, cheaper beside the matrix multiplies, as in a large model.
    n_head_dim: int = 0

    @property
    def head_dim(self) -> int:
        return self.n_head_dim or self.n_embd // self.n_head

    def parameters(self) -> int:
        """Weights of the transformer blocks (embeddings and output excluded): what every
        prompt token multiplies through."""
        q_dim, kv_dim = self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        attention = self.n_embd * (2 * q_dim + 2 * kv_dim)
        return self.n_layer * (attention + 3 * self.n_embd * self.n_ff)


# Small enough to run fast, with a context large enough for prompts of a few thousand tokens.
TINY = LlamaShape()

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

# SentencePiece's word-boundary marker: a piece starting with it begins a new word.
SPACE = "\u2581"
PAD = "\ue000"

# Common English words, space-separated: each is added with every prefix so SPM's pairwise
# merges can reach it.
_WORDS = (
    "the of and to in is it that for was on are as with be at by this have from or one had not "
    "but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much "
    "before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take "
    "why things help put years different away again off went old number great tell men say "
    "small every found still between name should home big give air line set own under read "
    "last never us left end along while might next sound below saw something thought both few "
    "those always looked show large often together asked house don world going want school "
    "important until form food keep children feet land side without boy once animals life "
    "enough took sometimes four head above kind began almost live page got earth need far hand "
    "high year mother light parts country father let night following picture being study second "
    "eyes soon times story boys since white days ever paper hard near sentence better best "
    "across during today others however sure means knew try told young miles sun ways thing "
    "whole hear example heard several change answer room sea against top turned learn point "
    "city play toward five using himself usually request model token server test load engine "
    "prompt"
)
# Frequent inner pieces so words outside the list still split into a few pieces.
_SUFFIXES = ("ing", "ed", "er", "es", "ly", "tion", "th", "he", "in", "an", "re", "on", "at", "en")


def _pieces(words: Iterable[str] = ()) -> list[str]:
    """The ordinary (non-byte, non-control) pieces, in a fixed order: the built-in words, then
    ``words`` (each then one token)."""
    pieces: list[str] = [SPACE]
    pieces += list(string.ascii_lowercase + string.ascii_uppercase + string.digits)
    pieces += list(".,!?'\"-:;()/")
    pieces += [SPACE + c for c in string.ascii_lowercase + string.ascii_uppercase + string.digits]
    pieces += list(_SUFFIXES)
    for word in [*_WORDS.split(), *words]:
        full = SPACE + word
        # Prefixes from length 3 on ("▁t" is already there): the merge path ▁t → ▁th → ▁the.
        pieces += [full[:i] for i in range(3, len(full) + 1)]
    # Words share prefixes ("▁th"); keep each piece once, at its first place.
    return list(dict.fromkeys(pieces))


def tiny_vocab(
    words: Iterable[str] = (), size: int = 0
) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the byte-fallback SentencePiece vocabulary (``words``:
    more whole words, each a single token), padded to ``size`` entries."""
    # Imported here: the shape and the pieces need no gguf (the validation imports them).
    import gguf  # type: ignore[import-not-found, unused-ignore]

    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    scores = [0.0, 0.0, 0.0]
    # Byte fallback: a character with no piece becomes its UTF-8 bytes, so any text tokenizes.
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    scores += [0.0] * 256
    pieces = _pieces(words)
    # Padding starts with a private-use character no text holds (and no piece is), so no
    # merge ever reaches it; sampled, it streams as valid UTF-8 like any piece.
    pieces += [f"{PAD}{i:x}" for i in range(max(size - len(tokens) - len(pieces), 0))]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    # SPM merges the highest-scoring adjacent pair first; longer pieces score higher so whole
    # words win over inner pieces, and the index breaks ties so the order is fixed.
    scores += [float(len(p)) - i * 1e-4 for i, p in enumerate(pieces)]
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama_gguf(
    path: Path,
    *,
    seed: int = 0,
    eos_bias: float = 0.0,
    shape: LlamaShape = TINY,
    words: Iterable[str] = (),
) -> Path:
    """Write the tiny model to ``path`` (same bytes for the same arguments) and return ``path``.

    ``eos_bias`` shifts the end-of-sequence logit (see the module docstring); ``shape`` sizes
    the model; ``words`` adds whole words to the vocabulary, one token each (a load test's
    prompt words, so its prompts are as many tokens as it planned).
    """
    import gguf  # type: ignore[import-not-found, unused-ignore]

    n_embd, n_ff = shape.n_embd, shape.n_ff
    head_dim = shape.head_dim
    tokens, scores, types = tiny_vocab(words, shape.n_vocab)
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int) -> npt.NDArray[np.float16]:
        # numpy (rows, cols) is ggml's (ne0=cols, ne1=rows), the layout llama.cpp expects.
        # F16 halves the file; the small scale keeps logits near uniform so no token dominates.
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16)

    def norm() -> npt.NDArray[np.float32]:
        return np.ones(n_embd, dtype=np.float32)

    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("enginefit-tiny-llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    if shape.n_head_dim:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)

    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)

    q_dim, kv_dim = shape.n_head * head_dim, shape.n_head_kv * head_dim
    embd = weight(n_vocab, n_embd)
    embd[:, 0] = 1.0  # the constant coordinate behind the logit bias below
    writer.add_tensor("token_embd.weight", embd)
    for i in range(shape.n_layer):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", norm())
        writer.add_tensor(f"{blk}.attn_q.weight", weight(q_dim, n_embd))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(kv_dim, n_embd))
        writer.add_tensor(f"{blk}.attn_v.weight", weight(kv_dim, n_embd))
        writer.add_tensor(f"{blk}.attn_output.weight", weight(n_embd, q_dim))
        writer.add_tensor(f"{blk}.ffn_norm.weight", norm())
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(n_embd, n_ff))
    writer.add_tensor("output_norm.weight", norm())
    output = weight(n_vocab, n_embd)
    # Dimension 0 reaches the logits scaled by ~sqrt(n_embd) (see the module docstring).
    scale = float(np.sqrt(n_embd))
    special = [i for i, t in enumerate(types) if t != gguf.TokenType.NORMAL]
    output[special, 0] = -2.0  # ~ -16 logits: never sampled
    output[EOS_ID, 0] = eos_bias / scale
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
