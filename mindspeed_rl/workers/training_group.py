"""The Training Unit as a Ray worker group: one actor per rank, torch.distributed set up through Ray.

::

    driver / CU ──► TrainingGroup.call("train_step", groups) ──► RankWorker 0 ─┐
                                                         ├──► RankWorker 1 ─┤  same call, same args,
                                                         └──► RankWorker N ─┘  collectives inside
                    ◄── rank 0's result (every rank returns the same) ◄────────┘

Set-up: rank 0 picks its node's address and a free port; every rank calls
``init_process_group`` with it (gloo on CPU, nccl on GPU, hccl on NPU); then every rank builds its
target from the same picklable factory (e.g. a Training Unit around the megatron engine).

Failure: the driver waits on all ranks in short ticks. A rank whose actor died (or whose call
raised) is reported by rank id and the group is torn down, instead of the survivors hanging in
a collective that will never complete.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from mindspeed_rl.contracts import TrainerSpec

logger = logging.getLogger(__name__)

Backend = Literal["gloo", "nccl", "hccl"]
POLL_S = 1.0
FAILURE_GRACE_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSpec:
    """How many ranks, which collective backend, and each rank's Ray actor options."""

    world_size: int
    backend: Backend = "gloo"
    rank_options: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)
    """``ActorClass.options(**...)`` per rank (placement's ``trainer_rank_options``); empty = a
    fractional CPU each (``num_cpus_per_rank``)."""
    num_cpus_per_rank: float = 0.5
    timeout_s: float = 1800.0
    """Collective timeout; the driver notices a dead rank long before (every POLL_S)."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size={self.world_size}; a Training Unit needs >= 1 rank")
        if self.rank_options and len(self.rank_options) != self.world_size:
            raise ValueError(
                f"{len(self.rank_options)} rank_options for {self.world_size} ranks; give one per rank or none"
            )

    def options(self, rank: int) -> dict[str, Any]:
        if self.rank_options:
            return dict(self.rank_options[rank])
        return {"num_cpus": self.num_cpus_per_rank}


class TrainingRankError(RuntimeError):
    """A rank of the Training Unit died or raised; names the rank."""


class RankWorker:
    """One rank (a Ray actor): its process group and its target object."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._target: Any = None

    def rendezvous_address(self) -> tuple[str, int]:
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return ray.util.get_node_ip_address(), port

    def init_distributed(self, address: str, port: int, backend: Backend, timeout_s: float) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        from mindspeed_rl.utils.devices import bind_device, kind_of_backend

        # The device is bound before the process group exists: NCCL/HCCL pick their device from it.
        kind = kind_of_backend(backend)
        index = 0 if kind is None else bind_device(kind).index
        os.environ.update(
            MASTER_ADDR=address,
            MASTER_PORT=str(port),
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(index),
        )
        dist.init_process_group(
            backend, rank=self.rank, world_size=self.world_size, timeout=timedelta(seconds=timeout_s)
        )

    def build(self, factory: Callable[[], Any]) -> None:
        self._target = factory()

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._target is None:
            raise RuntimeError(f"rank {self.rank}: call({method!r}) before build()")
        return getattr(self._target, method)(*args, **kwargs)

    def pid(self) -> int:
        return os.getpid()


