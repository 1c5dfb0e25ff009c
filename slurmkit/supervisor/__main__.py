"""`python -P -m slurmkit.supervisor`: the batch script's last line (slurmkit.supervisor.main)."""

from slurmkit.supervisor.main import main

if __name__ == "__main__":
    raise SystemExit(main())
