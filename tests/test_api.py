"""The Python API of docs/API.md (`gq.client`) against a live cluster, as a notebook uses it."""

from __future__ import annotations

import os

import pytest

from gq.client import wrap
from gq.errors import NotFoundError
from tests.conftest import LiveCluster


def test_submit_show_queue_wait_and_cancel_from_python(cluster: LiveCluster) -> None:
    spec = wrap("echo $GQ_JOB_ID > ran.txt; exit 3", gpus=2, name="nb", cwd=str(cluster.work))
    assert spec.script.startswith("#!/bin/sh\n") and spec.env["PATH"] == os.environ["PATH"]
    with cluster.client() as c:
        (job,) = c.submit([spec])
        (held,) = c.submit([wrap("true", hold=True, cwd=str(cluster.work))])
        assert c.show(held)["reason"] == "JobHeldUser"
        assert held in {j["id"] for j in c.queue(user=c._user)}
        (final,) = c.wait([job], timeout_s=60)
        assert (final["state"], final["exit_code"], final["name"]) == ("FAILED", 3, "nb")
        assert (cluster.work / "ran.txt").read_text().strip() == str(job)
        assert c.cancel([held])["cancelled"] == [held]
        assert c.show(held)["state"] == "CANCELLED"
        with pytest.raises(NotFoundError):
            c.show(999_999)