class TrainingGroup:
    """One Training Unit made of ``spec.world_size`` rank actors; see the module docstring."""

    def __init__(self, spec: GroupSpec, factory: Callable[[], Any]) -> None:
        import ray

        self.spec = spec
        actor: Any = ray.remote(RankWorker)
        self._ranks: list[Any] = [
            actor.options(**spec.options(r)).remote(r, spec.world_size) for r in range(spec.world_size)
        ]
        address, port = self._gather([self._ranks[0].rendezvous_address.remote()], ranks=[0])[0]
        self._gather(
            [w.init_distributed.remote(address, port, spec.backend, spec.timeout_s) for w in self._ranks]
        )
        self._gather([w.build.remote(factory) for w in self._ranks])

    @property
    def world_size(self) -> int:
        return self.spec.world_size

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on every rank with the same arguments; rank 0's result."""
        return self._gather([w.call.remote(method, args, kwargs) for w in self._ranks])[0]

    def call_rank0(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on rank 0 only: host-side work that is no collective (scoring text)."""
        return self._gather([self._ranks[0].call.remote(method, args, kwargs)], ranks=[0])[0]

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Like :meth:`call`, but every rank's result (e.g. per-rank snapshot shards)."""
        return self._gather([w.call.remote(method, args, kwargs) for w in self._ranks])

    def rank_pids(self) -> list[int]:
        return list(self._gather([w.pid.remote() for w in self._ranks]))

    def env_reports(self, modules: tuple[str, ...]) -> list[Any]:
        from mindspeed_rl.utils.env_probe import report_of_process

        return list(self._gather([w.__ray_call__.remote(report_of_process, modules) for w in self._ranks]))

    def shutdown(self) -> None:
        import ray

        for w in self._ranks:
            ray.kill(w)

    def _gather(self, refs: Sequence[Any], ranks: Sequence[int] | None = None) -> list[Any]:
        """Wait for every ref; failed ranks become a TrainingRankError naming them."""
        import ray

        ranks = list(range(len(refs))) if ranks is None else list(ranks)
        rank_of = {ref: r for ref, r in zip(refs, ranks, strict=True)}
        pending, results = list(refs), {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                try:
                    results[ref] = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                    self._fail(rank_of, [r for r in refs if r not in results])
        return [results[ref] for ref in refs]

    def _fail(self, rank_of: Mapping[Any, int], refs: Sequence[Any]) -> None:
        """Name the root cause: a rank that died makes its peers' collectives fail too, and
        their errors may arrive first; so wait a moment for every rank's outcome, then report the
        dead ranks before the ones that merely raised."""
        import ray

        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=FAILURE_GRACE_S)
        dead: list[int] = []
        raised: dict[int, BaseException] = {}
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                dead.append(rank_of[ref])
            except ray.exceptions.RayTaskError as exc:
                raised[rank_of[ref]] = exc
        self.shutdown()  # the others would wait forever in their next collective
        world = self.spec.world_size
        if dead:
            raise TrainingRankError(
                f"Training Unit rank {', '.join(map(str, sorted(dead)))} of {world} died (its process exited); "
                "the group was stopped. Check that rank's log (OOM, a crash in a native library)."
            )
        first = min(raised)
        cause = str(raised[first]).strip().splitlines()[-1] if str(raised[first]).strip() else ""
        raise TrainingRankError(
            f"Training Unit rank {first} of {world} failed; the group was stopped. Cause: {cause}"
        ) from raised[first]


class GroupedTrainingUnit:
    """A Ray actor standing for one Training Unit made of a :class:`TrainingGroup`.

    The driver and the CU hold its handle exactly as they would a one-process ``TrainingUnit``
    actor: same method names, rank 0's results. Killing it kills the rank actors it owns.
    """

    def __init__(self, spec: GroupSpec, factory: Callable[[], Any]) -> None:
        import uuid

        self._group = TrainingGroup(spec, factory)
        # One run id for every rank's SnapshotWriter: they publish each snapshot together.
        self._run_id = uuid.uuid4().hex[:16]

    def train_step(self, groups: Sequence[Any], records: Sequence[Any] = ()) -> dict[str, float]:
        result: dict[str, float] = self._group.call("train_step", groups, records)
        return result

    def enable_snapshots(self, root_dir: str, keep_last: int, **transport: Any) -> None:
        """``transport``: TrainingUnit.enable_snapshots' weight_transport keywords (the shared run
        id also names the ranks' SnapshotBoard in memory)."""
        self._group.call("enable_snapshots", root_dir, keep_last, run_id=self._run_id, **transport)

    def write_probe(self, folder: str) -> Any:
        return self._group.call("write_probe", folder)

    def drop_weight_channel(self, gu_id: int) -> None:
        self._group.call_all("drop_weight_channel", gu_id)

    def export_snapshot(self, version: int, *, notify: Any = None) -> float:
        """Every rank exports its shard; the last to finish publishes and notifies (once). The
        trainer is blocked for the slowest rank's copy."""
        return float(max(self._group.call_all("export_snapshot", version, notify=notify)))

    def finish_snapshots(self) -> dict[str, float]:
        per_rank: list[dict[str, float]] = self._group.call_all("finish_snapshots")
        return {k: sum(r[k] for r in per_rank) for k in per_rank[0]}

    def save_hf(self, path: str) -> None:
        self._group.call("save_hf", path)

    def inference_weights(self) -> Any:
        return self._group.call("inference_weights")

    def score_held_out(self, prompts: Sequence[Any], decoded: Any) -> dict[str, float]:
        result: dict[str, float] = self._group.call_rank0("score_held_out", prompts, decoded)
        return result

    def save_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        self._group.call("save_state", path, optimizer=optimizer, rng=rng)

    def load_state(self, path: str, *, optimizer: bool = True, rng: bool = True) -> None:
        self._group.call("load_state", path, optimizer=optimizer, rng=rng)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Any other Training Unit method, on every rank; rank 0's result."""
        return self._group.call(method, *args, **kwargs)

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Like :meth:`call`, every rank's result."""
        return self._group.call_all(method, *args, **kwargs)

    def rank_pids(self) -> list[int]:
        return self._group.rank_pids()

    def rank_env_reports(self, modules: tuple[str, ...]) -> list[Any]:
        """Each rank's own environment report (``utils.env_probe``), for summary.json."""
        return self._group.env_reports(modules)

    def shutdown(self) -> None:
        self._group.shutdown()


def collective_backend(device: str) -> Backend:
    """gloo on CPU, nccl on CUDA, hccl on Ascend."""
    backends: dict[str, Backend] = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}
    if device not in backends:
        raise ValueError(f"trainer device {device!r} has no collective backend; use cpu, cuda or npu")
    return backends[device]


