"""``async_config.collective_backend``: resolved per device kind when the plan is built, carried
typed to the GU's channel address, refused by name where the run has no such device; the HCCL
group's options as torch_npu reads them; the GU receiver's device."""

from __future__ import annotations

import dataclasses
import datetime
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from mindspeed_rl.config_cls import load_config_from_files
from mindspeed_rl.plan.build import build_run_plan
from mindspeed_rl.weights.collective_backend import KEY, resolve_backend
from tests.support.ray_cluster import init_in_process

CONFIGS = Path(__file__).resolve().parents[3] / "configs"

# (choice, device kind) -> backend, or the fix the refusal names.
TABLE: list[tuple[str, str | None, str]] = [
    ("auto", None, "gloo"),
    ("auto", "GPU", "nccl"),
    ("auto", "NPU", "hccl"),
    ("gloo", None, "gloo"),
    ("gloo", "GPU", "gloo"),
    ("gloo", "NPU", "gloo"),
    ("nccl", "GPU", "nccl"),
    ("hccl", "NPU", "hccl"),
    ("nccl", None, "refused: gloo or auto"),
    ("hccl", None, "refused: gloo or auto"),
    ("nccl", "NPU", "refused: hccl, gloo or auto"),
    ("hccl", "GPU", "refused: nccl, gloo or auto"),
]


def test_generation_actors_on_cpu_take_the_host_path() -> None:
    """A device trainer beside CPU generation actors: no device for the GU to receive on."""
    assert resolve_backend("auto", "GPU", actors_on_device=False) == "gloo"
    assert resolve_backend("gloo", "NPU", actors_on_device=False) == "gloo"
    with pytest.raises(ValueError, match=rf"{KEY}=hccl, but async_config.actor_resources asks no NPUs"):
        resolve_backend("hccl", "NPU", actors_on_device=False)


@pytest.mark.parametrize(("choice", "kind", "expected"), TABLE)
def test_the_key_resolves_per_device_kind(choice: str, kind: Any, expected: str) -> None:
    if not expected.startswith("refused"):
        assert resolve_backend(choice, kind) == expected  # type: ignore[arg-type]
        return
    with pytest.raises(ValueError) as err:
        resolve_backend(choice, kind, "num_x in somewhere")  # type: ignore[arg-type]
    message = str(err.value)
    assert message.startswith(f"{KEY}={choice} on ") and "num_x in somewhere" in message
    assert message.endswith(f"set {KEY} to {expected.removeprefix('refused: ')}"), message


def _plan(name: str, *overrides: str) -> Any:
    return build_run_plan(load_config_from_files(CONFIGS, name, overrides))


def test_the_plan_carries_the_resolved_backend() -> None:
    """The shipped async configs: CPU-only tiny (auto -> gloo), A3 NPU (auto -> hccl, gloo kept)."""
    collective = "async_config.weight_transport=collective"
    assert _plan("grpo_tiny_asp", collective).async_spec.collective_backend == "gloo"
    npu = "grpo_qwen3_30b_a3b_asp_A3"
    assert _plan(npu, collective).async_spec.collective_backend == "hccl"
    assert (
        _plan(npu, collective, "async_config.collective_backend=gloo").async_spec.collective_backend == "gloo"
    )
    with pytest.raises(ValueError, match=rf"{KEY}=nccl on a NPU run \(num_npus in "):
        _plan(npu, collective, "async_config.collective_backend=nccl")
    with pytest.raises(ValueError, match=rf"{KEY}=hccl on a CPU-only run .*set {KEY} to gloo or auto"):
        _plan("grpo_tiny_asp", collective, "async_config.collective_backend=hccl")
    cpu_actors = ("async_config.actor_resources.num_npus=0", "async_config.actor_resources.num_cpus=4")
    assert _plan(npu, collective, *cpu_actors).async_spec.collective_backend == "gloo"


def test_check_config_refuses_a_device_backend_on_a_cpu_run(capsys: pytest.CaptureFixture[str]) -> None:
    from cli import check_config

    assert check_config.main(["--config-name", "grpo_tiny_asp", "async_config.collective_backend=nccl"]) == 2
    assert f"{KEY}=nccl on a CPU-only run" in capsys.readouterr().err


# ---- the channel address -----------------------------------------------------------------------
class _Remote:
    """A Ray actor method, run here (its result put in the object store, as a call's would be)."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        import ray

        return ray.put(self._fn(*args))


class _Gu:
    """The GU's side of ``start_weight_flow`` (``GenerationUnit`` forwards to the same collective GU end)."""

    def __init__(self, cache: Path) -> None:
        from mindspeed_rl.weights.transports import transport_for

        self.weights = transport_for("collective").gu_end(cache)
        self.check_probe = _Remote(lambda probe: "here")
        self.open_weight_channel = _Remote(
            lambda world, backend: self.weights.open_channel(0, world, backend)
        )


