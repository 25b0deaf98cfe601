"""Shared pieces of gq's benchmarks (scripts/bench, scripts/bench-submit, scripts/bench-plan).

Not a test module and not part of the gq package: the scripts put scripts/ on sys.path and
import it. Statistics, machine facts, a fresh personal cluster in a temporary directory, the
synthetic plan() state, and a driver for the real Slurm peer in ../shared/peers/slurm.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _into_venv() -> None:
    """Run the calling script again with the virtual environment's Python (scripts/lib/venv.sh
    makes it on first use, as scripts/test does): the system's python3 lacks gq's dependencies."""
    venv = Path(os.environ.get("GQ_VENV", REPO / ".venv"))
    if Path(sys.prefix).resolve() == venv.resolve():
        return
    subprocess.run(["bash", "-c", f'source "{REPO}/scripts/lib/venv.sh"'], check=True)
    python = venv / "bin" / "python"
    os.execv(python, [str(python), *sys.argv])


_into_venv()


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary_ms(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in seconds]
    return {"n": len(ms), "min_ms": round(min(ms), 2), "p50_ms": round(percentile(ms, 50), 2),
            "p90_ms": round(percentile(ms, 90), 2), "p99_ms": round(percentile(ms, 99), 2),
            "max_ms": round(max(ms), 2), "mean_ms": round(sum(ms) / len(ms), 2)}


def machine_info() -> dict[str, object]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count()
    return {"nproc": nproc, "cpu_model": model, "mem_gib": mem_gib,
            "python": platform.python_version(), "python_executable": sys.executable,
            "kernel": platform.release(), "hostname": platform.node(),
            "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "loadavg_start": list(os.getloadavg())}


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole host, from /proc/stat."""
    try:
        fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return (0.0, 0.0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields) - idle, sum(fields))


def busy_cores(before: tuple[float, float], after: tuple[float, float], ncpu: int) -> float | None:
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total * ncpu, 2) if total > 0 else None


def gq_commands() -> dict[str, list[str]]:
    """How to run the CLI: `gq` as found on PATH, and the console script beside this python."""
    cmds: dict[str, list[str]] = {}
    found = shutil.which("gq")
    if found:
        cmds["gq (PATH)"] = [found]
    beside = Path(sys.executable).parent / "gq"
    if beside.is_file() and os.access(beside, os.X_OK) and (
            not found or Path(found).resolve() != beside.resolve()):
        cmds["gq (beside python)"] = [str(beside)]
    if not cmds:
        cmds["python -m gq.cli.main"] = [sys.executable, "-m", "gq.cli.main"]
    return cmds


def time_calls(argv: list[str], n: int, cwd: Path, check_id: bool) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True)
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0 or (check_id and not proc.stdout.strip().isdigit()):
            raise RuntimeError(f"{' '.join(argv)} failed (rc {proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()[-500:]}")
    return out


def drain(client, deadline_s: float, say, jobs: int, since: float) -> dict[str, object]:
    """Wait until the queue is empty; cancel what is left if the deadline passes.

    `since` is when the phase's first submit began (perf_counter): jobs/s is over the whole
    phase, submits included, as the jobs start running while the later ones are submitted.
    """
    t0 = time.perf_counter()
    end = time.monotonic() + deadline_s
    left = client.queue()
    while left and time.monotonic() < end:
        time.sleep(0.2)
        left = client.queue()
    took = time.perf_counter() - t0
    total = time.perf_counter() - since
    result: dict[str, object] = {"after_last_submit_s": round(took, 3),
                                 "from_first_submit_s": round(total, 3), "jobs": jobs,
                                 "complete": not left,
                                 "jobs_per_s": round(jobs / total, 1) if not left else None}
    if left:
        say(f"  drain deadline ({deadline_s:g}s) passed with {len(left)} job(s) left: "
            "cancelling them")
        client.cancel([j["id"] for j in left])
        end = time.monotonic() + 60
        while client.queue() and time.monotonic() < end:
            time.sleep(0.2)
        result["cancelled"] = len(left)
    return result


