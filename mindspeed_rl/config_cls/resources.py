"""Ray resource requests, always taken from config (never hard-coded in ``@ray.remote``)."""

from __future__ import annotations

from dataclasses import dataclass

from mindspeed_rl.config_cls.fields import opt


@dataclass(frozen=True, slots=True, kw_only=True)
class ActorResources:
    """What ONE Ray actor asks for. Fractions are allowed and expected on small machines: on a
    2-core host, actors asking for whole CPUs queue forever once two are placed."""

    num_cpus: float = opt(0.25, "CPUs per actor (fractional is fine; Ray only does accounting).")
    num_gpus: float = opt(0.0, "GPUs per actor.")
    num_npus: float = opt(
        0.0,
        "Ascend NPUs per actor (Ray custom resource 'NPU'). In rl_config.*_resource, upstream's "
        "meaning: NPUs of the whole worker group, one rank per NPU.",
    )
