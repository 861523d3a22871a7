"""Test-only tools and parser for the multi-turn fault run (tests/.../test_multi_turn_faults_e2e.py).

Named in a tool YAML and ``rl_config.tool_parser_format`` like any other tool and parser, so the
run under test is a real CLI run with real generation actors; nothing in the framework imports
this module. The parser makes every turn a call (a random-init model calls as often as a trained
one), and the tool injects, each once per run (a marker file decides which process fires it):

* ``hang_at``: the N-th call of a process never answers (the agent loop's call timeout must
  answer it and let the trajectory go on);
* ``crash_server_at``: the N-th call sends code that kills the sandbox server running it (every
  later call gets a sandbox error response);
* ``exit_actor_at``: the N-th call ends the generation actor's process mid-trajectory (its GU
  must replace it and re-issue the minibatch).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mindspeed_rl.tools.base import ToolResult
from mindspeed_rl.tools.parsers import ParsedCall, ToolCall
from mindspeed_rl.tools.retool import ReTool

_FAULT_KEYS = ("marker_dir", "hang_at", "crash_server_at", "exit_actor_at")
# Kills the process that started the sandboxed code: the sandbox server (the code runs as its child).
CRASH_SERVER_CODE = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
# Bounded, so an abandoned thread cannot keep a finished process alive for ever.
HANG_SECONDS = 600.0


class CallEveryTurn:
    """Every turn calls the ``python`` tool once, whatever the model wrote."""

    close_marker = "</tool_call>"

    def parse(self, text: str) -> list[ParsedCall]:
        del text
        return [ToolCall(name="python", arguments={"code": "print(6 * 7)"})]


class FaultyCodeTool(ReTool):
    def __init__(self, config: Mapping[str, Any], tool_schema: Mapping[str, Any]) -> None:
        own = {k: config[k] for k in _FAULT_KEYS if k in config}
        super().__init__({k: v for k, v in config.items() if k not in _FAULT_KEYS}, tool_schema)
        self._markers = Path(str(own.get("marker_dir", ".")))
        self._at = {k: int(own[k]) for k in _FAULT_KEYS[1:] if k in own}
        self._calls = 0
        self._lock = threading.Lock()

    def _fires(self, fault: str, call: int) -> bool:
        """True once per run: for the first process whose ``call`` is the fault's number."""
        if self._at.get(fault) != call:
            return False
        try:
            os.close(os.open(self._markers / fault, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def execute(self, arguments: Mapping[str, Any]) -> ToolResult:
        with self._lock:
            self._calls += 1
            call = self._calls
        if self._fires("exit_actor_at", call):
            os._exit(1)  # the actor dies between two turns of a trajectory
        if self._fires("hang_at", call):
            threading.Event().wait(HANG_SECONDS)
        if self._fires("crash_server_at", call):
            return super().execute({"code": CRASH_SERVER_CODE})
        return super().execute(arguments)