def our_leftovers(marker: str) -> list[int]:
    """Processes (other than us) whose command line mentions our temporary directory."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def the_gq_command() -> list[str]:
    """The `gq` a user of the README's setup runs: the console script beside this python."""
    beside = Path(sys.executable).parent / "gq"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    return [sys.executable, "-m", "gq.cli.main"]


class PersonalCluster:
    """A fresh personal cluster (`gq up`) whose state, sockets and jobs live in a new
    temporary directory; `with PersonalCluster(2, "8") as pc:` gives pc.client, pc.cfg,
    pc.spec(...), pc.tmp. Stopped, leftovers killed and the directory removed on exit."""

    def __init__(self, nodes: int = 2, fake_gpus: str = "8", keep: bool = False,
                 client_timeout_s: float = 120.0, configure: Callable[[Any], None] | None = None):
        self.nodes, self.fake_gpus, self.keep = nodes, fake_gpus, keep
        #: Changes to the cluster's config before `gq up` starts it (its [auth] ...).
        self.configure = configure
        self.client_timeout_s = client_timeout_s
        self.client = None
        self.cfg = None
        self.leftovers: list[int] = []
        self._saved_env: dict[str, str | None] = {}

    def __enter__(self) -> "PersonalCluster":
        self.tmp = Path(tempfile.mkdtemp(prefix="gqbench-"))
        for key, value in (("XDG_STATE_HOME", str(self.tmp / "state")),
                           ("XDG_RUNTIME_DIR", str(self.tmp / "run")), ("GQ_CONFIG", None)):
            self._saved_env[key] = os.environ.get(key)
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        (self.tmp / "state").mkdir()
        (self.tmp / "run").mkdir(mode=0o700)
        self.jobdir = self.tmp / "jobs"
        self.jobdir.mkdir()
        from gq import cluster
        from gq.client import Client
        try:
            if self.configure is not None:
                from gq import config as config_mod
                cfg = cluster.write_config(cluster.Layout.default())
                self.configure(cfg)
                cluster.Layout.default().config.write_text(config_mod.to_toml(cfg))
            self.cfg = cluster.up(self.nodes, self.fake_gpus)
        except BaseException:
            self.keep = True
            self._stop()
            raise
        self.client = Client(self.cfg, timeout_s=self.client_timeout_s)
        self.spec_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.tmp),
                         "LANG": "C.UTF-8"}
        return self

    def spec(self, script: str = "#!/bin/sh\ntrue\n", name: str = "bench", **kw: Any):
        from gq.model import JobSpec
        fields = dict(script=script, name=name, uid=os.getuid(), gid=os.getgid(),
                      cwd=str(self.jobdir), env=dict(self.spec_env), gpus=1, qos="normal")
        fields.update(kw)
        return JobSpec(**fields)

    def idle(self, timeout_s: float = 60.0) -> None:
        """Wait until no job is queued and no GPU is held, then a moment of quiet."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and (self.client.queue() or any(
                g.get("job") for n in self.client.nodes() for g in n["gpus"])):
            time.sleep(0.1)
        time.sleep(0.5)

    def _stop(self) -> None:
        from gq import cluster
        if self.client is not None:
            self.client.close()
            self.client = None
        try:
            cluster.down()
        except Exception as exc:  # noqa: BLE001
            say(f"bench: cluster.down failed: {type(exc).__name__}: {exc}")
        self.leftovers = our_leftovers(str(self.tmp))
        if self.leftovers:
            say(f"bench: processes left behind after cluster.down: {self.leftovers}; killing")
            for pid in self.leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.keep:
            say(f"bench: kept {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self._stop()


# --- plan(): the synthetic state of bench-plan ------------------------------------------------

PLAN_NOW = 2_000_000_000.0


def build_plan_state(nodes: int, pending: int, running: int, seed: int):
    """256 nodes x 8 GPUs (by default), `running` jobs of mostly 1 GPU, `pending` jobs of mixed
    shapes (1/2/4/8 GPUs, 2 % two-node gangs), three QOS, ages up to 3 days."""
    from gq.model import Gpu
    from gq.sched import NodeView, PendingJob, RunningJob, Snapshot
    rng = random.Random(seed)
    gpus = tuple(Gpu(index=i, type="h100", memory=80 << 30) for i in range(8))
    free = {f"n{i:03d}": set(range(8)) for i in range(nodes)}
    runs = []
    names = list(free)
    now = PLAN_NOW
    for rid in range(running):
        # 2,000 running jobs on 2,048 GPUs are nearly all 1-GPU; a few 2-GPU ones.
        size = 2 if rng.random() < 0.01 else 1
        candidates = [n for n in names if len(free[n]) >= size]
        if not candidates:
            break
        name = rng.choice(candidates)
        chosen = tuple(sorted(free[name])[:size])
        free[name] -= set(chosen)
        runs.append(RunningJob(id=10**6 + rid, qos=rng.choice(["normal", "free", "pro"]),
                               alloc={name: chosen}, start_time=now - rng.uniform(0, 86400),
                               time_limit_s=rng.choice([3600, 4 * 3600, 86400, 3 * 86400])))
    views = tuple(NodeView(name=n, gpus=gpus, free=frozenset(free[n]), cpus_free=128,
                           mem_free=1 << 40) for n in names)
    jobs = tuple(PendingJob(id=i, qos=rng.choice(["normal", "normal", "free", "pro"]),
                            submit_time=now - rng.uniform(0, 3 * 86400),
                            gpus=rng.choice([1, 1, 1, 1, 2, 4, 8]),
                            nodes=2 if rng.random() < 0.02 else 1,
                            time_limit_s=rng.choice([600, 3600, 4 * 3600, 86400]))
                 for i in range(pending))
    return Snapshot(nodes=views, pending=jobs, running=tuple(runs))


def plan_policies() -> dict[str, Any]:
    """The pass as gqd runs it (reservations for display on) and as `gq sim` runs it (off)."""
    import dataclasses
    from gq.config import Config
    base = Config().policy()
    return {"explain on (gqd)": base, "explain off (gq sim)": dataclasses.replace(base, explain=False)}


def plan_rows(state, passes: int) -> dict[str, dict[str, Any]]:
    """time_plan for plan() with gqd's policy, as `gq sim` runs it, and as `gq sim` runs it with
    the QueueIndex it keeps between passes (built here, outside the timing); then gqd's own
    pass (time_head_pass), the figure to report for gqd."""
    import dataclasses
    from gq.sched.queue import QueueIndex
    policies = plan_policies()
    rows = {label: time_plan(state, policy, passes) for label, policy in policies.items()}
    sim = policies["explain off (gq sim)"]
    index = QueueIndex(sim)
    for job in state.pending:
        index.add(job)
    rows["explain off, QueueIndex (gq sim)"] = time_plan(dataclasses.replace(state, queue=index),
                                                          sim, passes)
    rows["gqd pass (Head.schedule)"] = time_head_pass(state, passes)
    return rows


def plan_head(state, tmp: Path):
    """A gqd `Head` over a store file in `tmp` holding `state` (build_plan_state's): its nodes
    registered as they report themselves, its running jobs placed, its pending jobs queued, all
    under the default config, as gqd would have them in memory. Pending job i gets id i + 1 and
    running jobs the ids after them (the same order, so the same ties)."""
    from gq import protocol
    from gq.config import Config
    from gq.head.core import Head
    from gq.messages import read as read_message
    from gq.model import Job, JobSpec, JobState
    from gq.store import Store
    store = Store(tmp / "gq.db")

    def spec(qos: str, gpus: int, nodes: int, limit: int) -> JobSpec:
        return JobSpec(script="#!/bin/sh\ntrue\n", name="bench", user="bench", uid=1000,
                       gid=1000, nodes=nodes, gpus=gpus, time_limit_s=limit, qos=qos)
    pending = [Job(id=0, spec=spec(j.qos, j.gpus, j.nodes, j.time_limit_s), reason="None",
                   submit_time=j.submit_time) for j in state.pending]
    running = [Job(id=0, spec=spec(r.qos, len(next(iter(r.alloc.values()))), len(r.alloc),
                                   r.time_limit_s),
                   state=JobState.RUNNING, submit_time=r.start_time, start_time=r.start_time,
                   alloc={n: list(g) for n, g in r.alloc.items()}, holds_alloc=True)
               for r in state.running]
    with store.tx():
        store.add_jobs(pending)  # as gqd stores submits: the staged path
        store.add_jobs(running)
    head = Head(Config(path=""), store, PLAN_NOW)
    on_node: dict[str, list[list[int]]] = {}
    for job in running:
        for name in job.alloc:
            on_node.setdefault(name, []).append([job.id, job.restart_count])
    with store.tx():
        for view in state.nodes:
            head.handle_node(view.name, read_message({
                "type": protocol.REGISTER, "node": view.name, "cpus": view.cpus_free,
                "mem": view.mem_free, "running": on_node.get(view.name, []),
                "gpus": [{"index": g.index, "type": g.type, "memory": g.memory}
                         for g in view.gpus]}), PLAN_NOW)
    head.take_orders()
    return head


def time_head_pass(state, passes: int) -> dict[str, Any]:
    """gqd's own pass, `Head.schedule(now)` inside a store transaction as its loop runs it, on
    `state`; CPU time (process_time) of the pass alone, as gqd's pass metric times it. After each
    pass its starts and preemptions are undone (outside the timing), so every pass sees the same
    state, with what gqd keeps between passes kept. The first pass (which writes every job's
    first reason) is left out of the figures."""
    import statistics
    from gq.head.reasons import PREEMPTED
    from gq.model import JobState
    with tempfile.TemporaryDirectory(prefix="gqbench-plan-") as tmp:
        head = plan_head(state, Path(tmp))
        times = []
        for i in range(passes + 1):
            now = PLAN_NOW + i
            head.table.touch()
            before = {job.id: job.reason for job in head.index.ready()}
            with head.tx():
                t = time.process_time()
                head.schedule(now)
                took = (time.process_time() - t) * 1000
            if i:
                times.append(took)
            table = head.table
            started = [head.jobs[j] for j, launch in table.launches.items()
                       if launch.sent_at == now]
            stopped = [j for j in head.index.placed() if j.reason == PREEMPTED]
            starts, reservations = len(started), len(table.reservations)
            # Undone by hand, not by the journal: what gqd keeps between passes stays kept.
            with head.tx():
                for job in started:
                    job.state, job.reason, job.start_time = JobState.PENDING, before[job.id], None
                    job.alloc, job.holds_alloc = {}, False
                    table.launches.pop(job.id)
                    table._save(job)
                for job in stopped:
                    job.reason = ""
                    table._save(job, "reason")
            head.take_orders()
        head.store.close()
    times.sort()
    return {"passes": passes, "p50_ms": round(statistics.median(times), 1),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 1),
            "starts": starts, "reservations": reservations, "preemptions": len(stopped)}


def time_plan(state, policy, passes: int) -> dict[str, Any]:
    """`passes` plan() calls on `state`; p50/p99 ms and the last pass's decisions."""
    import statistics
    from gq.sched import plan
    times = []
    result = None
    for i in range(passes):
        t = time.perf_counter()
        result = plan(state, PLAN_NOW + i, policy)
        times.append((time.perf_counter() - t) * 1000)
    times.sort()
    return {"passes": passes, "p50_ms": round(statistics.median(times), 1),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 1),
            "starts": len(result.starts), "reservations": len(result.reservations),
            "preemptions": len(result.preemptions)}


