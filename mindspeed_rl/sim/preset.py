"""A simulation preset: timing profile, cluster shape, workload, scheduler and runtime settings.

Loaded from YAML (``configs/sim/*.yaml``); every section is checked for unknown keys so a typo
fails loudly instead of silently falling back to a default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mindspeed_rl.runtime import RuntimeConfig
from mindspeed_rl.sim.conditions import DEFAULT_TAU, schedule_section
from mindspeed_rl.sim.simulator import ClusterShape
from mindspeed_rl.sim.timing import TimingProfile
from mindspeed_rl.sim.workload import SyntheticWorkload, Workload, load_trace

if TYPE_CHECKING:
    from asp_scheduler.params import ScheduleParams

_TOP_LEVEL = {
    "name",
    "description",
    "profile",
    "reference",
    "cluster",
    "workload",
    "schedule",
    "runtime",
    "seed",
}
_RUNTIME_KEYS = {f.name for f in fields(RuntimeConfig)} - {"num_samples_per_prompt"}


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSpec:
    path: str
    scale: float = 1.0
    group_by_prompt: bool = True
    length_field: str = "response_tokens"
    id_field: str = "prompt_id"
    num_prompts: int | None = None
    """Use only the first prompts of the trace (``None``: all)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReferenceTimings:
    """Measured means a profile was built from (the paper's App. D.5 for the shipped preset)."""

    t_gen_seconds: float | None = None
    """Mean generation time of one minibatch; with the profile's save/convert/load/train it
    gives Eq. 4's constant term."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimPreset:
    name: str
    profile: TimingProfile
    cluster: ClusterShape
    schedule: ScheduleParams
    runtime: Mapping[str, Any]
    """``RuntimeConfig`` fields except ``num_samples_per_prompt`` (taken from the workload)."""
    synthetic: SyntheticWorkload | None = None
    trace: TraceSpec | None = None
    reference: ReferenceTimings = ReferenceTimings()
    seed: int = 0
    description: str = ""
    tau: float = DEFAULT_TAU
    """Kendall τ of the noisy-oracle predictions every condition shares (``schedule.tau`` in YAML)."""

    def __post_init__(self) -> None:
        if (self.synthetic is None) == (self.trace is None):
            raise ValueError(
                f"preset {self.name!r}: give exactly one of workload.synthetic or workload.trace."
            )
        unknown = sorted(set(self.runtime) - _RUNTIME_KEYS)
        if unknown:
            raise ValueError(f"unknown runtime key(s) {unknown}; valid keys: {sorted(_RUNTIME_KEYS)}.")

    def load_workload(self) -> Workload:
        if self.trace is not None:
            t = self.trace
            workload = load_trace(
                t.path,
                length_field=t.length_field,
                id_field=t.id_field,
                scale=t.scale,
                group_by_prompt=t.group_by_prompt,
            )
            return workload if t.num_prompts is None else workload.head(t.num_prompts)
        assert self.synthetic is not None
        return self.synthetic.draw(self.seed)

    def runtime_config(self, num_samples_per_prompt: int) -> RuntimeConfig:
        return RuntimeConfig(num_samples_per_prompt=num_samples_per_prompt, **dict(self.runtime))

    def with_trace(self, trace: TraceSpec) -> SimPreset:
        return replace(self, trace=trace, synthetic=None)

    def with_schedule(self, **overrides: Any) -> SimPreset:
        """Override ``schedule:`` keys (``ScheduleParams`` fields and ``tau``) as in the YAML."""
        current = {f.name: getattr(self.schedule, f.name) for f in fields(self.schedule)}
        params, tau = schedule_section({**current, "tau": self.tau, **overrides})
        return replace(self, schedule=params, tau=tau)

    @classmethod
    def from_yaml(cls, path: str | Path) -> SimPreset:
        import yaml

        file = Path(path)
        if not file.is_file():
            raise ValueError(f"preset {path} does not exist; see configs/sim/ for the shipped presets.")
        data = yaml.safe_load(file.read_text())
        if not isinstance(data, Mapping):
            raise ValueError(f"preset {path} must be a YAML mapping with sections {sorted(_TOP_LEVEL)}.")
        return cls.from_mapping(data, name=file.stem)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, name: str = "preset") -> SimPreset:
        _reject_unknown("preset", data, _TOP_LEVEL)
        for section in ("profile", "cluster", "workload", "schedule", "runtime"):
            if section not in data:
                raise ValueError(f"preset {name!r} lacks the '{section}' section.")
        workload = dict(data["workload"])
        _reject_unknown("workload", workload, {"synthetic", "trace"})
        schedule, tau = schedule_section(data["schedule"])
        return cls(
            name=str(data.get("name", name)),
            description=str(data.get("description", "")),
            profile=TimingProfile.from_mapping(data["profile"]),
            cluster=_section(ClusterShape, "cluster", data["cluster"]),
            schedule=schedule,
            tau=tau,
            runtime=dict(data["runtime"]),
            synthetic=None
            if "synthetic" not in workload
            else SyntheticWorkload.from_mapping(workload["synthetic"]),
            trace=None
            if "trace" not in workload
            else _section(TraceSpec, "workload.trace", workload["trace"]),
            reference=_section(ReferenceTimings, "reference", data.get("reference", {})),
            seed=int(data.get("seed", 0)),
        )


def _reject_unknown(where: str, data: Mapping[str, Any], known: set[str]) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; valid keys: {sorted(known)}.")


def _section(cls: Any, where: str, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of field: value, got {type(data).__name__}.")
    _reject_unknown(where, data, {f.name for f in fields(cls)})
    return cls(**dict(data))
