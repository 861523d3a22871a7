"""``AsyncCluster``: the Ray actors of one async run behind plain calls, so the trainer reads as a schedule.

::

    AsyncCluster.start(run, inputs, faults)
                             ─► ControlUnit (schedule, Training Queue)  ─┐
                             ─► TrainingUnit (reward, log-probs, update)  │ engines up, then
                             ─► GenerationUnit 0..G-1 (+ their actors) ───┘ cu.start, gu.run
    wait_for_batch(step)     ─► CU long-poll; raises the CU's PipelineFailure (poison, stall, no GU)
    (watcher thread)         ─► a GU's run() ended ─► CU.on_gu_failed at once, even mid-step
    train(batch)             ─► TU.train_step
    export_snapshot(v)       ─► TU copies the weights; its writer thread publishes to the CU
    extend_schedule(chunk)   ─► CU: a streaming run's next prompts and their schedule
    step_done(step)          ─► CU: lag accounting, per-step pipeline digest
    submit_eval / eval_result ─► CU ─► one GU's actor decodes held-out prompts; TU scores them
    close(run_dir)           ─► stop GUs, summary.json + events.jsonl + final_model, kill actors

Every Ray detail of the async pipeline lives here; ``grpo_trainer_async`` only calls these.
A trace replay hands in ``PipelineInputs`` built in ``cli/``; production builds them from the
run's split (``async_inputs.run_inputs``). Each Generation Unit gets a ``GuSpec`` (``gu_specs``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.trainer import oversampling
from mindspeed_rl.utils.run_summary import write_summary

if TYPE_CHECKING:
    from collections.abc import Mapping

    from mindspeed_rl.contracts import TrainerSpec
    from mindspeed_rl.plan.build import RunPlan
    from mindspeed_rl.plan.sections import AsyncSpec
    from mindspeed_rl.runtime.records import GlobalBatch, ScheduledMinibatch
    from mindspeed_rl.trainer.async_inputs import PipelineInputs
    from mindspeed_rl.trainer.prompt_window import WindowChunk
    from mindspeed_rl.trainer.startup import RunStart
    from mindspeed_rl.utils.ray_setup import ReservedPlacement
    from mindspeed_rl.workers.evaluator import EvalRequest
    from mindspeed_rl.workers.fault_plan import FaultPlan
    from mindspeed_rl.workers.forced_lengths import LengthPlan
    from mindspeed_rl.workers.generation_unit import GuSpec

logger = logging.getLogger(__name__)
# Longest one wait in the CU before the driver asks again: only a safety net, the CU answers as
# soon as the batch is ready or the run has failed (dead GUs are reaped by the watcher thread).
WAIT_SECONDS = 30.0


class AsyncCluster:
    """The CU, the TU and the GUs of one run; ``start`` blocks until every engine is up."""

    def __init__(
        self, cu: Any, tu: Any, gus: dict[int, Any], reserved: ReservedPlacement | None = None
    ) -> None:
        self.cu, self.tu, self.gus = cu, tu, gus
        self.reserved = reserved
        self._runs: dict[Any, int] = {}
        self._failed: set[int] = set()  # GUs declared failed (dead or ended early)
        self.trainer: TrainerSpec | None = None
        self._closing = False  # set by close: GU runs ending from then on are not failures
        self._started = 0.0
        self._evaluations = 0
        self._delta_on = False  # weight_delta auto / on: summary.json sums the GUs' delta totals
        self.env_reports: dict[str, Any] = {}
        """Each process's interpreter and loaded engine stacks (``role_processes``), for summary.json."""

    @property
    def failed_gus(self) -> frozenset[int]:
        return frozenset(self._failed)

    @classmethod
    def start(cls, run: RunStart, inputs: PipelineInputs, faults: FaultPlan) -> AsyncCluster:
        """On a GPU/NPU run one placement group (``run.placement``) pins every bundle to its node.
        The generation actors start from ``run.rollout_path`` (a resumed run: the checkpoint's).
        If any part fails to come up, every actor started so far is killed before the error."""
        import ray

        from mindspeed_rl.utils.ray_setup import reserve
        from mindspeed_rl.utils.role_envs import role_options, role_runtime_env
        from mindspeed_rl.workers.generation_unit import GenerationUnit

        plan = run.plan
        assert plan.async_spec is not None and plan.runtime is not None, "an async plan carries both"
        rollout_env = role_runtime_env(plan.async_spec.role_envs, "rollout")
        reserved = reserve(run.placement)
        prompts = ray.put({r.prompt_id: r for r in inputs.prompts})
        snapshots = snapshot_root(plan.async_spec.snapshot_dir, run.run_dir)
        cu = _control_unit(run, inputs)
        cluster = cls(cu, None, {}, reserved)
        try:
            if inputs.window is not None:
                ray.get(cu.extend_schedule.remote(inputs.schedule, inputs.prompts, inputs.window.closed))
            cluster.tu = _training_unit(run, inputs, prompts, reserved)
            cluster.trainer = plan.trainer
            specs = gu_specs(
                plan,
                run.rollout_path,
                prompts,
                snapshots,
                faults,
                forced_lengths=inputs.forced_lengths,
                reserved=reserved,
                runtime_env=rollout_env,
            )
            # A GU converts snapshots (torch) and starts its actors: it lives in the rollout's environment.
            gu_remote: Any = ray.remote(GenerationUnit)
            cluster.gus = {
                s.gu_id: gu_remote.options(
                    **role_options(rollout_env, _gu_options(plan, reserved, s.gu_id)), max_concurrency=4
                ).remote(s, cu)
                for s in specs
            }
            cluster._bring_up(plan.async_spec, snapshots)
        except BaseException:
            cluster.kill()
            raise
        return cluster

    def _bring_up(self, a: AsyncSpec, snapshots: Path) -> None:
        """The weight flow, then every engine, then the first dispatch and the GUs' loops."""
        import ray

        from mindspeed_rl.trainer.role_processes import check_live, live_reports
        from mindspeed_rl.trainer.weight_channels import start_weight_flow

        assert self.trainer is not None
        # Engine start-up is not part of any iteration's time (as in the hybrid loop).
        logger.info(
            "starting %d generation unit(s) x %d actor(s) and the trainer: each engine loads its "
            "model and warms up first (about a minute per vLLM engine on a laptop CPU)",
            len(self.gus), a.actors_per_unit,
        )  # fmt: skip
        # The engines start loading now, while the trainer builds its model and the checks below
        # run: the two start-ups overlap instead of following one another (on this 2-core host a
        # vLLM actor's import and warm-up took about 10 s after the trainer's 8 s). No weight
        # moves before the checks: the actors load the rollout folder, not a snapshot.
        ray.get([g.launch_actors.remote() for g in self.gus.values()])
        # Each process as it reports itself; with role envs, the trainer's and every GU's snapshot
        # format must agree before any weight moves (the driver checked its own node's copies).
        self.env_reports = live_reports(self, actors=False)  # summary.json's are taken at close
        if a.role_envs is not None:
            check_live(self.env_reports, a.role_envs)
        # The shared-path probe and (collective) the GUs' process groups, before any refresh.
        weights = start_weight_flow(self.tu, self.gus, a, self.trainer, snapshots)
        self._delta_on = a.weight_delta is not None
        ray.get(
            [
                self.tu.enable_snapshots.remote(str(snapshots / "trainer"), a.snapshot_keep, **weights),
                *[g.start_actors.remote() for g in self.gus.values()],
            ]
        )
        ray.get(self.cu.start.remote())
        self._runs = {gu.run.remote(): gu_id for gu_id, gu in self.gus.items()}
        threading.Thread(target=self._watch_gus, name="gu-watcher", daemon=True).start()
        self._started = time.perf_counter()

    # ---- one iteration ---------------------------------------------------------------------------
    def wait_for_batch(self, step: int) -> GlobalBatch:
        import ray

        from mindspeed_rl.runtime.faults import PipelineFailure

        while True:
            try:
                batch = ray.get(self.cu.wait_global_batch.remote(step, WAIT_SECONDS))
            except ray.exceptions.RayTaskError as err:
                if not isinstance(err.cause, PipelineFailure):
                    raise
                self.kill()  # the run cannot go on: free the engines before the error ends it
                raise err.cause from None
            if batch is not None:
                return batch

    def train(self, batch: GlobalBatch) -> dict[str, float]:
        import ray

        stats: dict[str, float] = ray.get(self.tu.train_step.remote(batch.prompts, batch.records))
        return stats

    def extend_schedule(self, chunk: WindowChunk) -> None:
        """A streaming run's next chunk of prompts and their schedule, to the CU."""
        import ray

        ray.get(self.cu.extend_schedule.remote(chunk.minibatches, chunk.records, chunk.last))

    def export_snapshot(self, version: int) -> float:
        """Start exporting the weights as ``version``; returns the seconds the trainer was blocked."""
        import ray

        seconds: float = ray.get(self.tu.export_snapshot.remote(version, notify=self.cu))
        return seconds

    def current_schedule(self) -> tuple[ScheduledMinibatch, ...]:
        """The CU's schedule as it stands (online ASP re-plans it), for a checkpoint."""
        import ray

        schedule: tuple[ScheduledMinibatch, ...] = ray.get(self.cu.schedule_now.remote())
        return schedule

    def step_done(self, step: int) -> dict[str, float]:
        """Tell the CU the step is trained; returns its pipeline digest since the last step."""
        import ray

        digest: dict[str, float] = ray.get(self.cu.on_train_step_done.remote(step))
        return digest

    def submit_eval(self, request: EvalRequest, version: int) -> int:
        """Hand the CU an evaluation of snapshot ``version`` (or newer); returns its job id. Submit
        before waiting for the step's batch: the CU keeps the GUs running while a job waits, and
        once the run's last batch is popped a GU told the run is over stops."""
        import ray

        job = request.job(self._evaluations, min_version=version)
        self._evaluations += 1
        ray.get(self.cu.submit_eval.remote(job))
        return job.job_id

    def eval_result(self, request: EvalRequest, job_id: int) -> dict[str, float]:
        """Wait for the decode of ``job_id``, then score it on the Training Unit."""
        import ray

        start = time.perf_counter()
        while True:
            try:
                decoded = ray.get(self.cu.wait_eval.remote(job_id, WAIT_SECONDS))
            except ray.exceptions.RayTaskError as err:
                # The run cannot go on (PipelineFailure) or the evaluation cannot be decoded: free
                # the engines before the error ends it.
                self.kill()
                raise err.cause if err.cause is not None else err from None
            if decoded is not None:
                break
        metrics: dict[str, float] = ray.get(self.tu.score_held_out.remote(request.prompts, decoded))
        return {**metrics, "time/eval_s": time.perf_counter() - start}

    def save(self, path: Path) -> None:
        import ray

        ray.get(self.tu.save_hf.remote(str(path)))

    # ---- teardown --------------------------------------------------------------------------------
    def close(self, run_dir: Path) -> None:
        """Stop generation, write summary.json, events.jsonl and the final model, kill the actors."""
        import ray

        self._closing = True
        pipeline_seconds = time.perf_counter() - self._started
        control_cpu = self._control_plane_cpu(pipeline_seconds)
        processes = self._processes_at_close()  # while the generation actors are still up
        delta = self._delta_totals()
        self._stop_gus()
        summary: dict[str, Any] = {**ray.get(self.cu.summary.remote()), **control_cpu}
        # Per completed minibatch: the control plane's cost per unit of work, whatever the run length.
        summary["control_cpu_ms_per_minibatch"] = (
            1000.0 * (control_cpu["cu_cpu_seconds"] + control_cpu["gu_control_cpu_seconds"])
            / max(1, summary["minibatches_completed"])
        )  # fmt: skip
        ray.get(self.cu.close_events.remote())  # events.jsonl was streamed; this writes the tail
        summary.update(ray.get(self.tu.finish_snapshots.remote()))
        summary.update(delta)  # the GUs' apply seconds and resends over the TU's zeros
        summary["training_layout"] = training_layout_summary(self.trainer)
        summary["processes"] = processes
        self.save(run_dir / "final_model")
        write_summary(
            run_dir, pipeline="async", queue_limit_samples=summary.pop("queue_limit_samples"), **summary
        )
        self.kill()

    def _delta_totals(self) -> dict[str, float]:
        """``weight_delta`` auto / on: the live GUs' apply seconds and full resends, summed (the TU's
        exporter reports the bytes, the changed fraction and the encode seconds)."""
        import ray

        if not self._delta_on:
            return {}
        live = [gu for g, gu in self.gus.items() if g not in self.failed_gus]
        totals = {"delta_apply_seconds": 0.0, "delta_resends": 0.0}
        for stats in ray.get([gu.delta_stats.remote() for gu in live]):
            for key in totals:
                totals[key] += stats.get(key, 0.0)
        return totals

    def _processes_at_close(self) -> dict[str, Any]:
        """The processes' reports now that every engine has loaded (the start's, where one is gone)."""
        from mindspeed_rl.trainer.role_processes import live_reports

        try:
            return live_reports(self)
        except Exception:  # a report must not fail a finished run
            logger.warning("could not collect the processes' environment reports at close", exc_info=True)
            return self.env_reports

    def kill(self) -> None:
        import ray

        self._closing = True
        for handle in (self.cu, self.tu, *self.gus.values()):
            if handle is not None:  # a start that failed half-way
                ray.kill(handle)
        if self.reserved is not None:
            self.reserved.release()

    def _watch_gus(self) -> None:
        """Driver thread: the moment a GU's control loop ends (crash, no actors left) before
        ``close``, declare it failed so the CU re-issues its work; the CU fails the driver's wait
        once no GU is left. Blocks in ``ray.wait``: no polling."""
        import ray

        while self._runs and not self._closing:
            done, _ = ray.wait(list(self._runs), num_returns=1)
            if self._closing:
                return
            for ref in done:
                gu_id = self._runs.pop(ref)
                try:
                    counts = ray.get(ref)
                    # Every scheduled prompt consumed: the GU's loop ends by design before close.
                    if ray.get(self.cu.is_finished.remote()):
                        logger.info("GU %d finished: %s", gu_id, counts)
                        self.cu.on_gu_stopped.remote(gu_id)
                        continue
                    logger.warning("GU %d stopped early: %s", gu_id, counts)
                except ray.exceptions.RayActorError:
                    logger.error("GU %d died", gu_id)
                except ray.exceptions.RayTaskError:
                    logger.exception("GU %d failed", gu_id)
                self._failed.add(gu_id)
                ray.get(self.cu.on_gu_failed.remote(gu_id))
                self.tu.drop_weight_channel.remote(gu_id)  # collective: stop sending it refreshes

    def _control_plane_cpu(self, seconds: float) -> dict[str, Any]:
        """CPU the CU and the live GU control loops used: cores the engines and the trainer did not get,
        with the GUs' call counts (the CU's are in its summary) as the breakdown."""
        import ray

        cu_s = ray.get(self.cu.cpu_seconds.remote())
        # Finished GUs count too (their loops end once every prompt is consumed); failed ones
        # cannot answer.
        live = [gu for g, gu in self.gus.items() if g not in self._failed]
        gu_s = sum(ray.get([gu.cpu_seconds.remote() for gu in live]))
        gu_calls: dict[str, int] = {}
        for counts in ray.get([gu.call_counts.remote() for gu in live]):
            for name, n in counts.items():
                gu_calls[name] = gu_calls.get(name, 0) + n
        return {
            "pipeline_seconds": seconds,
            "cu_cpu_seconds": cu_s,
            "gu_control_cpu_seconds": gu_s,
            "control_plane_cores": (cu_s + gu_s) / seconds,
            "gu_calls": dict(sorted(gu_calls.items())),
        }

    def _stop_gus(self) -> None:
        import ray

        for gu in self.gus.values():
            gu.stop.remote()
        ray.wait(list(self._runs), num_returns=len(self._runs), timeout=60)
        ray.get([gu.shutdown.remote() for g, gu in self.gus.items() if g not in self._failed])


