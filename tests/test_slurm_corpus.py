"""The Slurm corpus (tests/slurm_corpus/, issue 15 Done-when 1): real GPU `#SBATCH` scripts from
public repositories, submitted unchanged with gq's own `sbatch` to a personal cluster of four
nodes that models the site the Slurm 22.05 peer ran them on, and compared with what Slurm gave
them (tests/slurm_corpus/expected/).

One cluster per site (A, B: MANIFEST.md "Site config the scripts need"), started only when one
of its cases runs; every runnable case of a site is submitted at once and waited for together,
then each case's test checks its own jobs: the state and exit code of each job (each array
task), its partition, QOS, account, node count and AllocTRES (gq's `sacct`), the output files' names, and
what the stand-in payload printed: the `SLURM_*` values Slurm gave (after putting this run's ids,
directories and node names for the peer's), the number of GPUs in `CUDA_VISIBLE_DEVICES`.

Scripts that call `srun` need job steps (issue 15 Done-when 2): they run once gq has `srun`
and are skipped, with that reason, until then.

What the peer did that a gq run must not copy (MANIFEST.md "Where the peer differs"): its four
slurmd ran on one host (`hostname` is `vm` there), so hosts are not compared; it had no device
cgroups, so `CUDA_VISIBLE_DEVICES` held the node's own GPU indices (`1,2` when GPU 0 was busy),
which a cluster with `ConstrainDevices` renumbers from 0. gq gives the node's own indices too (its
device cgroup denies the other GPUs' files; gq.1 ENVIRONMENT), so the indices depend on which
GPUs were free: only their number is compared.
`SLURM_TMPDIR` is a site convention (the peer's TaskProlog: one directory per job); gq has no
TaskProlog, so the site's submit environment names a BASH_ENV file that makes one per job and
node (TASK_PROLOG below), as a node-local scratch is on a real cluster: one shared by a
multi-node job's tasks, or by an array's tasks, made their `cp` into it race (EEXIST).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gq import config as config_mod
from gq.slurm import shims
from tests.conftest import LiveCluster, prepare, running
from tests.slurm_corpus_differences import (DIFFERENCES, EXPECTED_FAILURES, GPU_LISTS,
                                            NOT_COMPARED, PER_TASK, STEP_UNSET, random_args)

CORPUS = Path(__file__).parent / "slurm_corpus"
CASES: dict[str, dict[str, Any]] = {
    name: case for name, case in json.loads((CORPUS / "cases.json").read_text()).items()
    if not name.startswith("_")}

#: gq has job steps once it ships an `srun`.
HAS_SRUN = "srun" in shims.COMMANDS or importlib.util.find_spec("gq.slurm.srun") is not None
SRUN_REASON = "needs job steps (srun): issue 15 Done-when 2"

#: How long all of a site's jobs may take together (they queue for the same nodes).
SITE_DEADLINE_S = 240.0

# ------------------------------------------------------------------ the two sites

#: Per site, its nodes (peer/nodes-A.conf.in, nodes-B.conf.in): 192 CPUs, 2 500 000 MB and 8
#: GPUs of one type each; the VRAM is the model's.
SITES: dict[str, list[str]] = {
    "A": [f"n{i}:cpus=192,mem=2500000M,gpus=8xa100:80G,features=gpu+gpu80+a100" for i in (1, 2)]
    + [f"n{i}:cpus=192,mem=2500000M,gpus=8xl40s:48G,features=gpu+C6+M12+l40s" for i in (3, 4)],
    "B": [f"n{i}:cpus=192,mem=2500000M,gpus=8xv100:32G,features=gpu+v100" for i in (1, 2)]
    + [f"n{i}:cpus=192,mem=2500000M,gpus=8xrtx8000:48G,features=gpu+rtx8000" for i in (3, 4)],
}
#: The peer's partitions (slurm.conf.in): `gpu` the default, all over n1..n4 but `bf`.
PARTITIONS = ("gpu", "bf", "train", "llmc", "xyz-cluster", "hopper-prod", "gputest",
              "gpumedium", "dept_gpu", "owners", "normal")
#: The peer's QOS; `normal` is every partition's default.
QOS = ("normal", "high", "debug_preempt", "turing", "regular")
#: The peer's cluster name, which jobs see as SLURM_CLUSTER_NAME.
CLUSTER_NAME = "gqpeer"


def _site_config(cfg: config_mod.Config) -> None:
    cfg.head.cluster_name = CLUSTER_NAME
    cfg.qos = {name: config_mod.QosConfig(priority=10) for name in QOS}
    cfg.partition = {name: config_mod.PartitionConfig(
        nodes=["n[1-2]"] if name == "bf" else ["n[1-4]"], default=name == "gpu",
        default_qos="normal") for name in PARTITIONS}


def _site_toml(cfg: config_mod.Config) -> str:
    """The sections `to_toml` leaves out (it writes what `gq up` owns): QOS and partitions."""
    lines = []
    for name, qos in cfg.qos.items():
        lines += [f'[qos."{name}"]', f"priority = {qos.priority}", ""]
    for name, part in cfg.partition.items():
        nodes = ", ".join(json.dumps(n) for n in part.nodes)
        lines += [f'[partition."{name}"]', f"nodes = [{nodes}]",
                  f"default = {'true' if part.default else 'false'}",
                  f'default_qos = "{part.default_qos}"', ""]
    return "\n".join(lines)


def uses_srun(text: str) -> bool:
    """The script runs `srun` somewhere (a comment's mention does not count)."""
    return any(re.search(r"(^|[\s;&|(`$\"'])srun(\s|$)", line)
               for line in text.splitlines() if not line.lstrip().startswith("#"))


def _params() -> list[Any]:
    out = []
    for name in sorted(CASES):
        marks = []
        if uses_srun((CORPUS / f"{name}.sbatch").read_text()) and not HAS_SRUN:
            marks.append(pytest.mark.skip(reason=SRUN_REASON))
        out.append(pytest.param(name, marks=marks, id=name))
    return out


def _runnable(name: str) -> bool:
    return HAS_SRUN or not uses_srun((CORPUS / f"{name}.sbatch").read_text())


# ------------------------------------------------------------------ running a site's cases


@dataclass
class Run:
    """One case submitted: where it ran and what came of it."""

    name: str
    base: Path  # the case's directory: sub/ (the submit dir), home/, tmpdir/, its siblings
    submit: subprocess.CompletedProcess[str] | None = None
    job_ids: list[str] = field(default_factory=list)  # Slurm's JobIDRaw order of the peer
    rows: list[dict[str, str]] = field(default_factory=list)  # gq's sacct, one a job
    skip: str | None = None  # why it was not submitted (a fixture this host cannot have)

    @property
    def sub(self) -> Path:
        return self.base / "sub"

    @property
    def home(self) -> Path:
        return self.base / "home"


ROW_FIELDS = ("JobID", "JobIDRaw", "State", "ExitCode", "Partition", "QOS", "Account",
              "NNodes", "NodeList", "AllocTRES")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class Site:
    """A site's personal cluster, started on first use; its runnable cases submitted together."""

    def __init__(self, name: str, root: Path, stack: contextlib.ExitStack) -> None:
        self.name, self.root, self.stack = name, root, stack
        self.runs: dict[str, Run] | None = None
        self.failed: str | None = None
        self.live: LiveCluster | None = None
        self.bin = root / "slurm-bin"

    def run(self, case: str) -> Run:
        if self.failed is not None:  # one start per site: the later cases fail the same way
            pytest.fail(f"site {self.name} did not run: {self.failed}")
        if self.runs is None:
            try:
                self.runs = self._run_all()
            except BaseException as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
                raise
        return self.runs[case]

    def _run_all(self) -> dict[str, Run]:
        live = prepare(self.root)
        live.configure(_site_config)
        with open(live.config_path, "a") as f:
            f.write("\n" + _site_toml(_configured()) + "\n")
        up = tuple(w for node in SITES[self.name] for w in ("--node", node))
        self.live = self.stack.enter_context(running(live, nodes=4, up_args=up))
        assert sorted(n["name"] for n in self.live.nodes()) == ["n1", "n2", "n3", "n4"]
        assert live.gq("compat", "--dir", str(self.bin)).returncode == 0
        names = [n for n in sorted(CASES) if CASES[n]["site"]["config"] == self.name
                 and _runnable(n)]
        runs = {n: self._submit(n) for n in names}
        self._wait(runs)
        return runs

    def env(self, run: Run) -> dict[str, str]:
        """A clean submit environment, as the peer's (expected/*.json `submit.env`), with what
        gq's commands need to find this cluster."""
        corpus = f"{CORPUS / 'bin'}:{CORPUS / 'stubs'}"
        assert self.live is not None
        env = {"CORPUS_PATH": corpus, "HOME": str(run.home), "LANG": "C.UTF-8",
               "LOGNAME": os.environ.get("LOGNAME", "root"), "SHELL": "/bin/bash",
               "USER": os.environ.get("USER", "root"),
               "PATH": f"{corpus}:{self.bin}:{os.environ['PATH']}",
               **{k: self.live.env[k] for k in ("XDG_STATE_HOME", "XDG_RUNTIME_DIR",
                                                "GQ_TIMEOUT")}}
        case = CASES[run.name]
        env.update(case.get("env", {}))
        # The site's per-job scratch (the peer's TaskProlog gives every job one; cases.json
        # names the cases that read it): made by every bash of the job, on its node.
        prolog = self.root / "task-prolog.sh"
        if not prolog.exists():
            prolog.write_text(TASK_PROLOG)
        env["BASH_ENV"] = str(prolog)
        env["CORPUS_TMPDIR"] = str(run.base / "tmpdir")
        return env

    def _submit(self, name: str) -> Run:
        case = CASES[name]
        run = Run(name, self.root / "corpus-runs" / name)
        run.skip = _fixtures(run, case, self.stack)
        if run.skip:
            return run
        argv = ["sbatch", "--parsable", *case.get("sbatch_args", []),
                str(CORPUS / f"{name}.sbatch"), *case.get("script_args", [])]
        run.submit = subprocess.run(argv, cwd=run.sub, env=self.env(run), capture_output=True,
                                    text=True, timeout=60)
        return run

    def _wait(self, runs: dict[str, Run]) -> None:
        """Until every submitted job (every array task) has ended, by gq's own sacct."""
        submitted = {n: r for n, r in runs.items() if r.submit and r.submit.returncode == 0}
        if not submitted:
            return
        deadline = time.monotonic() + SITE_DEADLINE_S
        while True:
            ids = ",".join(r.submit.stdout.strip().split(";")[0] for r in submitted.values()
                           if r.submit)
            rows = self.sacct(next(iter(submitted.values())), ids)
            by_raw = {row["JobIDRaw"]: row for row in rows}
            for run in submitted.values():
                assert run.submit is not None
                first = run.submit.stdout.strip().split(";")[0]
                # The jobs (array tasks), not their steps (`280_1.0`, as Slurm names them).
                run.rows = [row for row in by_raw.values() if "." not in row["JobIDRaw"] and (
                    row["JobIDRaw"] == first or row["JobID"].split("_")[0] == first)]
            if all(r.rows and len(r.rows) == _expected_jobs(n) and all(
                    row["State"] in TERMINAL for row in r.rows) for n, r in submitted.items()):
                return
            if time.monotonic() > deadline:
                left = {n: [(row["JobID"], row["State"]) for row in r.rows]
                        for n, r in submitted.items()
                        if not all(row["State"] in TERMINAL for row in r.rows)}
                assert self.live is not None
                pytest.fail(f"site {self.name}: jobs not ended after {SITE_DEADLINE_S:.0f}s: "
                            f"{left}\n{self.live.log('gqd')[-3000:]}")
            time.sleep(0.25)

    def sacct(self, run: Run, ids: str) -> list[dict[str, str]]:
        out = subprocess.run(["sacct", "-P", "-n", "-j", ids, "--format=" + ",".join(ROW_FIELDS)],
                             cwd=run.sub, env=self.env(run), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return [dict(zip(ROW_FIELDS, line.split("|"))) for line in out.stdout.splitlines()]


def _nodes_for(case: dict[str, Any]) -> set[str]:
    """The site's nodes with every feature and GPU type the case's script asks for."""
    site = case["site"]
    types = {g.split(":")[1] for g in site.get("gres", []) if ":" in g}
    out = set()
    for node in SITES[site["config"]]:
        name, _, rest = node.partition(":")
        shape = dict(item.split("=", 1) for item in rest.split(","))
        has = set(shape["features"].split("+")) | {shape["gpus"].split("x")[1].split(":")[0]}
        if set(site.get("features", [])) | types <= has:
            out.add(name)
    return out


def _configured() -> config_mod.Config:
    cfg = config_mod.Config()
    _site_config(cfg)
    return cfg


def _expected(name: str) -> dict[str, Any]:
    return json.loads((CORPUS / "expected" / f"{name}.json").read_text())


def _expected_jobs(name: str) -> int:
    return len(_expected(name)["summary"]["jobs"])


def _fixtures(run: Run, case: dict[str, Any], stack: contextlib.ExitStack) -> str | None:
    """The case's directories and files (cases.json), its HOME with the site's .bashrc and
    .bash_profile (the latter puts CORPUS_PATH back on the PATH after /etc/profile); why not,
    when an absolute one cannot be made here."""
    for d in (run.sub, run.home):
        d.mkdir(parents=True)
    (run.home / ".bashrc").write_text("# corpus fixture\n")
    (run.home / ".bash_profile").write_text(
        '[ -f ~/.bashrc ] && . ~/.bashrc\nexport PATH="$CORPUS_PATH:$PATH"\n')
    for d in case.get("dirs", []):
        (run.sub / d).mkdir(parents=True, exist_ok=True)
    for path, text in case.get("files", {}).items():
        (run.sub / path).parent.mkdir(parents=True, exist_ok=True)
        (run.sub / path).write_text(text)
    for path, text in case.get("home_files", {}).items():
        (run.home / path).write_text(text)
    try:
        for d in case.get("abs_dirs", []):
            _make_abs(Path(d), stack)
        for path, text in case.get("abs_files", {}).items():
            _make_abs(Path(path).parent, stack)
            Path(path).write_text(text)
    except OSError as exc:
        return f"cannot make the case's absolute fixture: {exc}"
    return None


def _make_abs(directory: Path, stack: contextlib.ExitStack) -> None:
    """An absolute fixture directory; the topmost one this made goes when the module ends."""
    top = directory
    while not top.parent.exists():
        top = top.parent
    if top.exists():
        return
    directory.mkdir(parents=True)
    stack.callback(shutil.rmtree, top, ignore_errors=True)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Site]]:
    with contextlib.ExitStack() as stack:
        yield {name: Site(name, tmp_path_factory.mktemp(f"site{name}"), stack)
               for name in SITES}


