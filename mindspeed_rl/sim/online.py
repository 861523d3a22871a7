"""C4 offline vs C4 online under length drift, over two epochs (``simulate.py --compare-online``).

Both runs start from the same C4 schedule: each epoch scheduled on the same step-0 noisy-oracle
predictions (epoch 2 after epoch 1, never mixed). Offline keeps it. Online feeds every generated
prompt's mean length to :class:`asp_scheduler.online.OnlinePredictor`, refits its calibration
every ``refit_interval`` trainer steps, and every ``replan_interval`` steps rebuilds the unsent
tail of each epoch (DP minibatches + SA batch groups) through the runtime's own
``replan_unsent``. Lengths come from :class:`mindspeed_rl.sim.drift.DriftModel` at the policy
version that generates them.

Group-load CV: a batch group's load is the sum of its minibatches' loads; measured = generated
tokens, predicted = the loads the plan balanced (``predicted_load`` at plan time). Drift makes
loads grow over the run, so a CV over all groups would mostly measure the trend; instead groups
(in dispatch order, full groups of ``k`` only) are cut into blocks of ``cv_block`` consecutive
groups, the CV is taken inside each block and averaged (``group_cv_mean``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from mindspeed_rl.runtime import ControlLoop, ScheduledMinibatch
from mindspeed_rl.runtime.replan import ReplanOutcome, TailPlan, replan_unsent
from mindspeed_rl.sim.drift import DriftModel, DriftParams, epoch_of, prompt_key, two_epochs
from mindspeed_rl.sim.preset import SimPreset
from mindspeed_rl.sim.simulator import Simulator
from mindspeed_rl.sim.workload import Workload

if TYPE_CHECKING:
    from asp_scheduler.online import OnlinePredictor
    from asp_scheduler.params import ScheduleParams


@dataclass(frozen=True, slots=True, kw_only=True)
class OnlineSettings:
    refit_interval: int = 1
    """Trainer steps between calibration refits."""
    replan_interval: int = 1
    """Trainer steps between re-plans of the unsent tail."""
    recency_window: int = 256
    """Latest (estimate, true) pairs per source each refit uses."""
    cv_block: int = 8
    """Consecutive batch groups per CV block (see the module docstring)."""


Estimator = Callable[[Sequence[str], float], np.ndarray]
"""Planning estimates of item ids at run progress t in [0, 1] (``--online-bound``)."""


class _Recorder:
    """The simulator's observer: measured loads always; feedback, refit, re-plan when online."""

    def __init__(
        self,
        predictor: OnlinePredictor | None,
        params: ScheduleParams,
        settings: OnlineSettings,
        *,
        estimator: Estimator | None = None,
    ) -> None:
        self.predictor, self.params, self.settings = predictor, params, settings
        self.estimator = estimator
        self.num_steps = 1
        """The run's trainer steps (set from the simulator): progress = steps done / this."""
        self._progress = 0.0
        self.generated: list[tuple[ScheduledMinibatch, float]] = []
        self.refits: list[dict[str, Any]] = []
        self.replans: list[ReplanOutcome] = []

    def on_generated(self, minibatch: ScheduledMinibatch, lengths: np.ndarray, now: float) -> None:
        self.generated.append((minibatch, float(lengths.sum())))
        if self.predictor is not None:
            for prompt, row in zip(minibatch.prompt_ids, lengths):
                self.predictor.observe(prompt_key(prompt), float(row.mean()))

    def on_train_step_done(self, step: int, loop: ControlLoop, now: float) -> None:
        if self.predictor is None:
            return
        done = step + 1
        self._progress = done / self.num_steps
        if done % self.settings.refit_interval == 0:
            reports = self.predictor.refit()
            self.refits.append({"step": step, "sources": [r.as_dict() for r in reports]})
        if done % self.settings.replan_interval == 0:
            self.replans.append(
                replan_unsent(loop.database, self._plan, segment_of=lambda mb: epoch_of(mb.prompt_ids[0]))
            )

    def _plan(self, prompt_ids: tuple[str, ...]) -> TailPlan:
        from asp_scheduler.online import replan

        assert self.predictor is not None
        if self.estimator is not None:
            estimates = self.estimator(prompt_ids, self._progress)
        else:
            estimates = self.predictor.estimates([prompt_key(p) for p in prompt_ids])
        plan = replan(estimates, self.params)
        return TailPlan(
            minibatches=tuple(tuple(int(i) for i in m) for m in plan.minibatches),
            batch_groups=tuple(int(g) for g in plan.batch_group_ids),
            loads=tuple(float(x) for x in plan.loads),
        )


