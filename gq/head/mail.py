"""Mail about jobs that asked for it (`--mail-type`, `--mail-user`), sent as Slurm's MailProg
is: `[head] mail_program -s SUBJECT USER`, with Slurm's subjects, so a site's mail script
works for both.

Mails are queued by the head's state changes and sent by the daemon only once the transaction
that made the change has committed (a change that is rolled back mails nothing: `clear`). The
program runs detached, its output discarded; at most MAX_RUNNING at once, more are dropped
with a log line (a hung mailer must not grow gqd).
"""

from __future__ import annotations

import logging
import shlex
import subprocess

from gq.model import Job, JobState

log = logging.getLogger("gq.head")

#: Mail programs running at once, at most.
MAX_RUNNING = 64
#: --mail-type words that ask for each event (ALL asks for every one gq sends).
_WANTS = {"BEGIN": {"BEGIN", "ALL"}, "END": {"END", "ALL"}, "FAIL": {"FAIL", "ALL"},
          "REQUEUE": {"REQUEUE", "ALL"}}


def _clock(seconds: float) -> str:
    """Slurm's elapsed form: HH:MM:SS, with D- before it from a day on."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


class Mailer:
    def __init__(self, program: str) -> None:
        self.configure(program)
        #: (argv) of mails waiting for the commit.
        self.queued: list[list[str]] = []
        self.running: list[subprocess.Popen[bytes]] = []

    def configure(self, program: str) -> None:
        """`[head] mail_program` (again, after a SIGHUP)."""
        self.argv = shlex.split(program) if program else []

    def _wants(self, job: Job, event: str) -> bool:
        types = set((job.spec.mail_type or "").split(","))
        if not self.argv or not types & _WANTS[event]:
            return False
        # An array's tasks mail one by one only with ARRAY_TASKS (else Slurm mails the array).
        return job.array_job_id is None or "ARRAY_TASKS" in types

    def began(self, job: Job, now: float) -> None:
        if self._wants(job, "BEGIN"):
            self._queue(job, f"Began, Queued time {_clock(now - job.submit_time)}")

    def ended(self, job: Job, state: JobState, now: float, exit_code: int | None) -> None:
        """`state`: how it ended; a requeue is REQUEUE's mail, failure FAIL's, else END's."""
        run = _clock(now - job.start_time) if job.start_time else "00:00:00"
        tail = f"Run time {run}, {state.value}, ExitCode {exit_code or 0}"
        if state != JobState.COMPLETED and self._wants(job, "FAIL"):
            self._queue(job, f"Failed, {tail}")
        elif self._wants(job, "END"):
            self._queue(job, f"Ended, {tail}")

    def requeued(self, job: Job, now: float) -> None:
        if self._wants(job, "REQUEUE"):
            run = _clock(now - job.start_time) if job.start_time else "00:00:00"
            self._queue(job, f"Requeued, Run time {run}")

    def _queue(self, job: Job, what: str) -> None:
        who = f"Array Task Job_id={job.ref} ({job.id})" if job.array_job_id is not None \
            else f"Job_id={job.id}"
        subject = f"Slurm {who} Name={job.spec.name} {what}"
        self.queued.append([*self.argv, "-s", subject, job.spec.mail_user or job.spec.user])

    def clear(self) -> None:
        """The changes that queued mails were not committed."""
        self.queued.clear()

    def send(self) -> None:
        """Start the queued mails (after the commit)."""
        self.running = [p for p in self.running if p.poll() is None]
        for argv in self.queued:
            if len(self.running) >= MAX_RUNNING:
                log.warning("mail program: %d still running, not mailing %r", MAX_RUNNING, argv)
                continue
            try:
                self.running.append(subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True))
            except OSError as exc:
                log.warning("mail program %r cannot run: %s", argv[0], exc)
        self.queued.clear()
