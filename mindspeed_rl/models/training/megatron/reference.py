"""The frozen reference policy on megatron shards (:class:`MegatronReferenceModel`), and
:func:`load_model_in_dtype`, the one loader of a rank's stage for the reference and the trained
engine alike.

Apart from ``engine.py`` because the reference needs none of the engine's DDP, optimizer or
weight export: it only scores batches (``log_probs``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.device import torch_dtype
from mindspeed_rl.models.training.host_residency import HostResidency
from mindspeed_rl.models.training.megatron.groups import ensure_host_group
from mindspeed_rl.models.training.megatron.layout import MegatronLayout
from mindspeed_rl.models.training.megatron.log_probs import compute_log_probs_megatron
from mindspeed_rl.models.training.megatron.model import init_model_parallel, load_model
from mindspeed_rl.weights.megatron_dims import GPTDims, load_dims


def load_model_in_dtype(
    model_path: str | os.PathLike[str], dims: GPTDims, layout: MegatronLayout, param_dtype: str
) -> Any:
    """This rank's stage with every parameter in ``param_dtype``.

    The local layer spec's norms are torch norms built without a dtype (``WrappedTorchNorm`` in
    megatron-core 0.12.1 and 0.19.2, transformer/torch_norm.py), so they come out fp32 under
    ``bf16: true``; megatron's own bf16 training casts the whole module (``Float16Module``:
    ``module.bfloat16()``, transformer/module.py), and so does this. TransformerEngine's norms
    already have ``params_dtype``.
    """
    module = load_model(model_path, dims, layout, param_dtype=param_dtype)
    return module.to(torch_dtype(param_dtype))


class MegatronReferenceModel:
    """The frozen initial policy, sharded like the trained one (same layout, no DDP, no grads), in
    the policy's parameter dtype and on its device: the reference is never trained, so an fp32
    copy of a bf16 policy would double its memory for nothing. ``offload``: the weights live on the
    host except during :meth:`compute_log_probs` (upstream's integrated worker,
    :mod:`~mindspeed_rl.models.training.host_residency`)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        layout: MegatronLayout,
        *,
        micro_batch_size: int,
        pad_token_id: int = 0,
        seed: int = 1,
        device: str = "cpu",
        param_dtype: str = "float32",
        offload: bool = False,
    ) -> None:
        init_model_parallel(layout, seed)
        self._device = torch.device(device)
        ensure_host_group(self._device)
        self.dims = load_dims(model_path)
        self._model = load_model_in_dtype(model_path, self.dims, layout, param_dtype)
        self._model.requires_grad_(False)
        self._micro_batch_size = micro_batch_size
        self._pad_token_id = pad_token_id
        self.residency = HostResidency(self._model, enabled=offload)

    @property
    def model(self) -> torch.nn.Module:
        return self._model

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        with self.residency.resident():
            return compute_log_probs_megatron(
                self._model,
                self.dims,
                batch,
                temperature=temperature,
                micro_batch_size=self._micro_batch_size,
                pad_token_id=self._pad_token_id,
                device=self._device,
            )
