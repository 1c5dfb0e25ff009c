"""`import slurmkit.distributed`: the job side's slurmkit.worker.distributed under its documented name, the same
module object as the attribute `slurmkit.distributed` (this module puts it in its own place on import)."""

import sys

from slurmkit.worker import distributed as _module
from slurmkit.worker.distributed import *  # noqa: F403 - the names type checkers see

sys.modules[__name__] = _module