def training_layout_summary(trainer: TrainerSpec | None) -> dict[str, int]:
    """The trainer's parallel layout for summary.json (a simulated trainer: one rank)."""
    return {"tp": 1, "pp": 1, "ep": 1, "dp": 1} if trainer is None else trainer.layout_summary()


def _control_options(plan: RunPlan) -> dict[str, Any]:
    """Ray options of the CPU-only control processes (the CU, the GUs, the TU's group driver)."""
    from mindspeed_rl.utils.ray_setup import ray_actor_options

    assert plan.async_spec is not None
    return ray_actor_options(plan.async_spec.control_resources)


def _gu_options(plan: RunPlan, reserved: ReservedPlacement, gu_id: int) -> dict[str, Any]:
    """A GU's Ray options: a control process's, or, when its weights channel is NCCL / HCCL (it
    receives on its first generation actor's device), a place in that actor's bundle."""
    a = plan.async_spec
    assert a is not None
    from mindspeed_rl.weights.transports import transport_for

    if not transport_for(a.weight_transport).opens_channels or a.collective_backend == "gloo":
        return _control_options(plan)
    return reserved.beside_generation_actor(gu_id * a.actors_per_unit, a.control_resources)


def _control_unit(run: RunStart, inputs: PipelineInputs) -> Any:
    """The CU actor; a streaming run's schedule then arrives chunk by chunk (``extend_schedule``)."""
    import ray

    from mindspeed_rl.trainer.online_asp import online_hook
    from mindspeed_rl.workers.control_unit import ControlUnit

    plan, streaming, sampling = run.plan, inputs.window is not None, run.plan.dynamic_sampling
    assert plan.runtime is not None
    return (
        ray.remote(ControlUnit)
        .options(**_control_options(plan), max_concurrency=32)
        .remote(
            plan.runtime,
            () if streaming else inputs.schedule,
            str(run.run_dir / "events.jsonl"),
            group_filter=None if sampling is None else oversampling.group_filter(sampling),
            steps_total=plan.data.train_iters - (run.resumed.iteration if run.resumed else 0),
            online=online_hook(plan.asp, inputs.schedule, run.run_dir, prior=inputs.predictions),
            streaming=streaming,
        )
    )