def remote_training_unit(
    spec: TrainerSpec,
    policy_path: str,
    prompts: Any,
    *,
    rank_options: Sequence[Mapping[str, Any]],
    group_options: Mapping[str, Any],
    simulated_step_seconds: float | None = None,
) -> Any:
    """The Training Unit's Ray handle: one ``TrainingUnit`` actor for the torch engine, or a
    :class:`GroupedTrainingUnit` over ``spec.num_ranks`` ranks for a megatron layout.

    ``spec`` is the plan's ``TrainerSpec``; ``rank_options`` one Ray option dict per rank
    (``ray_setup.reserve(...).trainer_rank_options``); ``group_options`` the CPU-only grouping
    actor's. ``prompts``: the records by prompt id, or an ObjectRef of them.
    """
    import functools

    import ray

    from mindspeed_rl.workers.training_unit import TrainingUnit

    if len(rank_options) != spec.num_ranks:
        raise ValueError(f"{len(rank_options)} rank option sets for {spec.num_ranks} trainer ranks")
    if spec.megatron is None:
        return (
            ray.remote(TrainingUnit)
            .options(**rank_options[0])
            .remote(spec, policy_path, prompts, simulated_step_seconds=simulated_step_seconds)
        )
    group = GroupSpec(
        world_size=spec.num_ranks,
        backend=collective_backend(spec.engine.device),
        rank_options=tuple(rank_options),
    )
    if isinstance(prompts, ray.ObjectRef):  # a ref nested in the factory would reach ranks unresolved
        prompts = ray.get(prompts)
    factory = functools.partial(
        TrainingUnit, spec, policy_path, dict(prompts), simulated_step_seconds=simulated_step_seconds
    )
    return ray.remote(GroupedTrainingUnit).options(**group_options).remote(group, factory)
