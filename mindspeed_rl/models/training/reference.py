"""The frozen reference policy used by the KL penalty."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np
import torch

from mindspeed_rl.models.training.batch import TrainBatch
from mindspeed_rl.models.training.device import resolve_device, torch_dtype
from mindspeed_rl.models.training.host_residency import HostResidency
from mindspeed_rl.models.training.log_probs import compute_response_log_probs

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_causal_lm(
    path: str | os.PathLike[str], device: torch.device | str, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """Load an HF causal-LM folder (single file or sharded safetensors, any stored dtype) in
    ``dtype``: fp32 by default, for exact log-prob agreement with fp32 rollout engines."""
    from transformers import AutoModelForCausalLM

    from mindspeed_rl.models.transformers_compat import load_config

    # The config through the adapter: transformers 4.x would read a 5.x config's RoPE base wrong.
    model = AutoModelForCausalLM.from_pretrained(os.fspath(path), config=load_config(path), dtype=dtype)
    torch.nn.Module.to(model, torch.device(device))  # HF wraps .to with a decorator mypy cannot read
    return model


class ReferenceModel:
    """Weights loaded once (the initial policy) and never updated; on the policy's device and in
    its parameter dtype (bf16 runs keep no fp32 reference copy: it is never trained).
    ``offload``: the weights live on the host except during :meth:`compute_log_probs`
    (upstream's integrated worker, :mod:`~mindspeed_rl.models.training.host_residency`)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        micro_batch_size: int,
        pad_token_id: int = 0,
        device: str = "cpu",
        param_dtype: str = "float32",
        chunk_tokens: int = 1024,
        offload: bool = False,
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(
                f"micro_batch_size must be >= 1; got {micro_batch_size}. Set rl_config.ref_forward_micro_batch_size."
            )
        self._device = resolve_device(device)
        self._model = load_causal_lm(model_path, self._device, torch_dtype(param_dtype))
        self._chunk_tokens = chunk_tokens
        self._model.eval()
        self._model.requires_grad_(False)
        self._micro_batch_size = micro_batch_size
        self._pad_token_id = pad_token_id
        self.residency = HostResidency(self._model, enabled=offload)

    def compute_log_probs(self, batch: TrainBatch, temperature: float) -> list[np.ndarray]:
        with self.residency.resident():
            return compute_response_log_probs(
                self._model,
                batch,
                temperature=temperature,
                micro_batch_size=self._micro_batch_size,
                pad_token_id=self._pad_token_id,
                device=self._device,
                chunk_tokens=self._chunk_tokens,
            )
