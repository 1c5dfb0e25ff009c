"""docs/from-submitit.md's "Inside the job" and "What differs", run as a submitit user writes them
(local profile, two ranks): TorchDistributedEnvironment's export, and a __main__ function's
traceback naming its own file (issue 51, item 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RunFile

USER = """\
import json, sys
import slurmkit


def boom(x):
    y = x + 1
    raise ValueError(f"bad {y}")


def exported():
    import submitit
    import torch
    import torch.distributed as dist
    try:
        submitit.helpers.TorchDistributedEnvironment().export()
        plain = "exported"
    except RuntimeError as exc:
        plain = type(exc).__name__
    env = submitit.helpers.TorchDistributedEnvironment().export(overwrite=True)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return [plain, env.rank, env.world_size, int(t.item())]


if __name__ == "__main__":
    ex = slurmkit.Executor(profile=sys.argv[1], name="habit", tasks_per_node=2)
    failed, mapped = ex.submit(boom, 1), ex.map_array(boom, [1])[0]
    for job in (failed, mapped):
        job.wait(timeout=120)
    print(json.dumps({"runs": [j.run_dir for j in (failed, mapped)],
                      "exported": ex.submit(exported).results(timeout=120)}))
"""


def test_a_submitit_users_function_inside_the_job(tmp_path: Path, local_profile: Path) -> None:
    script = tmp_path / "user.py"
    script.write_text(USER)
    out = subprocess.run([sys.executable, str(script), str(local_profile)], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    # export() as submitit writes it refuses what slurmkit set; export(overwrite=True) works, as the doc says
    assert found["exported"] == [["RuntimeError", 0, 2, 2], ["RuntimeError", 1, 2, 2]]
    for run_dir in found["runs"]:  # submit, and map_array's task
        paths = RunPaths(Path(run_dir))
        outcome = paths.outcome(RunFile(paths).read().job_ids[-1], 0)
        assert outcome is not None and not outcome.ok
        frames = "\n".join(outcome.trace)
        assert f'File "{script}", line 7, in boom' in frames and "<dynamic-code>" not in frames


def test_with_source_names_the_file_in_every_code_cloudpickle_carried() -> None:
    import types

    import cloudpickle

    from slurmkit.common.code_source import source_of, with_source

    src = ("class Model:\n    def step(self):\n        return 1\n\n"
           "def helper():\n    return 2\n\n"
           "def train():\n    inner = lambda: helper()\n    return Model().step() + inner()\n")
    module = types.ModuleType("not_importable")  # pickled by value, as a script's __main__ is
    exec(compile(src, "/home/me/user.py", "exec"), module.__dict__)  # noqa: S102 - the test's own source
    assert source_of(module.train) == "/home/me/user.py"
    fn = cloudpickle.loads(cloudpickle.dumps(module.train))
    assert fn.__code__.co_filename == "<dynamic-code>"
    assert with_source(fn, "/home/me/user.py") is fn and fn() == 3
    codes = [fn.__code__, fn.__globals__["helper"].__code__, fn.__globals__["Model"].step.__code__,
             *(c for c in fn.__code__.co_consts if isinstance(c, types.CodeType))]
    assert len(codes) == 4 and {c.co_filename for c in codes} == {"/home/me/user.py"}
