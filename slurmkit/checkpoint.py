"""`import slurmkit.checkpoint`: the job side's slurmkit.worker.checkpoint under its documented name, the same
module object as the attribute `slurmkit.checkpoint` (this module puts it in its own place on import)."""

import sys

from slurmkit.worker import checkpoint as _module
from slurmkit.worker.checkpoint import *  # noqa: F403 - the names type checkers see

sys.modules[__name__] = _module
