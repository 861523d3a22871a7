"""``demo_exact``: 1 when a demo-task response is exactly the answer, else 0.

The demo's own ``demo`` reward gives partial credit, so a group's rewards almost always differ; DAPO's
dynamic sampling needs a pass/fail signal whose spread is zero for groups the policy has fully
solved or fully failed. Give it weight 0 in ``verifier_weight`` to filter on it without changing
the reward (``configs/dapo_tiny_asp.yaml``).
"""

from __future__ import annotations


def demo_exact(response: str, answer: str) -> float:
    from mindspeed_rl.datasets.demo_task import clean_response

    return 1.0 if clean_response(response) == answer else 0.0