# ------------------------------------------------------------------ comparing with the peer


def standin_records(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The stand-in's records in these files: tag -> argv, cwd, env, the files it reached."""
    records: dict[str, dict[str, Any]] = {}
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            # (after srun -l's `N: ` when a task's lines are labelled)
            m = re.match(r"(?:\s*\d+: )?STANDIN (\S+) (argv|host|cwd|end|env (\S+)) (.*)$", line)
            if not m:
                continue
            rec = records.setdefault(m[1], {"env": {}, "files": set()})
            rec["files"].add(str(path))
            value = json.loads(m[4])
            if m[3]:
                rec["env"][m[3]] = value
            else:
                rec[m[2]] = value
    return records


class Names:
    """The peer's ids, directories and node names, and this run's, to put one for the other."""

    def __init__(self, expected: dict[str, Any], run: Run, rows: dict[str, dict[str, str]]
                 ) -> None:
        ph = expected["placeholders"]
        self.pairs: list[tuple[str, str]] = [(ph["SUBMIT_DIR"], str(run.sub)),
                                             (ph["HOME"], str(run.home)),
                                             (str(Path(ph["SUBMIT_DIR"]).parent), str(run.base))]
        self.tmpdir = str(run.base / "tmpdir")
        self.ids: dict[str, str] = {}  # peer JobIDRaw -> gq's
        self.array: dict[str, str] = {}  # peer array id -> gq's
        self.nodes: dict[str, dict[str, str]] = {}  # per peer job id: peer node -> gq node
        for job in expected["summary"]["jobs"]:
            row = rows[_index(job["job_id"])]
            self.ids[job["raw_id"]] = row["JobIDRaw"]
            if "_" in job["job_id"]:
                self.array[job["job_id"].split("_")[0]] = row["JobID"].split("_")[0]
            self.nodes[job["raw_id"]] = dict(zip(_hosts(job["nodelist"]),
                                                 _hosts(row["NodeList"])))

    def path(self, value: str) -> str:
        """A path or a file name: directories, and job ids in `%j`/`%A_%a` places."""
        for old, new in self.pairs:
            value = value.replace(old, new)

        def job_id(m: re.Match[str]) -> str:
            # `280_5`: an array's id (in Slurm also the raw id of one of its tasks); else a job's.
            if m[0] in self.array and re.match(r"_\d", m.string[m.end():]):
                return self.array[m[0]]
            return self.ids.get(m[0], m[0])
        return re.sub(r"(?<!\d)\d+(?!\d)", job_id, value)

    def arg(self, value: str, raw_id: str) -> str:
        """An argument of the stand-in as this run should have it: `path`'s, and the node
        names of the job (`--role n1:`, `--rdzv_endpoint n1:6000`: the script read them from
        SLURMD_NODENAME or `scontrol show hostnames`) as they are here."""
        nodes = self.nodes.get(raw_id, {})
        return re.sub(r"(?<![\w-])n\d+(?![\w-])", lambda m: nodes.get(m[0], m[0]),
                      self.path(value))

    def value(self, key: str, value: str, raw_id: str) -> str:
        """The peer's value of variable `key` as this run should have it."""
        if key in ("SLURM_JOB_ID", "SLURM_JOBID"):
            return self.ids.get(value, value)
        if key == "SLURM_ARRAY_JOB_ID":
            return self.array.get(value, value)
        if key == "SLURM_TMPDIR":  # the peer's /tmp/corpus-slurm-tmpdir/JOBID
            return f"{self.tmpdir}/{self.ids.get(Path(value).name, value)}"
        for old, new in self.pairs:
            value = value.replace(old, new)
        nodes = self.nodes.get(raw_id, {})
        hosts = _hosts(value) if key in NODE_KEYS else []
        if hosts and all(h in nodes for h in hosts):
            from gq.hostlist import compress
            return compress([nodes[h] for h in hosts])
        return value


#: Variables that name nodes.
NODE_KEYS = {"SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
             "SLURM_STEP_NODELIST", "SLURM_LAUNCH_NODE_IPADDR", "MASTER_ADDR", "HOSTNAME"}


def _index(job_id: str) -> str:
    """`280_5` -> `5` (an array task by its index), `266` -> `` (the one job)."""
    return job_id.partition("_")[2]


def _hosts(text: str) -> list[str]:
    from gq.hostlist import expand
    return expand(text) if text and text != "None assigned" else []


def _gpus(value: str) -> int:
    return len([g for g in value.split(",") if g])


#: The site's TaskProlog, as a BASH_ENV file: a scratch directory per job and node.
TASK_PROLOG = """# corpus site: SLURM_TMPDIR per job and node (the peer's TaskProlog made one per job)
if [ -n "${CORPUS_TMPDIR:-}" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    export SLURM_TMPDIR="$CORPUS_TMPDIR/$SLURM_JOB_ID/${SLURMD_NODENAME:-batch}"
    mkdir -p "$SLURM_TMPDIR"
fi
"""


def compare_env(want: dict[str, str], got: dict[str, str], names: Names, raw_id: str
                ) -> list[tuple[str, str | None, str | None]]:
    """Where a task's SLURM_* and GPU variables differ from the peer's: (variable, gq's value,
    Slurm's), None for unset."""
    out = []
    for key in sorted(set(want) | set(got)):
        if key in NOT_COMPARED or not (key.startswith("SLURM") or key in GPU_LISTS):
            continue
        slurm = names.value(key, want[key], raw_id) if key in want else None
        mine = got.get(key)
        if slurm is not None and mine is not None and key in GPU_LISTS:
            if _gpus(slurm) != _gpus(mine):
                out.append((key, mine, slurm))
        elif key == "SLURM_TMPDIR" and slurm and mine and mine.startswith(slurm + "/"):
            continue  # the job's scratch, on the node that runs this task (TASK_PROLOG)
        elif slurm != mine:
            out.append((key, mine, slurm))
    return out


class Differences:
    """A case's mismatches, less those DIFFERENCES lists for it (with exactly gq's value)."""

    def __init__(self, name: str) -> None:
        steps = uses_srun((CORPUS / f"{name}.sbatch").read_text())
        self.listed = {**({key: (None, why) for key, why in STEP_UNSET.items()} if steps else {}),
                       **DIFFERENCES.get(name, {})}
        self.seen: set[str] = set()
        self.problems: list[str] = []
        self.step_unset = set(STEP_UNSET) if steps else set()
        self.step_compared = False  # a step's task was compared (STEP_UNSET can be checked)

    def add(self, where: str, key: str, mine: str | None, slurm: str | None) -> None:
        listed = self.listed.get(key)
        if listed is not None and (listed[0] == mine or (listed[0] is PER_TASK
                                                          and mine is not None)):
            self.seen.add(key)
            return
        self.problems.append(f"{where}: {key} {mine!r}, Slurm: {slurm!r}")

    def stale(self) -> list[str]:
        return [f"DIFFERENCES lists {key} = {self.listed[key][0]!r}, but gq gives what Slurm "
                f"does (or another value): update the table" for key in self.listed
                if key not in self.seen
                and (self.step_compared or key not in self.step_unset)]


@pytest.mark.parametrize("name", _params())
def test_corpus_script_runs_as_on_slurm(name: str, sites: dict[str, Site]) -> None:
    case, expected = CASES[name], _expected(name)
    site = sites[case["site"]["config"]]
    run = site.run(name)
    if run.skip:
        pytest.skip(run.skip)
    assert run.submit is not None and run.submit.returncode == 0, \
        f"sbatch refused {name}: {run.submit and run.submit.stderr}"
    rows = {_index(row["JobID"]): row for row in run.rows}
    summary = expected["summary"]
    assert sorted(rows) == sorted(_index(j["job_id"]) for j in summary["jobs"]), run.rows
    names = Names(expected, run, rows)
    files = sorted(p for p in run.base.rglob("*") if p.is_file()
                   and run.home not in p.parents and run.base / "tmpdir" not in p.parents)
    if name in EXPECTED_FAILURES:
        symptom, reason = EXPECTED_FAILURES[name]
        states = {row["State"] for row in run.rows}
        assert states != {"COMPLETED"}, f"{name} now completes: remove it from EXPECTED_FAILURES"
        text = "".join(p.read_text(errors="replace") for p in files)
        assert re.search(symptom, text), f"{name} failed ({states}) without {symptom!r}:\n{text}"
        pytest.xfail(reason)
    diffs = Differences(name)
    problems = diffs.problems
    for job in summary["jobs"]:
        row = rows[_index(job["job_id"])]
        ref = row["JobID"]
        for key, want in (("State", job["state"]), ("ExitCode", job["exit_code"]),
                          ("Partition", job["partition"]), ("QOS", job["qos"]),
                          ("Account", job["account"]), ("AllocTRES", job["alloc_tres"]),
                          ("NNodes", str(len(_hosts(job["nodelist"]))))):
            if row[key] != want:
                diffs.add(ref, key, row[key], want)
        # A typed or constrained request lands on nodes that have what it names (which of
        # them is the scheduler's choice).
        allowed = _nodes_for(case)
        if not set(_hosts(row["NodeList"])) <= allowed:
            problems.append(f"{ref}: on {row['NodeList']}, which lack what it asks for "
                            f"(nodes that have it: {sorted(allowed)})")
    # The files the jobs wrote, by name (relative to the submit dir, else absolute).
    abs_dirs = [Path(d) for d in case.get("abs_dirs", [])]
    written = {str(p.relative_to(run.sub)) if run.sub in p.parents else str(p) for p in files}
    for d in abs_dirs:
        written |= {str(p) for p in d.rglob("*") if p.is_file()}
    want_files = {names.path(f) for f in summary["outputs"]}
    if written != want_files:
        problems.append(f"output files {sorted(written)}, Slurm: {sorted(want_files)}")
    # What the stand-in printed, per job and task, against the peer's records.
    outputs = [p for p in files if p.suffix != ".sh" and p.name not in case.get("files", {})]
    outputs += [p for d in abs_dirs for p in d.rglob("*") if p.is_file()]
    got = standin_records(outputs)
    wanted: set[str] = set()
    for rec in expected["standin"]:
        raw, step, procid = rec["tag"].split(":")[0].split(".")
        mine = names.ids.get(raw, raw)
        found = [r for tag, r in got.items() if tag.split(":")[0] == f"{mine}.{step}.{procid}"]
        if len(found) != 1:
            problems.append(f"stand-in of {mine}.{step}.{procid}: {len(found)} records, "
                            f"Slurm: 1 (records: {sorted(got)})")
            continue
        mine_rec = found[0]
        wanted.add(f"{mine}.{step}.{procid}")
        want_argv = random_args(name, [names.arg(a, raw) for a in rec["argv"]])
        if random_args(name, mine_rec.get("argv") or []) != want_argv:
            problems.append(f"{mine}.{step}.{procid}: argv {mine_rec.get('argv')}, Slurm: "
                            f"{want_argv}")
        if mine_rec.get("cwd") != names.path(rec["cwd"]):
            problems.append(f"{mine}.{step}.{procid}: cwd {mine_rec.get('cwd')!r}")
        diffs.step_compared |= step != "batch"
        for key, value, slurm in compare_env(rec["env"], mine_rec["env"], names, raw):
            diffs.add(f"{mine}.{step}.{procid}", key, value, slurm)
    extra = sorted({tag.split(":")[0] for tag in got} - wanted)
    if extra and len(wanted) == len(expected["standin"]):
        problems.append(f"stand-in records Slurm did not have: {extra}")
    problems += diffs.stale()
    if problems:  # what the jobs printed says why (a step's error, a missing file)
        shown = "".join(f"\n--- {p}:\n" + p.read_text(errors="replace")[-2000:] for p in files
                        if p.suffix != ".sh")
        pytest.fail(f"{name} differs from Slurm:\n  " + "\n  ".join(problems) + shown)
