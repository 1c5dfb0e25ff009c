"""`import slurmkit.tracking`: the job side's slurmkit.worker.tracking under its documented name, the same
module object as the attribute `slurmkit.tracking` (this module puts it in its own place on import)."""

import sys

from slurmkit.worker import tracking as _module
from slurmkit.worker.tracking import *  # noqa: F403 - the names type checkers see

sys.modules[__name__] = _module
