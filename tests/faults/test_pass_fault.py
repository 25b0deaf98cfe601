"""A scheduling pass that raises (a bug in the pass) on a real gqd: the pass is taken back whole,
logged with its traceback and counted, gqd keeps answering and accepting, and once the fault
clears the jobs accepted meanwhile start, each once (gq/head/passguard.py)."""

from __future__ import annotations

from pathlib import Path

from gq.cluster import metrics_url
from gq.head.passguard import FAULT_ENV
from tests.conftest import prepare, running, wait_for
from tests.test_metrics import scrape_until, value


def test_a_failing_pass_is_taken_back_and_gqd_answers_until_it_clears(tmp_path: Path) -> None:
    live = prepare(tmp_path)
    fault = tmp_path / "pass-fault"
    fault.touch()  # every pass fails from gqd's start
    live.env[FAULT_ENV] = str(fault)
    with running(live, nodes=1, fake_gpus="2"):
        url = metrics_url(live.config())
        assert url is not None
        job = live.submit("-g", "1", "--wrap", "sleep 60")
        # The pass ran (it would have started the job) and was taken back, more than once.
        samples = scrape_until(url, lambda s: (value(s, "gq_schedule_pass_failures_total")
                                               or 0) >= 2, "two failed passes counted")
        assert value(samples, "gq_schedule_pass_failures_total") >= 2
        log = live.log("gqd")
        assert "scheduling pass failed" in log and "InjectedPassFault" in log  # the traceback
        assert "Traceback" in log
        # gqd is up and answers: reads, and a submit is accepted while passes fail.
        assert live.show(job)["state"] == "PENDING"
        second = live.submit("-g", "1", "--wrap", "sleep 60")
        assert live.gq("queue", check=True).returncode == 0
        # The taken-back starts were not kept: both still pending after more failed passes.
        failed = value(samples, "gq_schedule_pass_failures_total")
        scrape_until(url, lambda s: (value(s, "gq_schedule_pass_failures_total") or 0)
                     > failed, "another failed pass, with both jobs queued")
        assert [live.show(j)["state"] for j in (job, second)] == ["PENDING", "PENDING"]
        fault.unlink()
        for j in (job, second):
            live.wait_state(j, "RUNNING")
        wait_for(lambda: "scheduling pass succeeded after" in live.log("gqd"),
                 "gqd to log the pass that succeeded")
        # Each started once: one run each, on distinct GPUs.
        shown = [live.show(j) for j in (job, second)]
        gpus = [tuple(sorted((n, g) for n, ids in s["gpu_ids"].items() for g in ids))
                for s in shown]
        assert len(set(gpus)) == 2, gpus
        assert all(s.get("restarts", 0) == 0 for s in shown), shown
        live.gq("cancel", str(job), str(second), check=True)
