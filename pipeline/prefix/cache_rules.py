"""vLLM prefix-cache rules shared by every replay: how many blocks may hit, and cache namespaces.

Hit limit (vLLM 0.33.0 wheel, ``vllm/v1/core``):
``KVCacheManager.get_computed_blocks`` (``v1/core/kv_cache_manager.py`` L266-327) caps a hit at
``num_tokens - 1`` (the last prompt token is recomputed for its logits) and
``find_longest_cache_hit`` (``single_type_kv_cache_manager.py`` ~L743-797) keeps whole blocks,
so a request whose leading ``h`` full prompt blocks are cached hits
``min(h, ⌊(P − 1) / B⌋) × B`` tokens (P prompt tokens, B tokens per block). A fully cached prompt
of exactly k·B tokens hits (k − 1)·B tokens. :func:`hit_limit_blocks` gives ``⌊(P − 1) / B⌋``
(0 for an empty prompt); every replay and curve takes it precomputed.

Namespaces (vLLM ``generate_block_hash_extra_keys``, ``kv_cache_utils.py``
L590-680): the LoRA adapter is in every block's extra keys and different models run in different
engines, so requests of different ``model`` or ``lora_adapter`` never share a block; with tenant
isolation the tenant joins the key too (vLLM ``cache_salt``, SGLang's namespaced radix key).
:func:`namespace_codes` numbers the distinct (model, adapter[, tenant]) values of a table (a null
is a value of its own) and :func:`namespaced_ids` re-keys block ids as dense ids of
(namespace, block): exact, no collisions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl
from numpy.typing import ArrayLike, NDArray

from pipeline.prefix.hashmap import dense_ids

I64 = NDArray[np.int64]

# Columns of the canonical table (pipeline.schema) that separate caches in every setting.
NAMESPACE_COLUMNS: tuple[str, ...] = ("model", "lora_adapter")


def hit_limit_blocks(prompt_tokens: ArrayLike, block_size: int) -> I64:
    """Most leading prompt blocks a request may hit: ``⌊(P − 1) / B⌋``, at least 0."""
    tokens = np.asarray(prompt_tokens, dtype=np.int64)
    return np.maximum(tokens - 1, 0) // block_size


def namespace_codes(frame: pl.DataFrame, *, tenant_isolation: bool = False) -> I64:
    """Per row, a dense code of (model, lora_adapter[, tenant]) in order of first appearance.

    Nulls form their own value (a null model differs from every named one, "" included); an
    absent column counts as all null.
    """
    names = [*NAMESPACE_COLUMNS, *(("tenant",) if tenant_isolation else ())]
    keys = frame.with_columns(
        pl.lit(None, pl.String).alias(c) for c in names if c not in frame.columns
    ).select(pl.col(c).cast(pl.String) for c in names)
    if keys.height == 0 or all(keys[c].null_count() == keys.height for c in names):
        return np.zeros(keys.height, np.int64)
    distinct = keys.unique(maintain_order=True).with_row_index("_namespace")
    joined = keys.join(distinct, on=names, how="left", nulls_equal=True, maintain_order="left")
    return joined["_namespace"].cast(pl.Int64).to_numpy()


def namespaced_ids(ids: Any, offsets: I64, namespace: I64, n_ids: int) -> tuple[Any, int]:
    """Block ids of requests (``ids[offsets[r]:offsets[r+1]]`` for request ``r``, dense
    0..n_ids-1) re-keyed as dense ids of (namespace of the request, block).

    Unchanged when every request is in one namespace.
    """
    if namespace.size == 0 or int(namespace.max()) == int(namespace.min()):
        return ids, n_ids
    per_block = np.repeat(namespace.astype(np.uint64), np.diff(offsets))
    return dense_ids(per_block * np.uint64(max(n_ids, 1)) + ids.astype(np.uint64))
