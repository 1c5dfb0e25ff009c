"""Start-up work a restart must not wait for: torch._dynamo's import (fresh interpreters here)."""

from __future__ import annotations

import subprocess
import sys

DEFER = '''
import sys, torch
from slurmkit.worker import startup
assert startup.defer_dynamo_import() > 0
model = torch.nn.Linear(4, 4)
opt = torch.optim.AdamW(model.parameters())
opt.zero_grad()
opt.load_state_dict(opt.state_dict())
assert "torch._dynamo" not in sys.modules, "optimizer set-up imported torch._dynamo"
compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]
opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(1))]})
handed = torch.optim.Optimizer.add_param_group.__wrapped__.__dynamo_disable
assert "_shim" not in handed.__qualname__, "dynamo is loaded: torch's own disabled version must take over"
model(torch.ones(1, 4)).sum().backward()
opt.step()
print("ok")
'''

PRELOAD = '''
import sys, torch
from slurmkit.worker import startup
thread = startup.preload_dynamo()
assert thread is not None
thread.join()
assert "torch._dynamo" in sys.modules and startup.preload_dynamo() is None
print("ok")
'''


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_optimizer_set_up_does_not_import_dynamo_and_compile_still_disables_it() -> None:
    assert _run(DEFER).strip() == "ok"


def test_dynamo_preloads_in_a_background_thread() -> None:
    assert _run(PRELOAD).strip() == "ok"
