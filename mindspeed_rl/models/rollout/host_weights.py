"""HF-named weights as host numpy arrays: the record a hybrid weight push sends through Ray.

Why not a dict of torch tensors: Ray pickles a tensor through torch's storage reducer, which
serialises the storage into a bytes object (one more full copy on each side), and in a process
that imported megatron-core that reducer is megatron's own function (``megatron.core`` replaces
``torch.storage._load_from_bytes`` at import), so unpickling the weights imports megatron into
the rollout process, where on Ascend it must not arrive before MindSpeed's adaptor. Numpy arrays
travel out of band instead (Ray's object store; one copy on arrival, see ``__iter__``). bf16 has no numpy dtype:
it travels as its raw 16 bits and is viewed back on arrival, so every dtype round-trips exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# Torch dtypes numpy lacks, sent as the same-width integer bits.
_BITS_VIEWS = {"bfloat16": "int16"}


@dataclass(frozen=True, slots=True)
class HostWeights:
    """Iterating yields ``(name, torch.Tensor)`` pairs, what ``RolloutEngine.load_weights`` takes."""

    arrays: tuple[tuple[str, np.ndarray], ...]
    dtypes: tuple[str, ...]
    """The torch dtype name of each array (``"bfloat16"`` arrays hold int16 bits)."""

    @classmethod
    def from_tensors(cls, named: Iterable[tuple[str, torch.Tensor]]) -> HostWeights:
        import torch

        arrays, dtypes = [], []
        for name, tensor in named:
            host = tensor.detach().to("cpu").contiguous()
            dtype = str(host.dtype).removeprefix("torch.")
            if dtype in _BITS_VIEWS:
                host = host.view(getattr(torch, _BITS_VIEWS[dtype]))
            arrays.append((name, host.numpy()))
            dtypes.append(dtype)
        return cls(arrays=tuple(arrays), dtypes=tuple(dtypes))

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        import torch

        for (name, array), dtype in zip(self.arrays, self.dtypes, strict=True):
            # Arrays read from Ray's object store are read-only shared memory: copy once here rather
            # than trust every engine's loader never to write into what it is given.
            tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
            yield name, tensor.view(getattr(torch, dtype)) if dtype in _BITS_VIEWS else tensor

    def __len__(self) -> int:
        return len(self.arrays)
