"""``mindspeed_rl.tools.retool.ReTool``: the class path upstream's retool_config.yaml names.

Behaves as upstream's ReTool (MindSpeed-RL master, commit 88bc30d): the code may come wrapped in a
```python fence (the first fenced block is run), and a last line that is not a ``print`` is
printed, so a bare expression answers like a notebook cell (only an expression: a last line
such as ``raise ...`` or an assignment runs as written).
"""

from __future__ import annotations

import ast
import re

from mindspeed_rl.tools.code_tool import CodeInterpreterTool

_FENCE = re.compile(r"```python(.*?)```", re.DOTALL)


class ReTool(CodeInterpreterTool):
    def prepare(self, code: str) -> str:
        fenced = _FENCE.findall(code)
        if fenced:
            code = fenced[0].strip()
        lines = code.split("\n")
        for i in range(len(lines) - 1, -1, -1):
            if not lines[i].strip():
                continue
            # Only a top-level expression is wrapped (upstream wraps any last line not starting
            # with "print", which turns `raise X` or `x = 1` into a SyntaxError).
            if not lines[i].startswith(("print", " ", "\t")) and _is_expression(lines[i]):
                lines[i] = f"print({lines[i]})"
            break
        return "\n".join(lines)


def _is_expression(line: str) -> bool:
    try:
        ast.parse(line, mode="eval")
    except SyntaxError:
        return False
    return True