def offline_two_epoch_schedule(
    workload: Workload, predictions: np.ndarray, params: ScheduleParams
) -> list[ScheduledMinibatch]:
    """C4 of each epoch on the same per-prompt predictions, epoch 2 numbered after epoch 1."""
    from asp_scheduler.schedule import build_schedule
    from mindspeed_rl.datasets.asp_schedule import scheduled_minibatches

    num_base = predictions.size
    out: list[ScheduledMinibatch] = []
    for epoch in range(2):
        ids = list(workload.prompt_ids[epoch * num_base : (epoch + 1) * num_base])
        built = scheduled_minibatches(build_schedule(predictions, params, item_ids=ids))
        offset_id, offset_group = len(out), (max(mb.batch_group_id for mb in out) + 1 if out else 0)
        out += [
            replace(
                mb,
                minibatch_id=mb.minibatch_id + offset_id,
                order_index=mb.order_index + offset_id,
                batch_group_id=mb.batch_group_id + offset_group,
            )
            for mb in built
        ]
    return out


def block_cv(generated: Sequence[tuple[ScheduledMinibatch, float]], k: int, block: int) -> dict[str, float]:
    """Mean in-block CV of full batch groups' measured and predicted loads (module docstring)."""
    return block_cv_of(
        [(mb.batch_group_id, mb.order_index, tokens, mb.predicted_load) for mb, tokens in generated], k, block
    )


def block_cv_of(rows: Sequence[tuple[int, int, float, float]], k: int, block: int) -> dict[str, float]:
    """``block_cv`` over (batch group, dispatch position, measured tokens, predicted load) rows."""
    groups: dict[int, list[tuple[int, float, float]]] = {}
    for group, order, tokens, predicted_load in rows:
        groups.setdefault(group, []).append((order, tokens, predicted_load))
    full = sorted((min(o for o, _, _ in g), g) for g in groups.values() if len(g) == k)
    measured = np.array([sum(t for _, t, _ in g) for _, g in full])
    predicted = np.array([sum(p for _, _, p in g) for _, g in full])

    def mean_cv(loads: np.ndarray) -> float:
        cvs = [
            float(chunk.std() / chunk.mean())
            for chunk in (loads[i : i + block] for i in range(0, loads.size, block))
            if chunk.size >= 2 and chunk.mean() > 0
        ]
        return float(np.mean(cvs)) if cvs else 0.0

    return {"measured": mean_cv(measured), "predicted": mean_cv(predicted), "num_groups": len(full)}


def run_condition(
    preset: SimPreset,
    base: Workload,
    *,
    drift: str,
    online: bool,
    seed: int,
    drift_params: DriftParams,
    settings: OnlineSettings,
    bound: bool = False,
) -> dict[str, Any]:
    """One (schedule, drift, seed) run; returns its row of the comparison. ``bound``: an online
    run that plans on ``DriftModel.informed_estimates`` instead of the online predictor's (a
    bound on what better estimates could reach, not a schedule a run can use)."""
    from asp_scheduler.online import OnlinePredictor
    from asp_scheduler.predictors.noisy_oracle import noisy_oracle_predictions

    params = replace(preset.schedule, seed=seed)
    workload = two_epochs(base, seed=seed, resample_sigma=drift_params.resample_sigma)
    oracle = noisy_oracle_predictions(base.prompt_lengths, preset.tau, seed)
    schedule = offline_two_epoch_schedule(workload, oracle.predictions, params)
    predictor = None
    if online:
        prior = dict(zip(base.prompt_ids, oracle.predictions.tolist()))
        predictor = OnlinePredictor(prior, window=settings.recency_window)
    length_model = DriftModel(drift, workload, drift_params, seed=seed)
    estimator: Estimator | None = None
    if bound:
        row_of = {item: row for row, item in enumerate(workload.prompt_ids)}

        def estimator(items: Sequence[str], progress: float) -> np.ndarray:
            return length_model.informed_estimates([row_of[i] for i in items], progress)

    recorder = _Recorder(predictor, params, settings, estimator=estimator)
    sim = Simulator(
        runtime=preset.runtime_config(workload.num_samples_per_prompt),
        cluster=preset.cluster,
        profile=preset.profile,
        workload=workload,
        schedule=schedule,
        seed=seed,
        label=f"C4 {'online' if online else 'offline'} {drift}",
        length_model=length_model,
        observer=recorder,
    )
    recorder.num_steps = sim.num_steps
    result = sim.run()
    cv = block_cv(recorder.generated, params.k, settings.cv_block)
    by_epoch = [
        block_cv(
            [g for g in recorder.generated if epoch_of(g[0].prompt_ids[0]) == e], params.k, settings.cv_block
        )
        for e in range(2)
    ]
    walls = [r.wall_seconds for r in recorder.replans if r.num_prompts]
    row: dict[str, Any] = {
        "schedule": "bound" if bound else "online" if online else "offline",
        "drift": drift,
        "seed": seed,
        "group_cv_mean": cv["measured"],
        "group_cv_predicted_mean": cv["predicted"],
        "group_cv_by_epoch": [c["measured"] for c in by_epoch],
        "num_full_groups": cv["num_groups"],
        "iteration_s_mean": result.table4b.mean_iteration_seconds,
        "num_iterations": result.table4b.num_iterations,
        "prompts_consumed": result.summary.prompts_consumed,
        "oracle_tau": oracle.measured_tau,
        "schedule_replans": len(walls),
    }
    if online:
        row["replan_wall_s_mean"] = float(np.mean(walls)) if walls else 0.0
        row["replan_wall_s_max"] = float(np.max(walls)) if walls else 0.0
        row["replan_prompts_mean"] = float(
            np.mean([r.num_prompts for r in recorder.replans if r.num_prompts])
        )
        row["last_refit"] = recorder.refits[-1] if recorder.refits else None
    return row


