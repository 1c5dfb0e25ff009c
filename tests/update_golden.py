"""Rewrite the golden scripts from the current templates: python -m tests.update_golden

A separate command, never run by the suite: test_golden_render only compares, so it can fail.
Refuses under CI, where the goldens must be what was committed.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    if os.environ.get("CI"):
        print("update_golden: refusing under CI; goldens are updated by hand and committed", file=sys.stderr)
        return 2
    os.environ["USER"] = "alice"  # as test_golden_render sets it
    from tests.unit.test_profiles import SHIPPED
    from tests.unit.test_render import GOLDEN, render_profile

    for profile in SHIPPED:
        (GOLDEN / f"{profile}.sh").write_text(render_profile(GOLDEN / "spec.yaml", profile))
        print(f"wrote {GOLDEN / f'{profile}.sh'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
