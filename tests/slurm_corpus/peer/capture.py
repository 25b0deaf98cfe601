#!/usr/bin/env python3
"""Run the corpus on the corpus peer (real Slurm 22.05, see start.sh) and record what Slurm gave
each job, step and task into ../expected/NAME.json.

    ./start.sh && python3 capture.py [NAME ...] ; ./stop.sh

Each script is submitted from a fresh directory under /tmp/corpus-runs/NAME/sub with a clean
environment (PATH = corpus bin + stubs + system), as cases.json says. The environment of every
task (the batch script included) comes from the peer's TaskProlog; SLURM_RLIMIT_* and
SLURM_SCRIPT_CONTEXT are dropped from it because they exist only inside the TaskProlog.
Absolute fixture paths (e.g. /fsx/...) are created for the run and removed afterwards.
"""
import json
import re
import os
import pathlib
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE.parent
RUN = pathlib.Path(os.environ.get("CORPUS_SLURM_RUN", "/tmp/corpus-slurm-run"))
WORK = pathlib.Path("/tmp/corpus-runs")
SLURM_CONF = str(RUN / "etc/slurm.conf")
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
         "BOOT_FAIL", "DEADLINE"}
SACCT_FIELDS = ("JobID,JobIDRaw,JobName,Partition,Account,QOS,State,ExitCode,DerivedExitCode,NNodes,"
                "NTasks,NCPUS,NodeList,ReqTRES,AllocTRES,Elapsed,Submit,Start,End,WorkDir")
BASH_PROFILE = """# corpus fixture: a login shell (#!/bin/bash -l) re-reads /etc/profile, which resets PATH;
# like a user's own ~/.bash_profile, this puts the corpus stand-in and stubs back on it.
[ -n "$CORPUS_PATH" ] && PATH="$CORPUS_PATH:$PATH"
[ -f ~/.bashrc ] && . ~/.bashrc
"""
#: `srun -l` puts the task number in front of each line: "3: text"
LABEL = re.compile(r"^\s*\d+: ")
DROP = ("SLURM_RLIMIT_", "SLURM_SCRIPT_CONTEXT")
#: set by the bash that runs the TaskProlog, not by Slurm
SHELL_ARTEFACTS = {"_", "SHLVL", "PWD", "OLDPWD"}


def sh(args, **kw):
    env = dict(os.environ, SLURM_CONF=SLURM_CONF)
    return subprocess.run(args, capture_output=True, text=True, env=env, **kw)


def parse_env(raw: bytes) -> dict:
    out = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.decode(errors="replace").split("=", 1)
            if not k.startswith(DROP) and k not in SHELL_ARTEFACTS:
                out[k] = v
    return out


def sacct_rows(job_id: str) -> list:
    r = sh(["sacct", "-j", job_id, "-P", "-n", "--format=" + SACCT_FIELDS])
    names = SACCT_FIELDS.split(",")
    return [dict(zip(names, line.split("|"))) for line in r.stdout.splitlines() if line]


def wait_done(job_id: str, timeout: float) -> list:
    deadline = time.time() + timeout
    rows: list = []
    while time.time() < deadline:
        if not sh(["squeue", "-h", "-r", "-j", job_id, "-o", "%i"]).stdout.strip():
            rows = sacct_rows(job_id)
            jobs = [r for r in rows if "." not in r["JobID"]]
            if jobs and all(r["State"].split()[0] in FINAL for r in rows):
                # slurmdbd fills in name, partition and QOS a moment after a short job ends
                if all(r["Partition"] for r in jobs):
                    return rows
        time.sleep(1)
    return sacct_rows(job_id)


def collect_files(roots: list, skip: pathlib.Path) -> dict:
    files = {}
    for root in roots:
        for p in sorted(pathlib.Path(root).rglob("*")):
            if p.is_file() and skip not in p.parents:
                try:
                    files[str(p)] = p.read_text(errors="replace")[:200000]
                except OSError as exc:
                    files[str(p)] = f"<unreadable: {exc}>"
    return files