@pytest.fixture
def ray_local() -> Any:
    import ray

    init_in_process(num_cpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_the_channel_address_uses_the_plan_s_backend(ray_local: Any, tmp_path: Path, backend: str) -> None:
    """``start_weight_flow`` (the driver's code) opens each GU's channel on the plan's backend and
    hands the TU that address. nccl cannot run here: its receiver waits for its device (bound
    once the GU's first actor is up), and fails on this host once given one."""
    from mindspeed_rl.trainer.weight_channels import start_weight_flow
    from mindspeed_rl.weights.transport import write_probe

    spec = dataclasses.replace(
        _plan("grpo_tiny_asp", "async_config.weight_transport=collective").async_spec,
        collective_backend=backend,
    )
    tu = types.SimpleNamespace(write_probe=_Remote(lambda folder: write_probe(Path(folder))))
    gu = _Gu(tmp_path / "gu0")
    kwargs = start_weight_flow(tu, {0: gu}, spec, None, tmp_path / "snapshots")
    (address,) = kwargs["channels"]
    assert address.backend == backend and address.world_size == 2
    receiver = gu.weights.receiver
    assert receiver.address == address
    if backend == "gloo":
        assert receiver._device == "cpu"
        return
    assert receiver._device == "cuda" and not receiver._device_bound.is_set()
    gu.weights.bind_receiver_device(0)
    receiver._thread.join(timeout=30)
    assert receiver._device == "cuda:0" and not receiver._thread.is_alive()
    assert receiver.received.failed is not None  # no CUDA on this host: the channel closed


# ---- the HCCL group's options ------------------------------------------------------------------
class _HcclOptions:
    """Stand-in for ``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options`` (torch_npu cannot
    be installed on this host), recorded from torch_npu 2.10.0.post4, commit 5dd8ef3f: Init.cpp
    binds ``op_timeout``, ``is_high_priority_stream``, ``global_ranks_in_group``, ``hccl_config``
    and ``group_id`` on a class derived from torch's ``Backend.Options`` (``_timeout``, ``backend``,
    ``global_ranks_in_group``, ``group_name``); pybind11 refuses any other attribute, as the slots
    do here. The C++ defaults: ``timeout`` 30 min (kNoTimeout -> DEFAULT_TIMEOUT), ``opTimeout``
    10 s (kProcessGroupHCCLOpTimeoutMillis), which no HCCL work reads."""

    __slots__ = (
        "_timeout", "backend", "global_ranks_in_group", "group_name",
        "op_timeout", "is_high_priority_stream", "hccl_config", "group_id",
    )  # fmt: skip

    def __init__(self) -> None:
        self._timeout = datetime.timedelta(minutes=30)
        self.op_timeout = datetime.timedelta(seconds=10)
        self.is_high_priority_stream = False
        self.backend = "hccl"


class _ProcessGroupHCCL:
    Options = _HcclOptions
    built: list[tuple[Any, ...]] = []

    def __init__(self, store: Any, rank: int, size: int, options: _HcclOptions) -> None:
        _ProcessGroupHCCL.built.append((store, rank, size, options))


def test_the_hccl_group_gets_its_timeout_where_torch_npu_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from mindspeed_rl.weights import collective

    c10d = types.SimpleNamespace(ProcessGroupHCCL=_ProcessGroupHCCL)
    monkeypatch.setitem(
        sys.modules, "torch_npu", types.SimpleNamespace(_C=types.SimpleNamespace(_distributed_c10d=c10d))
    )
    timeout = datetime.timedelta(seconds=collective.SENDER_TIMEOUT_S)
    collective._backend_group("hccl", "store", 1, 3, timeout)
    store, rank, size, options = _ProcessGroupHCCL.built[-1]
    assert (store, rank, size) == ("store", 1, 3)
    # The watchdog limit of every HCCL work is the base options' timeout (ProcessGroupHCCL.cpp:
    # work->opTimeout_ = options_->timeout); op_timeout keeps its unread default.
    assert options._timeout == timeout and options.op_timeout == datetime.timedelta(seconds=10)
    with pytest.raises(AttributeError):
        options.opTimeout = timeout  # type: ignore[attr-defined]  # no such attribute in torch_npu


# ---- the GU receiver's device ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("backend", "assigned", "env", "expected"),
    [
        ("nccl", ["3"], {}, 3),  # Ray leaves a device-less actor's view whole: the physical id
        ("nccl", ["3"], {"CUDA_VISIBLE_DEVICES": "2,3"}, 1),
        ("hccl", ["5"], {"ASCEND_RT_VISIBLE_DEVICES": "4,5,6,7"}, 1),
        ("hccl", ["5"], {"CUDA_VISIBLE_DEVICES": "0"}, 5),  # another vendor's variable: no narrowing
    ],
)
def test_the_receiver_takes_its_first_actor_s_device(
    backend: Any, assigned: list[str], env: dict[str, str], expected: int
) -> None:
    from mindspeed_rl.workers.gu_weights import receiver_device_index

    assert receiver_device_index(backend, 0, "node-a", "node-a", assigned, env) == expected


def test_the_receiver_refuses_an_actor_on_another_node() -> None:
    from mindspeed_rl.workers.gu_weights import receiver_device_index

    with pytest.raises(ValueError, match=rf"Generation Unit 2 runs on node a .* set {KEY}: gloo"):
        receiver_device_index("hccl", 2, "a", "b", ["0"], {})