def compare_online(
    preset: SimPreset,
    base: Workload,
    drifts: Sequence[str],
    seeds: Sequence[int],
    *,
    drift_params: DriftParams | None = None,
    settings: OnlineSettings | None = None,
    with_bound: bool = False,
) -> dict[str, Any]:
    """Every (schedule, drift, seed) of the comparison, drift ``none`` always included;
    ``with_bound`` adds a ``bound`` run per (drift, seed) (see ``run_condition``)."""
    params, cfg = drift_params or DriftParams(), settings or OnlineSettings()
    names = ["none"] + [d for d in drifts if d != "none"]
    runs = [(False, False), (True, False)] + ([(True, True)] if with_bound else [])
    conditions = [
        run_condition(
            preset, base, drift=d, online=online, seed=s, drift_params=params, settings=cfg, bound=bound
        )
        for d in names
        for s in seeds
        for online, bound in runs
    ]
    return {
        "preset": preset.name,
        "workload": base.source,
        "epochs": 2,
        "drift_model": {"parameters": params.as_dict(), "doc": "mindspeed_rl/sim/drift.py"},
        "online": {
            "refit_interval": cfg.refit_interval,
            "replan_interval": cfg.replan_interval,
            "recency_window": cfg.recency_window,
            "cv_block_groups": cfg.cv_block,
        },
        "conditions": conditions,
        "aggregate": aggregate(conditions),
    }


def aggregate(conditions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds per (drift, schedule), with the online/offline ratios."""
    out = []
    for drift in dict.fromkeys(c["drift"] for c in conditions):
        means = {}
        for schedule in ("offline", "online", "bound"):
            rows = [c for c in conditions if c["drift"] == drift and c["schedule"] == schedule]
            if not rows:
                continue
            means[schedule] = {
                key: float(np.mean([r[key] for r in rows]))
                for key in ("group_cv_mean", "group_cv_predicted_mean", "iteration_s_mean")
            }
            if all("group_cv_by_epoch" in r for r in rows):  # the simulator's rows (replay's lack them)
                for e in range(2):
                    means[schedule][f"group_cv_epoch{e}"] = float(
                        np.mean([r["group_cv_by_epoch"][e] for r in rows])
                    )
        off = means["offline"]
        row: dict[str, Any] = {"drift": drift} | means
        for schedule in ("online", "bound"):
            if schedule not in means:
                continue
            prefix = "" if schedule == "online" else "bound_"
            row[prefix + "group_cv_ratio"] = (
                means[schedule]["group_cv_mean"] / off["group_cv_mean"] if off["group_cv_mean"] else None
            )
            row[prefix + "iteration_ratio"] = means[schedule]["iteration_s_mean"] / off["iteration_s_mean"]
        out.append(row)
    return out