def _training_unit(run: RunStart, inputs: PipelineInputs, prompts: Any, reserved: ReservedPlacement) -> Any:
    """The TU: one rank per trainer device, each pinned to its bundle of the placement; its ranks
    and their group's driver in the trainer's environment."""
    from mindspeed_rl.utils.role_envs import role_options, role_runtime_env
    from mindspeed_rl.workers.training_group import remote_training_unit

    plan = run.plan
    assert plan.async_spec is not None
    env = role_runtime_env(plan.async_spec.role_envs, "trainer")
    return remote_training_unit(
        plan.trainer,
        run.policy_path,
        prompts,
        rank_options=[
            role_options(env, reserved.trainer_rank_options(r, plan.trainer_resources))
            for r in range(plan.trainer.num_ranks)
        ],
        group_options=role_options(env, _control_options(plan)),
        simulated_step_seconds=inputs.simulated_step_seconds,
    )


def snapshot_root(snapshot_dir: str | None, run_dir: Path) -> Path:
    """This run's snapshot folder: ``<snapshot_dir>/<run dir name>/``, or ``<run_dir>/snapshots``.

    A configured ``snapshot_dir`` is reused run after run (``./snapshots`` in the cluster YAMLs),
    so each run gets its own subfolder (the run dir name is unique: timestamp + config name);
    see ``weights/store.py`` for why a subfolder rather than refusing the folder.
    """
    from mindspeed_rl.weights.store import run_root

    return run_root(Path(snapshot_dir), run_dir.name) if snapshot_dir else run_dir / "snapshots"


