"""Resubmitting an ended run under its run id."""

from __future__ import annotations

import datetime as dt

from slurmkit.common import perms
from slurmkit.common.cause import Cause
from slurmkit.common.layout import RunPaths
from slurmkit.common.record import RestartEntry, RunFile
from slurmkit.config.resolved import Resolved
from slurmkit.errors import SlurmkitError
from slurmkit.runs import procs, registry
from slurmkit.runs.jobs.status import is_active, run_state
from slurmkit.runs.jobs.submit import Submitted, check_secrets
from slurmkit.slurm.submitter import submitter


def resubmit(paths: RunPaths, partition: str | None = None) -> Submitted:
    """Submit an ended run again under its run id: the same script and call as a new job, which
    resumes from the run's newest committed checkpoint. The single-run twin of `sweep resubmit`,
    for a run Slurm did not bring back: preempted under PreemptMode=CANCEL, a spent requeue
    budget, a cancel, a failure fixed since. Its dependency is dropped (it was met)."""
    rec = RunFile(paths).read()
    st = run_state(paths)
    if is_active(st.state) or st.state == "COMPLETED":
        raise SlurmkitError(f"run is {st.state} (job {st.job_id}); nothing to resubmit", where=paths.run_id,
                            valid="valid: a run that ended other than COMPLETED; `slurmkit cancel` a live one first")
    check_secrets(rec.spec.secret_env if rec.spec else [], paths.run_id, {})
    ex_mod = submitter()
    spec = rec.spec
    parts = tuple(paths.part(n) for n in (spec.components or {}) if n != spec.primary) if spec else ()

    if rec.executor == "local":  # a laptop's rehearsal of what a cluster's resubmit does
        if spec is None:
            raise SlurmkitError("its run.json has no spec this slurmkit can read", where=paths.run_id,
                                valid="submit the run again with `slurmkit submit`")
        resolved = Resolved(spec, rec.profile, rec.profile_name, rec.resources, rec.spec_source)
        with perms.umask(perms.folder_kind(paths.run_dir)):
            job_id = (ex_mod.resubmit_local_parts(paths, st.job_id, rec.script or paths.script.read_text(),
                                                  parts, resolved)
                      if spec.components else ex_mod.resubmit_local(paths, st.job_id, resolved))
        RunFile(paths).add_job_id(job_id, pid_start=procs.start_time(int(job_id)))
        _resubmitted(paths, job_id, st.job_id, st.state, partition)
        return Submitted(run_id=paths.run_id, job_id=job_id, run_dir=str(paths.run_dir), script="")
    script = "".join(ln for ln in (rec.script or paths.script.read_text()).splitlines(keepends=True)
                     if not ln.startswith("#SBATCH --dependency="))
    if parts and partition:
        raise SlurmkitError("--partition with a heterogeneous run: sbatch would move its first component only",
                            where=paths.run_id, valid="valid: resubmit without --partition")
    with perms.umask(perms.folder_kind(paths.run_dir)):
        job_id = ex_mod.resubmit(paths, st.job_id, script, partition, parts)
    # The job id first, in its own write, as submit does: nothing later may lose it.
    RunFile(paths).add_job_id(job_id, script=script)
    _resubmitted(paths, job_id, st.job_id, st.state, partition)
    registry.write_script(paths, script)
    return Submitted(run_id=paths.run_id, job_id=job_id, run_dir=str(paths.run_dir), script=script)


def _resubmitted(paths: RunPaths, job_id: str, old_job: str, old_state: str, partition: str | None) -> None:
    """The run's verdicts cleared and the resubmit recorded as its restart entry."""
    on = f" on partition {partition}" if partition else ""
    with RunFile(paths).editing() as record:
        record.final = record.preempted = record.cancelled = None
        record.restarts.append(RestartEntry(
            kind="resubmit", n=0, job_id=job_id, cause=Cause.RESUBMIT,
            time=dt.datetime.now().isoformat(timespec="seconds"),
            detail=f"slurmkit resubmit{on} after job {old_job} ended {old_state}"))