def standin_lines(text: str):
    """The whole STANDIN lines of an output file. `srun -u` forwards output as it is read, in
    messages of at most 1024 bytes, so a line can arrive in pieces, each with its own `srun -l`
    label: a piece that does not parse is joined to the next piece with the same label."""
    pending: dict = {}
    for raw in text.splitlines():
        m = LABEL.match(raw)
        label, line = (m.group(0), raw[m.end():]) if m else ("", raw)
        if label in pending:
            line = pending.pop(label) + line
        elif not line.startswith("STANDIN "):
            if line and "STANDIN ".startswith(line):  # the piece before a cut: "STAN"
                pending[label] = line
            continue
        try:
            _, tag, rest = line.split(" ", 2)
            json.loads(rest.split(" ", 2)[-1] if rest.startswith("env ") else rest.split(" ", 1)[1])
        except (ValueError, IndexError):
            pending[label] = line
            continue
        yield tag, rest


def parse_standin(files: dict) -> list:
    """The records bin/standin printed, from every file, with the file each line was in."""
    recs: dict = {}
    for path, text in files.items():
        for tag, rest in standin_lines(text):
            rec = recs.setdefault(tag, {"tag": tag, "env": {}, "files": {}})
            rec["files"][path] = rec["files"].get(path, 0) + 1  # lines of this record per file
            if rest.startswith("env "):
                key, value = rest[4:].split(" ", 1)
                rec["env"][key] = json.loads(value)
            else:
                key, value = rest.split(" ", 1)
                rec[key] = json.loads(value)
    for rec in recs.values():
        # whole in at least one file (`| tee` puts a second copy in another file)
        rec["complete"] = rec.get("end") in rec["files"].values()
    return sorted(recs.values(), key=lambda r: r["tag"])


def run_case(name: str, case: dict, meta: dict) -> dict:
    made: list = []  # the topmost directories this run creates, removed at the end
    try:
        return _run_case(name, case, meta, made)
    finally:
        for top in made:
            shutil.rmtree(top, ignore_errors=True)


def _run_case(name: str, case: dict, meta: dict, made: list) -> dict:
    base = WORK / name
    shutil.rmtree(base, ignore_errors=True)
    sub, home = base / "sub", base / "home"
    sub.mkdir(parents=True)
    home.mkdir()
    (home / ".bashrc").write_text("# corpus fixture: the user's ~/.bashrc\n")
    (home / ".bash_profile").write_text(BASH_PROFILE)
    for d in case.get("dirs", []):
        (sub / d).mkdir(parents=True, exist_ok=True)
    for rel, text in case.get("files", {}).items():
        (sub / rel).parent.mkdir(parents=True, exist_ok=True)
        (sub / rel).write_text(text)
    for rel, text in case.get("home_files", {}).items():
        (home / rel).write_text(text)
    for d in case.get("abs_dirs", []) + [str(pathlib.Path(f).parent) for f in case.get("abs_files", {})]:
        missing = [a for a in [pathlib.Path(d), *pathlib.Path(d).parents] if not a.exists()]
        if missing:
            made.append(missing[-1])
        pathlib.Path(d).mkdir(parents=True, exist_ok=True)
    for f, text in case.get("abs_files", {}).items():
        pathlib.Path(f).write_text(text)
    script = CORPUS / f"{name}.sbatch"
    corpus_path = f"{CORPUS/'bin'}:{CORPUS/'stubs'}"
    env = {"PATH": f"{corpus_path}:/root/.pyenv/shims:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": str(home), "USER": "root", "LOGNAME": "root", "SHELL": "/bin/bash", "LANG": "C.UTF-8",
           "SLURM_CONF": SLURM_CONF, "CORPUS_PATH": corpus_path, **case.get("env", {})}
    argv = ["sbatch", "--parsable", *case.get("sbatch_args", []), str(script), *case.get("script_args", [])]
    t0 = time.time()
    r = subprocess.run(argv, cwd=sub, env=env, capture_output=True, text=True)
    result = {"name": name, "source": meta, "case": case,
              "submit": {"argv": argv, "cwd": str(sub), "env": env, "rc": r.returncode,
                         "stdout": r.stdout, "stderr": r.stderr}}
    job_id = r.stdout.strip().split(";")[0]
    if r.returncode != 0 or not job_id:
        return result
    rows = wait_done(job_id, timeout=240)
    result["wall_s"] = round(time.time() - t0, 1)
    result["sacct"] = rows
    result["scontrol"] = sh(["scontrol", "show", "job", "-d", job_id]).stdout
    jobs = {}
    for row in rows:
        raw = row["JobIDRaw"].split(".")[0]
        jobs.setdefault(raw, {"job_id": row["JobID"].split(".")[0], "steps": {}})
    for raw, job in jobs.items():
        for f in sorted((RUN / "capture/env").glob(f"{raw}.*")):
            e = parse_env(f.read_bytes())
            step = e.get("SLURM_STEP_ID", "batch")
            diff = {k: v for k, v in sorted(e.items()) if env.get(k) != v}
            removed = sorted(k for k in env if k not in e)
            job["steps"].setdefault(step, []).append({"procid": e.get("SLURM_PROCID"), "node": e.get("SLURMD_NODENAME"),
                                                      "env": diff, "removed_from_submit_env": removed})
        for step in job["steps"].values():
            step.sort(key=lambda t: int(t["procid"] or 0))
    result["jobs"] = jobs
    files = collect_files([base] + case.get("abs_dirs", []), skip=home)
    result["files"] = files
    result["standin"] = parse_standin(files)
    mail = RUN / "capture/mail.log"
    result["mail"] = [line for line in (mail.read_text().splitlines() if mail.exists() else [])
                      if any(f"Job_id={j}" in line or f"Job_id={raw}" in line for raw, j in
                             ((k, v["job_id"]) for k, v in jobs.items()))]
    result["placeholders"] = {"SUBMIT_DIR": str(sub), "HOME": str(home), "JOB_IDS": sorted(jobs, key=int)}
    result["summary"] = summarize(result, sub)
    return result


