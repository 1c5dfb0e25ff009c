"""`python -P -m slurmkit.supervisor`: the batch script's last line (slurmkit.supervisor.loop)."""

from slurmkit.supervisor.loop import main

if __name__ == "__main__":
    raise SystemExit(main())
