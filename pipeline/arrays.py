"""Per-request arrays held for a whole trace (a replay's hit tokens, every prompt's length):
int32 where every value fits, half the memory of int64. numpy sums int32 into int64 and means
it in float64, as it does int64, so the figures read from them are the same."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Tokens = NDArray[np.int32] | NDArray[np.int64]


def narrow(values: NDArray[np.integer]) -> Tokens:
    """``values`` as int32 when every one fits (no copy when they are int32 already), else as
    int64."""
    info = np.iinfo(np.int32)
    if values.size and (int(values.min()) < info.min or int(values.max()) > info.max):
        return values.astype(np.int64, copy=False)
    return values.astype(np.int32, copy=False)