def summarize(result: dict, sub: pathlib.Path) -> dict:
    """The facts a test asserts first: per job (array task) its state and exit code, per step
    its state, exit code and tasks (rank, local rank, node index, node, GPUs), and the output
    files (relative to the submit dir where they are under it)."""
    rows = {r["JobIDRaw"]: r for r in result["sacct"]}
    jobs = []
    for raw, job in sorted(result["jobs"].items(), key=lambda kv: int(kv[0])):
        row = rows.get(raw, {})
        steps = {}
        for step, tasks in job["steps"].items():
            srow = rows.get(f"{raw}.{step}", {})
            steps[step] = {"state": srow.get("State"), "exit_code": srow.get("ExitCode"),
                           "ntasks": len(tasks), "name": srow.get("JobName"),
                           "tasks": [{"procid": t["procid"], "localid": t["env"].get("SLURM_LOCALID"),
                                      "nodeid": t["env"].get("SLURM_NODEID"), "node": t["node"],
                                      "cuda_visible_devices": t["env"].get("CUDA_VISIBLE_DEVICES")}
                                     for t in tasks]}
        jobs.append({"job_id": job["job_id"], "raw_id": raw, "state": row.get("State"),
                     "exit_code": row.get("ExitCode"), "nodelist": row.get("NodeList"),
                     "partition": row.get("Partition"), "qos": row.get("QOS"), "account": row.get("Account"),
                     "alloc_tres": row.get("AllocTRES"), "steps": steps})
    outputs = sorted(str(pathlib.Path(p).relative_to(sub)) if pathlib.Path(p).is_relative_to(sub) else p
                     for p in result["files"])
    return {"jobs": jobs, "outputs": outputs}


def main() -> None:
    cases = json.loads((CORPUS / "cases.json").read_text())
    meta = json.loads((CORPUS / "sources.json").read_text())
    site = (RUN / "site").read_text().strip()
    names = sys.argv[1:] or [n for n in cases if not n.startswith("_") and cases[n]["site"]["config"] == site]
    for name in names:
        res = run_case(name, cases[name], meta[name])
        (CORPUS / "expected" / f"{name}.json").write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
        states = sorted({r["State"] for r in res.get("sacct", []) if "." not in r["JobID"]})
        print(f"{name}: rc={res['submit']['rc']} {res['submit']['stderr'].strip()[:120]} states={states} "
              f"standin={len(res.get('standin', []))} wall={res.get('wall_s')}", flush=True)


if __name__ == "__main__":
    main()