def gu_specs(
    plan: RunPlan,
    policy_path: str,
    prompts: Any,
    snapshots: Path,
    faults: FaultPlan,
    *,
    forced_lengths: Mapping[str, tuple[int, ...]] | LengthPlan | None = None,
    reserved: ReservedPlacement | None = None,
    runtime_env: Mapping[str, Any] | None = None,
) -> list[GuSpec]:
    """One spec per Generation Unit; ``prompts`` is the prompt mapping or a Ray reference to it.
    ``reserved`` (the run's placement) gives each actor its own options (its bundle);
    ``runtime_env`` is the rollout role's environment (``role_processes.role_runtime_env``)."""
    from mindspeed_rl.utils.ray_setup import ray_actor_options
    from mindspeed_rl.utils.role_envs import role_options
    from mindspeed_rl.workers.generation_unit import GuSpec

    a = plan.async_spec
    assert a is not None, "an async plan carries async_spec"
    return [
        GuSpec(
            gu_id=g,
            rollout=plan.rollout,
            policy_path=policy_path,
            prompts=prompts,
            num_actors=a.actors_per_unit,
            actor_options=role_options(runtime_env, ray_actor_options(a.actor_resources)),
            per_actor_options=()
            if reserved is None
            else tuple(
                role_options(
                    runtime_env,
                    reserved.generation_actor_options(g * a.actors_per_unit + i, a.actor_resources),
                )
                for i in range(a.actors_per_unit)
            ),
            actor_num_cpus=a.actor_resources.num_cpus,
            cache_dir=str(snapshots / f"gu{g}"),
            seed=plan.rollout.seed,
            faults=faults,
            forced_lengths=forced_lengths,
            weight_transport=a.weight_transport,
            weight_delta=a.weight_delta,
        )
        for g in range(a.num_generation_units)
    ]
