"""Discrete-event simulator of the asynchronous pipeline, driving the real ``runtime.ControlLoop``.

Modules (import what you need; nothing here imports torch, vLLM or Ray):

* ``timing``      decode / train / weight-flow duration models (``TimingProfile``)
* ``workload``    per-prompt response lengths from a JSONL trace or a synthetic draw
* ``conditions``  C0–C4 dispatch orders built with ``asp_scheduler`` and the noisy oracle
* ``simulator``   the event loop (``Simulator``, ``ClusterShape``) and ``result`` (``SimResult``)
* ``table4b``     the paper's Table 4b columns from a ControlLoop ``EventLog`` (shared with replay)
* ``preset``, ``runner``  YAML presets (``configs/sim/``) and running C0–C4 on one
* ``planner``, ``plan_check``  the App. B.6 TU/GU allocation heuristic and its simulated check
* ``scaling``     iteration time against the number of GUs (Fig. 2)
* ``fit``, ``measure``  calibrating the decode model: ``python -m mindspeed_rl.sim fit-decode``
"""
