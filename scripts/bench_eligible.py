"""scripts/bench's `eligible` scenario (issue 17, Done-when 1): one gqd, virtual nodes all busy
with long jobs, and a queue of `--elig-jobs` **eligible** (not held) jobs behind them, each a
1-GPU long job that could start the moment a GPU frees. Measured once all are queued:

- submit round trip: one 1-job `client.submit` (its reply comes at commit), p50 / p99;
- gqd's scheduling pass p50 / p99 and loop lag p99 over the window (its Prometheus
  histograms), gqd's RSS (max over the window);
- a freed GPU -> next job started: cancel one running (whole-node) job, poll the oldest pending
  job (all are of one class, so it is the first to start on the freed GPUs) until gqd has it
  RUNNING; wall from the cancel's send, which includes the node killing the job and reporting
  its end. Samples taken one after another; each frees a node, so the ones after it start
  8 jobs at a time.

gqd runs at normal priority unless --elig-head-nice says otherwise (issue 17: measure as a
user's install runs)."""

from __future__ import annotations

import time

from benchlib import (PersonalCluster, VirtualFleet, autogroup_nice, histogram_window, say,
                      scrape, summary_ms)


def _running(samples: dict) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "gq_jobs" and dict(labels).get("state") == "RUNNING")


def _until(check, timeout_s: float, what: str, every_s: float = 1.0) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


def gq_eligible(a) -> dict:
    import psutil

    from gq.cluster import Layout, metrics_url
    from gq.pidfile import read_alive
    gpus = int(a.scale_gpus)
    fleet = None
    try:
        with PersonalCluster(0, a.scale_gpus, client_timeout_s=600) as pc:
            fleet = VirtualFleet(pc, a.elig_nodes, a.scale_procs, a.scale_gpus, a.scale_nice)
            r: dict = {"nodes": a.elig_nodes, "procs": len(fleet.groups), "gpus_per_node": gpus,
                       "eligible": a.elig_jobs}
            r["nodes_up_s"] = fleet.start()
            head = psutil.Process(read_alive(Layout.default().head_pid))
            r["head_nice"] = a.elig_head_nice if a.elig_head_nice and autogroup_nice(
                head.pid, a.elig_head_nice) else 0
            url = metrics_url(pc.cfg)
            long_spec = pc.spec("#!/bin/sh\nexec sleep 100000\n", "long")
            # The cluster is filled by whole-node jobs: one process each, not one per GPU
            # (2,048 shepherds would swamp this host); the queued jobs take 1 GPU each.
            whole = dataclasses_replace(long_spec, gpus=gpus)
            busy = a.elig_nodes
            say(f"[gq eligible] {a.elig_nodes} virtual nodes x {gpus} GPUs: {busy} long "
                f"whole-node jobs, then {a.elig_jobs:,} eligible 1-GPU ones behind them")
            t0 = time.perf_counter()
            running_ids = []
            for at in range(0, busy, a.scale_chunk):
                running_ids += pc.client.submit([whole] * min(a.scale_chunk, busy - at))
            _until(lambda: _running(scrape(url)) >= busy, 600, "the cluster to fill")
            r["fill_running_s"] = round(time.perf_counter() - t0, 1)
            t0 = time.perf_counter()
            waiting = []
            for at in range(0, a.elig_jobs, a.scale_chunk):
                waiting += pc.client.submit([dataclasses_replace(long_spec, name="eligible")]
                                            * min(a.scale_chunk, a.elig_jobs - at))
            r["queue_eligible_s"] = round(time.perf_counter() - t0, 1)
            # Settled: the passes after the last submit have run.
            time.sleep(2.0)
            before, rss = scrape(url), [head.memory_info().rss]
            w0 = time.perf_counter()
            rtts = []
            one = dataclasses_replace(long_spec, name="probe")
            for _ in range(a.elig_submits):
                t = time.perf_counter()
                waiting += pc.client.submit([one])
                rtts.append(time.perf_counter() - t)
                rss.append(head.memory_info().rss)
                time.sleep(0.05)
            r["submit_rtt"] = summary_ms(rtts)
            freed, next_at = [], 0
            for victim in running_ids[:a.elig_frees]:
                job = waiting[next_at]
                next_at += gpus  # the freed node takes the next 8
                t = time.perf_counter()
                pc.client.cancel([victim])
                _until(lambda: pc.client.show(job)["state"] == "RUNNING", 60,
                       f"job {job} to start", every_s=0.002)
                freed.append(time.perf_counter() - t)
                rss.append(head.memory_info().rss)
            r["freed_to_start"] = summary_ms(freed)
            after = scrape(url)
            r["window_s"] = round(time.perf_counter() - w0, 1)
            r["pass"] = histogram_window(before, after, "gq_schedule_pass_seconds")
            r["loop_lag"] = histogram_window(before, after, "gq_loop_lag_seconds")
            r["rss_mib_max"] = round(max(rss) / 2**20, 1)
            pc.client.drain(fleet.names, "bench done")
            for at in range(0, len(waiting), a.scale_chunk):  # a request's list is bounded
                pc.client.cancel(waiting[at:at + a.scale_chunk])
            pc.client.cancel([j["id"] for j in pc.client.queue(states=["RUNNING"])])
            _until(lambda: _running(scrape(url)) == 0, 300, "the running jobs to end")
    finally:
        if fleet is not None:
            fleet.reap()
    return r


def dataclasses_replace(spec, **kw):  # type: ignore[no-untyped-def]
    import dataclasses
    return dataclasses.replace(spec, **kw)


def eligible_rows(x: dict) -> list[tuple[str, str, str, str]]:
    def p50_99(h: dict) -> str:
        return f"{h['p50_ms']} / {h['p99_ms']} (n={h['n']})"
    return [(f"(8) {x['nodes']} virtual nodes x {x['gpus_per_node']} GPUs all busy, "
             f"{x['eligible']:,} eligible queued (gqd nice {x['head_nice']}): submit round trip "
             "p50 / p99 ms", p50_99(x["submit_rtt"]), "", ""),
            ("    scheduling pass p50 / p99 ms", p50_99(x["pass"]), "", ""),
            ("    a freed GPU -> next job started p50 / p99 ms", p50_99(x["freed_to_start"]), "", ""),
            ("    gqd loop lag p50 / p99 ms", p50_99(x["loop_lag"]), "", ""),
            ("    gqd RSS max MiB", f"{x['rss_mib_max']}", "", "")]
