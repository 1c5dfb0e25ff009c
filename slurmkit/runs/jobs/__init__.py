"""Runs, one module per verb: submit (and the dry run), status (read only) and wait, cancel,
resubmit, result. The library behind `slurmkit submit/status/cancel/resubmit/result`; the names
below are the verbs' own, gathered for `from slurmkit.runs import jobs`."""

from slurmkit.runs.jobs.cancel import cancel
from slurmkit.runs.jobs.resubmit import resubmit
from slurmkit.runs.jobs.result import result
from slurmkit.runs.jobs.status import (
    FAILED_STATES,
    RunStatus,
    describe,
    is_active,
    local_state,
    run_state,
    status,
    statuses,
    wait,
)
from slurmkit.runs.jobs.submit import (
    Call,
    SubmitRequest,
    Submitted,
    check_function_kind,
    check_secrets,
    dry_run,
    entry,
    run_env,
    send,
    submit,
    take_snapshot,
)

__all__ = ["FAILED_STATES", "Call", "RunStatus", "SubmitRequest", "Submitted", "cancel", "check_function_kind",
           "check_secrets", "describe", "dry_run", "entry", "is_active", "local_state", "resubmit",
           "result", "run_env", "run_state", "send", "status", "statuses", "submit", "take_snapshot", "wait"]
