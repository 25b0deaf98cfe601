"""Machine-readable output of every listing, on a live cluster: `--json` with a schema version,
`--parsable`, nothing but data on stdout, and nothing cut off a terminal."""

from __future__ import annotations

import json

from tests.conftest import LiveCluster, wait_for

#: Each listing and its arguments (show's job id is filled in).
LISTINGS = (("queue",), ("nodes",), ("history",), ("report",), ("show", "{job}"))


def test_every_listing_has_json_and_parsable_and_prints_only_data(cluster: LiveCluster) -> None:
    name = "a-rather-long-job-name-that-a-terminal-table-might-cut-" + "x" * 60
    job = cluster.submit("-J", name, "--wrap", "true")
    cluster.wait_state(job, "COMPLETED")
    held = cluster.submit("--hold", "-J", name, "--wrap", "true")
    for listing in LISTINGS:
        args = [a.format(job=job) for a in listing]
        doc = cluster.gq(*args, "--json", check=True)
        assert json.loads(doc.stdout)["schema_version"] == 1, args
        parsed = cluster.gq(*args, "--parsable", check=True)
        lines = parsed.stdout.splitlines()
        assert len(lines) >= 2, (args, parsed.stdout)
        widths = {ln.count("|") for ln in lines}
        assert len(widths) == 1 and widths != {0}, (args, lines)  # a header, same fields
        plain = cluster.gq(*args, check=True)
        for out in (doc, parsed, plain):
            assert out.stderr == "" and "\x1b" not in out.stdout, (args, out.stderr)
    queue = cluster.gq("queue", check=True).stdout
    assert name in queue and f"{held}" in queue  # off a terminal nothing is truncated
    history = cluster.gq("history", "--parsable", check=True).stdout.splitlines()
    fields = history[0].split("|")
    row = next(ln.split("|") for ln in history if ln.startswith(f"{job}|"))
    assert row[fields.index("JobName")] == name and row[fields.index("State")] == "COMPLETED"
    shown = dict(ln.split("|", 1) for ln in
                 cluster.gq("show", str(job), "-p", check=True).stdout.splitlines()[1:])
    assert shown["JobName"] == name and shown["JobState"] == "COMPLETED"
    # Per-GPU telemetry from the nodes' heartbeats (fake GPUs: idle, nothing used, 30 C).
    def first_gpu() -> dict[str, str] | None:
        lines = cluster.gq("nodes", "-p", check=True).stdout.splitlines()
        gpu = dict(zip(lines[0].split("|"), lines[1].split("|")))
        return gpu if gpu["TEMP"] != "-" else None  # until its first heartbeat
    gpu = wait_for(first_gpu, "telemetry in gq nodes")
    assert (gpu["UTIL"], gpu["USED"], gpu["TEMP"]) == ("0%", "0", "30C"), gpu
    report = cluster.gq("report", "-p", check=True).stdout.splitlines()
    assert report[0] == "GROUP|NAME|GPU_HOURS|WASTED_GPU_HOURS"
    assert any(ln.startswith("total||") for ln in report)
    cluster.gq("cancel", str(held), check=True)