# --- many virtual nodes and gqd's own figures (the scale scenario) -----------------------------

class VirtualFleet:
    """`procs` processes of `gqnode --virtual` on a PersonalCluster, `nodes` identities in all
    (named s1-v001 ...), each with `gpus` fake GPUs; their keys made first. The processes' pid
    files lie where `gq down` looks, so the cluster's stop stops them too. They run at `nice`
    (their shepherds and jobs too): they stand for other hosts, so they should not take the
    head's CPU as they could on one 2-core machine."""

    def __init__(self, pc: PersonalCluster, nodes: int, procs: int, gpus: str, nice: int = 0):
        from gq.node.virtual import names
        procs = max(1, min(procs, nodes))
        sizes = [nodes // procs + (i < nodes % procs) for i in range(procs)]
        self.groups = [(f"s{i + 1}", n) for i, n in enumerate(sizes)]
        self.names = [name for base, n in self.groups for name in names(base, n)]
        self.pc, self.gpus, self.nice = pc, gpus, nice
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, timeout_s: float = 300.0) -> float:
        """Start the processes; wait until gqd has every node UP; seconds it took."""
        from gq import keys
        t0 = time.perf_counter()
        if self.pc.cfg.auth.curve:
            keys.ensure(Path(self.pc.cfg.auth.key_dir), self.names)
        logs = self.pc.tmp / "state" / "gq" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for base, n in self.groups:
            with open(logs / f"{base}.log", "ab") as out:
                self.procs[base] = subprocess.Popen(
                    ["nice", "-n", str(self.nice), sys.executable, "-m", "gq.node.main",
                     "--config", self.pc.cfg.path,
                     "--name", base, "--virtual", str(n), "--fake-gpus", self.gpus,
                     "--addr", "127.0.0.1"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                    start_new_session=True)
        for proc in self.procs.values():
            autogroup_nice(proc.pid, self.nice)  # each is a session, so a group, of its own
        want = set(self.names)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            up = {n["name"] for n in self.pc.client.nodes() if n["state"] == "UP"}
            if want <= up:
                return round(time.perf_counter() - t0, 2)
            dead = [base for base, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"gqnode --virtual {dead} exited; see {logs}")
            time.sleep(0.5)
        raise RuntimeError(f"only {len(up & want)} of {len(want)} virtual nodes UP after "
                           f"{timeout_s:g} s; see {logs}")

    def reap(self) -> None:
        """After the cluster's stop: collect the processes (never leave zombies)."""
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def autogroup_nice(pid: int, nice: int) -> bool:
    """Set the niceness of the process's scheduler autogroup (its session's), which is what
    counts between sessions when the kernel groups them (sched_autogroup_enabled); plain nice
    only ranks processes within one. Lowering it needs root. False where it could not."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
        return True
    except OSError:
        return False


def thread_sched(pid: int, tid: int | None = None) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a thread (the process's
    main thread by default), from /proc's schedstat; (0, 0) where the kernel keeps none."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid or pid}/schedstat").read_text().split()
        return int(fields[0]) / 1e9, int(fields[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """One Prometheus scrape: (sample name, its labels) -> value."""
    import urllib.request
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def histogram_window(before: dict, after: dict, name: str,
                     quantiles: tuple[float, ...] = (50, 99)) -> dict[str, Any]:
    """What a Prometheus histogram saw between two scrapes: count, mean, and quantiles
    interpolated within buckets as PromQL's histogram_quantile() does (so a quantile is only as
    exact as the bucket it falls in: `le_ms` says which)."""
    def delta(sample: str, **labels: str) -> float:
        key = (sample, frozenset(labels.items()))
        return after.get(key, 0.0) - before.get(key, 0.0)
    les = sorted({dict(k[1])["le"] for k in after if k[0] == f"{name}_bucket"},
                 key=lambda le: float(le))
    cum = [(float(le), delta(f"{name}_bucket", le=le)) for le in les]
    n = delta(f"{name}_count")
    total = delta(f"{name}_sum")
    out: dict[str, Any] = {"n": int(n), "sum_s": round(total, 3),
                           "mean_ms": round(total / n * 1000, 2) if n else None}
    # The max is only known to its bucket: the bound of the lowest one holding every count.
    out["max_le_ms"] = next((round(upper * 1000, 1) if upper != float("inf") else "+Inf"
                             for upper, count in cum if n and count >= n), None)
    for q in quantiles:
        rank, lower, below = q / 100 * n, 0.0, 0.0
        value = le_ms = None
        for upper, count in cum:
            if n and count >= rank:
                if upper == float("inf"):  # past the last finite bucket: its bound, as PromQL
                    value, le_ms = lower, "+Inf"
                else:
                    span = count - below
                    value = lower + (upper - lower) * ((rank - below) / span if span else 1)
                    le_ms = round(upper * 1000, 1)
                break
            lower, below = upper, count
        out[f"p{q:g}_ms"] = None if value is None else round(value * 1000, 2)
        out[f"p{q:g}_le_ms"] = le_ms
    return out


class PingProbe:
    """A thread pinging gqd every `every_s` on its own connection, timing each round trip:
    what a node's heartbeat or a job's end report would wait meanwhile."""

    def __init__(self, cfg, every_s: float = 0.02):
        import threading
        self.cfg, self.every_s = cfg, every_s
        self.rtts: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from gq.client import Client
        with Client(self.cfg, timeout_s=600) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                client.ping()
                self.rtts.append(time.perf_counter() - t0)
                self.stop.wait(self.every_s)

    def __enter__(self) -> "PingProbe":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=600)

    def summary(self) -> dict[str, Any]:
        return dict(summary_ms(self.rtts)) if self.rtts else {"n": 0}


# --- the Slurm peer ---------------------------------------------------------------------------

SLURM_PEER = REPO.parent / "shared" / "peers" / "slurm"


class SlurmPeer:
    """The real Slurm 22.05 peer: start.sh (PROFILE, NODES, GPUS), sbatch/squeue/scancel with
    its SLURM_CONF, stop.sh. Needs root and Debian's slurm-wlm and munge."""

    def __init__(self, peer_dir: Path = SLURM_PEER, profile: str = "fast", nodes: int = 2,
                 gpus: int = 8):
        self.dir = Path(peer_dir)
        self.run_dir = Path(tempfile.mkdtemp(prefix="gqbench-slurm-"))
        self.env = dict(os.environ, PROFILE=profile, NODES=str(nodes), GPUS=str(gpus),
                        GQ_SLURM_RUN=str(self.run_dir))
        self.profile, self.nodes, self.gpus = profile, nodes, gpus

    BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue")

    @classmethod
    def missing(cls) -> str | None:
        if os.geteuid() == 0 and any(shutil.which(b) is None for b in cls.BINARIES):
            # A fresh machine: install the peer's packages as its README says (root only).
            say("[slurm] installing slurm-wlm and munge with apt-get")
            for argv in (["apt-get", "update", "-qq"],
                         ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
                subprocess.run(argv, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        for b in cls.BINARIES:
            if shutil.which(b) is None:
                return f"{b} not found (apt-get install -y slurm-wlm munge)"
        if os.geteuid() != 0:
            return "the Slurm peer needs root"
        if not (SLURM_PEER / "start.sh").is_file():
            return f"no Slurm peer at {SLURM_PEER}"
        return None

    def start(self) -> float:
        t0 = time.perf_counter()
        proc = subprocess.run([str(self.dir / "start.sh")], env=self.env, capture_output=True,
                              text=True, timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"slurm start.sh failed: {(proc.stderr or proc.stdout)[-800:]}")
        conf = self.run_dir / "etc" / "slurm.conf"
        self.env["SLURM_CONF"] = str(conf)
        self.outdir = self.run_dir / "out" / "gqbench"
        self.outdir.mkdir(parents=True, exist_ok=True)
        return round(time.perf_counter() - t0, 2)

    def stop(self) -> None:
        subprocess.run([str(self.dir / "stop.sh")], env=dict(self.env, CLEAN="1"),
                       capture_output=True, text=True, timeout=120)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def sh(self, argv: list[str], check: bool = True) -> str:
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, cwd=self.outdir)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: rc {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout).strip()[-400:]}")
        return proc.stdout

    def queued(self) -> int:
        return len(self.sh(["squeue", "-h", "-r", "-o", "%i"]).split())

    def wait_empty(self, timeout_s: float = 300.0, poll_s: float = 0.2) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.queued():
                return True
            time.sleep(poll_s)
        return False
