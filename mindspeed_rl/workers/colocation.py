"""Upstream's colocated hybrid: trainer and rollout engine on the same devices, one phase at a time.

::

            ┌──────────── to_generate(version) ──────────────────┐
            │ 1. offload optimizer state, grads  (host)          │
            │ 2. wake the engine's weights  (tags=["weights"])   │
    TRAIN ──┤ 3. push the trainer's weights in-process           ├──► GENERATE
      ▲     │ 4. offload params                (host)            │        │
      │     │ 5. wake the engine's KV cache (tags=["kv_cache"])  │        │
      │     └─────────────────────────────────────────────────────┘        │
      │     ┌──────────── to_train() ────────────────────────────┐        │
      └─────┤ 1. engine to sleep, level 2 (weights and KV freed) ├◄───────┘
            │ 2. reload params, grads, optimizer state           │
            └─────────────────────────────────────────────────────┘

Why this order: the optimizer state and grads, the bulk of the trainer's memory (fp32 Adam
moments, fp32 masters under bf16), leave first; only then does the engine map its weight memory,
and the weights are pushed while the trainer's params are still on the device (a device-to-device
copy). The KV cache, usually the engine's largest allocation, is mapped last, once the params have
left. Sleep level 2 frees the engine's weights instead of copying them to host: the next push
overwrites every one of them, so a host copy per iteration would be wasted traffic. Only the parts
named by upstream's ``generate_config.offload_train_*`` move; the others stay on the device.

The machine is plain Python: the actions go through the two Protocols below, so a fake can
record them (tests) and ``ColocatedWorker`` binds them to a TrainingUnit and a vLLM engine in one
process (GPU/NPU; vLLM's sleep mode needs their allocators). On CPU ``pipeline: hybrid`` keeps two
processes (trainer actor, rollout actor) and does not use this module's worker.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mindspeed_rl.contracts import OffloadPart, OffloadSpec

if TYPE_CHECKING:
    from mindspeed_rl.contracts import RolloutSpec, TrainerSpec
    from mindspeed_rl.datasets import PromptRecord
    from mindspeed_rl.runtime.records import CompletedMinibatch, PromptGroup, ScheduledMinibatch


# vLLM's sleep-mode memory pools (``CuMemAllocator`` / vllm-ascend's ``CaMemAllocator`` tags).
WEIGHT_TAGS = ("weights",)
KV_CACHE_TAGS = ("kv_cache",)


class Phase(enum.Enum):
    TRAIN = "train"
    GENERATE = "generate"


class TrainSide(Protocol):
    """The trainer's part of a colocated worker."""

    def offload(self, parts: Sequence[OffloadPart]) -> None: ...

    def onload(self, parts: Sequence[OffloadPart]) -> None: ...

    def inference_weights(self) -> Iterable[tuple[str, Any]]: ...


class RolloutSide(Protocol):
    """The rollout engine's part of a colocated worker."""

    def sleep(self, level: int) -> None: ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> float: ...


class ColocatedPhases:
    """The TRAIN / GENERATE state machine; starts in GENERATE (the engine holds the initial weights)."""

    def __init__(
        self, trainer: TrainSide, rollout: RolloutSide, offload: OffloadSpec, *, sleep_level: int = 2
    ) -> None:
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level={sleep_level}; vLLM has levels 1 (weights kept on host) and 2")
        self._trainer = trainer
        self._rollout = rollout
        self._offload = offload
        self._sleep_level = sleep_level
        self.phase = Phase.GENERATE
        self.version = 0

    def to_train(self) -> None:
        """Free the devices from the engine and bring the training state back."""
        self._expect(Phase.GENERATE, "to_train")
        self._rollout.sleep(self._sleep_level)
        parts = self._offload.all_parts()
        if parts:
            self._trainer.onload(parts)
        self.phase = Phase.TRAIN

    def to_generate(self, version: int) -> None:
        """Hand the devices to the engine with the trainer's current weights as ``version``."""
        self._expect(Phase.TRAIN, "to_generate")
        if version <= self.version:
            raise ValueError(
                f"to_generate(version={version}) after version {self.version}; versions increase"
            )
        if first := self._offload.before_push():
            self._trainer.offload(first)
        self._rollout.wake_up(WEIGHT_TAGS)
        self._rollout.load_weights(self._trainer.inference_weights(), version)
        if then := self._offload.after_push():
            self._trainer.offload(then)
        self._rollout.wake_up(KV_CACHE_TAGS)
        self.phase, self.version = Phase.GENERATE, version

    def _expect(self, phase: Phase, call: str) -> None:
        if self.phase is not phase:
            raise RuntimeError(
                f"{call}() in phase {self.phase.value}: it is only valid from {phase.value} "
                "(TRAIN -> to_generate -> GENERATE -> to_train -> TRAIN)"
            )


