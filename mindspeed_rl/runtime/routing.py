"""MoE routing records: which experts each token went through, as a sample carries it.

Shape convention (every engine, every test): ``[positions, moe_layers, top_k]`` where row ``q`` is
the top-k expert ids chosen while the token at sequence position ``q`` (prompt + response, from 0)
was the model's input. The logits that score response token ``j`` come from position
``prompt_len - 1 + j``, so ``prompt_len + response_len - 1`` rows cover every position a log-prob
depends on; the last response token is never an input and has no row. Rows are sorted within the
top-k (the expert *set* is what replay reproduces; the weights come from the replaying router).

Stored as bytes of the narrowest unsigned integer that holds every expert id (uint8 up to 256
experts: Qwen3-30B-A3B's 128 experts, 48 layers, top-8 cost 384 bytes per token), in a frozen
record of builtins so Ray pickles it without numpy object overhead. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import numpy as np

RoutingDtype = Literal["uint8", "uint16", "int32"]


def routing_dtype(num_experts: int) -> RoutingDtype:
    """The narrowest dtype holding every expert id of a model with ``num_experts`` experts."""
    if num_experts < 1:
        raise ValueError(f"num_experts={num_experts}; a MoE model has at least one expert")
    if num_experts <= 1 << 8:
        return "uint8"
    if num_experts <= 1 << 16:
        return "uint16"
    return "int32"


def routing_bytes_per_token(moe_layers: int, top_k: int, num_experts: int) -> int:
    """Bytes one token's routing costs in a sample: layers x top-k x dtype size."""
    size = {"uint8": 1, "uint16": 2, "int32": 4}[routing_dtype(num_experts)]
    return moe_layers * top_k * size


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    """One sample's routing (see the module docstring for the row convention)."""

    data: bytes
    positions: int
    layers: int
    top_k: int
    dtype: RoutingDtype

    def __post_init__(self) -> None:
        import numpy as np

        expected = self.positions * self.layers * self.top_k * np.dtype(self.dtype).itemsize
        if len(self.data) != expected:
            raise ValueError(
                f"routing record of {len(self.data)} bytes for [{self.positions}, {self.layers}, "
                f"{self.top_k}] {self.dtype} (expected {expected}); build it with Routing.from_array"
            )

    @classmethod
    def from_array(cls, array: np.ndarray, num_experts: int) -> Routing:
        """``array``: ``[positions, layers, top_k]`` expert ids (any integer dtype)."""
        import numpy as np

        a = np.asarray(array)
        if a.ndim != 3:
            raise ValueError(f"routing must be [positions, layers, top_k]; got shape {a.shape}")
        if a.size and (int(a.min()) < 0 or int(a.max()) >= num_experts):
            raise ValueError(
                f"routing holds expert ids in [{int(a.min())}, {int(a.max())}], outside 0..{num_experts - 1}"
            )
        dtype = routing_dtype(num_experts)
        packed = np.ascontiguousarray(np.sort(a, axis=-1).astype(dtype))
        return cls(
            data=packed.tobytes(), positions=a.shape[0], layers=a.shape[1], top_k=a.shape[2], dtype=dtype
        )

    def array(self) -> np.ndarray:
        """The ``[positions, layers, top_k]`` int64 expert ids."""
        import numpy as np

        flat = np.frombuffer(self.data, dtype=self.dtype)
        return flat.reshape(self.positions, self.layers, self.top_k).astype(np.int64)

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def check_covers(self, prompt_len: int, response_len: int, what: str) -> None:
        """Raise unless the record has one row per position a log-prob depends on."""
        expected = prompt_len + response_len - 1
        if self.positions != expected:
            raise ValueError(
                f"{what}: routing has {self.positions} positions for {prompt_len} prompt + {response_len} "
                f"response tokens (expected {expected}: every position but the last token's)"
            )


def append_rows(existing: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    """Partial rollouts: the routing after one more round. ``new`` covers the round's whole request
    (prompt + earlier tokens + the round's tokens); rows already recorded keep the version that
    produced them, only the positions past them take the new round's routing. Row ``q`` belongs to
    the weights that sampled token ``q + 1``: the token that ended the previous round is first an
    input in this round, so its row is this round's (the version whose log-prob it scores)."""
    import numpy as np

    if existing is None or existing.shape[0] == 0:
        return np.asarray(new)
    if new.shape[1:] != existing.shape[1:]:
        raise ValueError(
            f"routing rows of shape {new.shape[1:]} after rows of shape {existing.shape[1:]}; "
            "every round of a response must come from the same model"
        )
    if new.shape[0] < existing.shape[0]:
        raise ValueError(
            f"a continuation returned routing for {new.shape[0]} positions, fewer than the "
            f"{existing.shape[0]} already recorded; the engine must return the whole request's routing"
        )
    return np.concatenate([existing, new[existing.shape[0] :]], axis=0)


def mismatch_fraction(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> tuple[int, int]:
    """(rows whose expert set differs, rows compared) over matching ``[positions, layers, top_k]``
    arrays, one (position, layer) row at a time."""
    import numpy as np

    differ = total = 0
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape:
            raise ValueError(f"routing shapes differ: {x.shape} vs {y.shape}")
        rows = np.any(np.sort(x, axis=-1) != np.sort(y, axis=-1), axis=-1)
        differ += int(rows.sum())
        total += int(rows.size)
    return differ, total
