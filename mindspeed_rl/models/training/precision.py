"""The optimizer step at the engine's parameter precision: plain fp32, or bf16 with fp32 masters.

bf16 scheme (``param_dtype: bfloat16``; the simplest correct one, as in Megatron's
``Float16OptimizerWithFloat16Params`` without the loss scaler that bf16 does not need)::

    model params (bf16)  ── forward / backward ──►  param.grad (bf16, one micro-batch)
           ▲                                             │ after_backward: master.grad += grad.float()
           │ step: copy (round to bf16)                  ▼                 param.grad = None
    master params (fp32) ◄── AdamW (fp32 exp_avg / exp_avg_sq) ── clip on the fp32 grads

Gradients are summed across micro-batches in fp32 (each micro-batch's gradient is rounded to
bf16 once, by the backward pass itself), so accumulation error does not grow with the number of
micro-batches; updates smaller than a bf16 ulp of a weight still accumulate in its master copy.

The megatron engine steps the same optimizers on a CPU host: its gradients are already summed
(over micro-batches and DP ranks) in megatron DDP's ``main_grad`` buffers, and ``take_grads``
hands them over in place of ``after_backward``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class AdamWSettings:
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float


class ParamOptimizer(Protocol):
    """One optimizer step over a model's parameters, whatever precision they are held in."""

    def zero_grad(self) -> None: ...

    def after_backward(self) -> None:
        """Called after every micro-batch's ``backward``."""
        ...

    def take_grads(self, grads: Sequence[torch.Tensor]) -> None:
        """Use ``grads`` (one per parameter, in ``params`` order, summed elsewhere) as the
        gradients of the next ``step``, instead of accumulating ``param.grad``."""
        ...

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Clip the accumulated gradients in place; returns their global norm (before clipping)."""
        ...

    def step(self, lr: float) -> None: ...

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The model's trainable parameters, in the order the optimizer state is kept."""
        ...

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        """The AdamW that steps: over ``params`` (fp32), or over ``master_params``."""
        ...

    @property
    def master_params(self) -> list[torch.nn.Parameter] | None:
        """The fp32 copies AdamW steps (one per entry of ``params``); None when it steps ``params``."""
        ...

    @property
    def lr(self) -> float: ...

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to take the same next step (checkpointing)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _adamw(params: Sequence[torch.Tensor], settings: AdamWSettings) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        params, lr=settings.lr, weight_decay=settings.weight_decay, betas=settings.betas, eps=settings.eps
    )


class FullPrecisionOptimizer:
    """AdamW directly on fp32 parameters."""

    def __init__(self, params: Sequence[torch.nn.Parameter], settings: AdamWSettings) -> None:
        self._params = [p for p in params if p.requires_grad]
        self._optimizer = _adamw(self._params, settings)

    def zero_grad(self) -> None:
        self._optimizer.zero_grad(set_to_none=True)

    def after_backward(self) -> None:
        pass

    @torch.no_grad()
    def take_grads(self, grads: Sequence[torch.Tensor]) -> None:
        for param, grad in zip(self._params, grads, strict=True):
            param.grad = grad if grad.dtype == param.dtype else grad.to(param.dtype)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self._params, max_norm, error_if_nonfinite=True)

    def step(self, lr: float) -> None:
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()

    @property
    def lr(self) -> float:
        return float(self._optimizer.param_groups[0]["lr"])

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self._params

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def master_params(self) -> list[torch.nn.Parameter] | None:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {"adamw": self._optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state["adamw"])


class MasterWeightOptimizer:
    """AdamW on fp32 master copies of low-precision parameters (see the module docstring)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], settings: AdamWSettings) -> None:
        self._params = [p for p in params if p.requires_grad]
        # Parameters, so AdamW keeps its state in their dtype (fp32) and device.
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self._params]
        self._optimizer = _adamw(self.masters, settings)

    def zero_grad(self) -> None:
        self._optimizer.zero_grad(set_to_none=True)
        for p in self._params:
            p.grad = None

    @torch.no_grad()
    def after_backward(self) -> None:
        for param, master in zip(self._params, self.masters, strict=True):
            if param.grad is None:
                continue
            if master.grad is None:
                master.grad = param.grad.float()
            else:
                master.grad.add_(param.grad)
            param.grad = None

    @torch.no_grad()
    def take_grads(self, grads: Sequence[torch.Tensor]) -> None:
        # An fp32 gradient is used as it is (``float()`` returns the tensor itself), no copy.
        for master, grad in zip(self.masters, grads, strict=True):
            master.grad = grad.float()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(self.masters, max_norm, error_if_nonfinite=True)

    @torch.no_grad()
    def step(self, lr: float) -> None:
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()
        for param, master in zip(self._params, self.masters, strict=True):
            param.copy_(master)

    @property
    def lr(self) -> float:
        return float(self._optimizer.param_groups[0]["lr"])

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return self._params

    @property
    def torch_optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    @property
    def master_params(self) -> list[torch.nn.Parameter] | None:
        return self.masters

    def state_dict(self) -> dict[str, Any]:
        # The fp32 masters are state too: rebuilt from the bf16 weights they would lose the
        # sub-ulp updates they have accumulated.
        return {"adamw": self._optimizer.state_dict(), "masters": [m.detach().cpu() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        masters = state["masters"]
        if len(masters) != len(self.masters):
            raise ValueError(
                f"optimizer state holds {len(masters)} master tensors, the model has {len(self.masters)}; "
                "the checkpoint is of another architecture (or set no_load_optim: true)"
            )
        for master, saved in zip(self.masters, masters, strict=True):
            master.copy_(saved)
        for param, master in zip(self._params, self.masters, strict=True):
            param.copy_(master)
        self._optimizer.load_state_dict(state["adamw"])


def build_optimizer(model: torch.nn.Module, settings: AdamWSettings) -> ParamOptimizer:
    """fp32 parameters: plain AdamW; bf16 parameters: fp32 masters. Anything else is refused (fp16
    would need loss scaling, which is not implemented)."""
    return optimizer_for([p for p in model.parameters() if p.requires_grad], settings)


def optimizer_for(params: Sequence[torch.nn.Parameter], settings: AdamWSettings) -> ParamOptimizer:
    """:func:`build_optimizer` over ``params`` (the trainable ones, in the order given)."""
    dtypes = {p.dtype for p in params}
    if dtypes == {torch.float32}:
        return FullPrecisionOptimizer(params, settings)
    if dtypes == {torch.bfloat16}:
        return MasterWeightOptimizer(params, settings)
    raise ValueError(
        f"trainable parameters have dtypes {sorted(map(str, dtypes))}; load the model in one dtype "
        "in float32 or bfloat16 (megatron_training.bf16 picks one)"
    )