def move_train_state(model: Any, optimizer: Any, parts: Iterable[OffloadPart], device: Any) -> None:
    """Move the named parts of a torch model + optimizer to ``device`` in place (parameters keep
    their identity, so the optimizer's references stay valid)."""
    for put, tensor in _moves(model, optimizer, parts):
        put(tensor.to(device))


def train_state_tensors(model: Any, optimizer: Any, parts: Iterable[OffloadPart]) -> list[Any]:
    """The tensors ``move_train_state`` would move for ``parts`` (what an offload frees)."""
    return [tensor for _, tensor in _moves(model, optimizer, parts)]


def _moves(model: Any, optimizer: Any, parts: Iterable[OffloadPart]) -> list[tuple[Any, Any]]:
    """(setter, tensor) pairs. ``optimizer`` is a ``torch.optim.Optimizer`` or a wrapper holding
    one as an attribute (the torch engine's mixed-precision optimizer); its parameters that are
    not the model's (fp32 masters) and its state tensors count as "optimizer"."""
    import torch

    wanted = set(parts)
    model_params = list(model.parameters())
    own = {id(p) for p in model_params}
    inner = _torch_optimizers(optimizer)
    extra = [p for o in inner for g in o.param_groups for p in g["params"] if id(p) not in own]
    out: list[tuple[Any, Any]] = []
    if "param" in wanted:
        out += [(functools.partial(setattr, p, "data"), p.data) for p in model_params]
    if "grad" in wanted:
        out += [
            (functools.partial(setattr, p, "grad"), p.grad)
            for p in [*model_params, *extra]
            if p.grad is not None
        ]
    if "optimizer" in wanted:
        out += [(functools.partial(setattr, p, "data"), p.data) for p in extra]
        for o in inner:
            for state in o.state.values():
                out += [
                    (functools.partial(state.__setitem__, key), value)
                    for key, value in state.items()
                    if isinstance(value, torch.Tensor)
                ]
    return out


def _torch_optimizers(optimizer: Any) -> list[Any]:
    import torch

    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    found = [v for v in getattr(optimizer, "__dict__", {}).values() if isinstance(v, torch.optim.Optimizer)]
    if not found:
        raise ValueError(
            f"{type(optimizer).__name__} holds no torch.optim.Optimizer attribute; offload needs the "
            "optimizer whose state to move (pass it, or give the wrapper one)"
        )
    return found


def free_device_cache(device: str) -> None:
    """Return freed blocks to the device so the woken engine can take them (no-op on CPU)."""
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "npu":
        torch.npu.empty_cache()  # type: ignore[attr-defined]  # torch_npu registers it


class ColocatedWorker:
    """One process holding the Training Unit and the rollout engine (GPU/NPU; untested here: no
    accelerator with vLLM was available). The hybrid trainer drives it through the same calls as
    its two actors; ``refresh`` replaces the object-store weight push with ``to_generate``."""

    def __init__(
        self,
        trainer_spec: TrainerSpec,
        rollout_spec: RolloutSpec,
        policy_path: str,
        prompts: Mapping[str, PromptRecord],
        offload: OffloadSpec,
    ) -> None:
        import dataclasses

        from mindspeed_rl.workers.generation_actor import GenerationActor
        from mindspeed_rl.workers.training_unit import TrainingUnit

        self.trainer = TrainingUnit(trainer_spec, policy_path, prompts)
        keys = {**rollout_spec.engine_keys, "enable_sleep_mode": True}
        self.actor = GenerationActor(
            dataclasses.replace(rollout_spec, engine_keys=keys), policy_path, prompts
        )
        self.phases = ColocatedPhases(self.trainer, self.actor, offload)

    def generate_minibatch(self, minibatch: ScheduledMinibatch) -> CompletedMinibatch:
        return self.actor.generate_minibatch(minibatch)

    def train_step(self, groups: Sequence[PromptGroup]) -> dict[str, float]:
        self.phases.to_train()
        return self.trainer.train_step(groups)

    def refresh(self, version: int) -> None:
        self.phases.to_generate(version)

    # The Training Unit's other calls (reporting, checkpointing), as on the two-actor form.
    def decode_held_out(self, job: Any) -> Any:
        return self.actor.decode_held_out(job)  # after ``refresh`` the engine is awake, current

    def score_held_out(self, prompts: Any, decoded: Any) -> dict[str, float]:
        return self.trainer.score_held_out(prompts, decoded)

    def save_hf(self, path: str) -> None:
        self.trainer.save_hf(path)

    def save_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        self.trainer.save_state(path, optimizer=optimizer, rng=rng)

    def load_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        self.trainer.load_state(path, optimizer=optimizer, rng=rng)
