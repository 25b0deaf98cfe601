"""Slurm users' habits on live daemons: mail, partitions and --test-only through the real CLI,
the Slurm commands (sbatch, squeue, scancel, sacct, scontrol, sinfo) and the environment a
batch job gets."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tests.conftest import LiveCluster, prepare, running, wait_for


def _recorder(path: Path) -> Path:
    """A mail program that records its arguments, one line a mail."""
    script = path.with_suffix(".sh")
    script.write_text(f"#!/bin/sh\nprintf '%s|' \"$@\" >> {path}\necho >> {path}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_mail_is_sent_by_the_configured_program_on_begin_end_and_failure(tmp_path: Path
                                                                         ) -> None:
    live = prepare(tmp_path)
    log = tmp_path / "mail.log"
    program = _recorder(log)
    live.configure(lambda cfg: setattr(cfg.head, "mail_program", str(program)))
    with running(live, nodes=1):
        ok = live.submit("--mail-type=ALL", "-J", "good", "--wrap", "true")
        bad = live.submit("--mail-type=FAIL", "--mail-user", "ops@example.org", "-J", "bad",
                          "--wrap", "exit 3")
        quiet = live.submit("--mail-type=END", "-J", "quiet", "-H", "--wrap", "true")
        live.wait_state(ok, "COMPLETED")
        live.wait_state(bad, "FAILED")
        live.gq("cancel", str(quiet), check=True)
        lines = wait_for(lambda: log.exists() and len(log.read_text().splitlines()) >= 4
                         and log.read_text().splitlines(), "four mails")
    mails = sorted(lines)
    assert any(m.startswith(f"-s|Slurm Job_id={ok} Name=good Began, Queued time 00:00:0")
               and m.endswith(f"|{os.environ.get('USER') or 'root'}|") for m in mails), mails
    assert any(f"Slurm Job_id={ok} Name=good Ended, Run time 00:00:0" in m
               and ", COMPLETED, ExitCode 0|" in m for m in mails), mails
    assert any(f"Slurm Job_id={bad} Name=bad Failed, Run time 00:00:0" in m
               and ", FAILED, ExitCode 3|ops@example.org|" in m for m in mails), mails
    assert any(f"Slurm Job_id={quiet} Name=quiet Ended, Run time 00:00:00, CANCELLED" in m
               for m in mails), mails
    assert len(mails) == 4  # no BEGIN for the FAIL-only and END-only jobs


def test_partitions_configured_by_the_site_keep_jobs_on_their_nodes(cluster: LiveCluster
                                                                    ) -> None:
    cluster.reconfigure('[partition.big]\nnodes = ["node1"]\ndefault = true\n'
                        '[partition.small]\nnodes = ["node2"]\nmax_time = "10:00"\n')
    jobs = [cluster.submit("-p", "small", "--wrap", "sleep 30") for _ in range(3)]
    assert {cluster.wait_state(j, "RUNNING")["node_list"][0] for j in jobs} == {"node2"}
    refused = cluster.gq("submit", "-p", "gpu", "--wrap", "true")
    assert refused.returncode == 1
    assert "invalid partition 'gpu'; known: big, small" in refused.stderr
    over = cluster.gq("submit", "-p", "small", "-t", "1:00:00", "--wrap", "true")
    assert over.returncode == 1 and "partition's maximum of 00:10:00" in over.stderr
    test = cluster.gq("submit", "--test-only", "-p", "big", "-g", "2", "--wrap", "true")
    assert test.returncode == 0, test.stderr
    assert " using 1 processors on nodes node1 in partition big" in test.stdout
    assert test.stdout.startswith(f"Job {jobs[-1] + 1} to start at ")
    cluster.gq("cancel", *map(str, jobs), check=True)
