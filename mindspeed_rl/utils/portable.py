"""Which modules a record's pickle needs: whether it may cross between two roles' environments.

Role environments (``async_config.role_envs``) hold different torch, numpy, transformers and
vLLM. A pickle names the module of every class it rebuilds, and loads only where that module
exists and means the same: a torch tensor needs torch, a vLLM output vLLM, and numpy's own
pickles are not portable across its 2.0 rename (measured here: an array pickled by numpy 2.3
fails in numpy 1.26.0 with ``No module named 'numpy._core'``; the other way loads, with a
DeprecationWarning). So the records the roles exchange through the Control Unit hold builtins and
this project's own records only; ``foreign_modules`` lists anything else a record's pickle needs
(``tests/mindspeed_rl/workers/test_role_boundary.py`` runs it over records the real workers make).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

PORTABLE = ("builtins", "copyreg", "collections", "enum", "mindspeed_rl")
"""Modules every role's environment has, alike: the standard library's containers and this
project (one version in both environments, checked at start-up: ``utils.role_env_check``)."""


class _Recorder(pickle.Unpickler):
    def __init__(self, data: bytes, buffers: list[pickle.PickleBuffer]) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.modules: set[str] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.modules.add(module)
        return super().find_class(module, name)


def modules_needed(obj: Any) -> set[str]:
    """Every module ``obj``'s pickle (protocol 5, as Ray's) imports to load it."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    recorder = _Recorder(data, buffers)
    recorder.load()
    return recorder.modules


def foreign_modules(obj: Any, allowed: tuple[str, ...] = PORTABLE) -> set[str]:
    """The modules ``obj``'s pickle needs beyond ``allowed`` (packages and their submodules)."""
    return {m for m in modules_needed(obj) if not any(m == a or m.startswith(f"{a}.") for a in allowed)}
