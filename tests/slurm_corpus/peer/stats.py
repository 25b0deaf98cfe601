#!/usr/bin/env python3
"""Count what the corpus scripts use: #SBATCH options, srun options, SLURM_* variables, Slurm
commands, stubbed commands. Prints the markdown tables of MANIFEST.md ("What the corpus uses")."""
import collections
import json
import pathlib
import re
import shlex

CORPUS = pathlib.Path(__file__).resolve().parent.parent
SHORT = {"-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task", "-p": "--partition", "-t": "--time",
         "-o": "--output", "-e": "--error", "-J": "--job-name", "-A": "--account", "-q": "--qos",
         "-C": "--constraint", "-L": "--licenses", "-D": "--chdir", "-w": "--nodelist", "-x": "--exclude",
         "-a": "--array", "-G": "--gpus", "-l": "--label", "-u": "--unbuffered", "-M": "--clusters"}
STUBS = ["module", "conda", "mamba", "source activate", "get_free_port", "make", "scp", "dcgmi"]


def opt_name(tok: str) -> str:
    name = tok.split("=", 1)[0]
    return SHORT.get(name, name)


def sbatch_opts(text: str) -> list:
    out = []
    for line in text.splitlines()[1:]:
        s = line.strip()
        if s and not s.startswith("#"):
            break  # sbatch stops at the first command
        if line.startswith("#SBATCH"):
            toks = shlex.split(line[len("#SBATCH"):].split(" #")[0], posix=True)
            out += [opt_name(t) for t in toks if t.startswith("-")]
    return out


def srun_opts(text: str) -> list:
    out = []
    joined = re.sub(r"\\\n", " ", text)
    for m in re.finditer(r"\bsrun\b([^\n|;&]*)", joined):
        for tok in m.group(1).split():
            if tok.startswith("$"):
                continue
            if not tok.startswith("-"):
                break
            out.append(opt_name(tok))
    for m in re.finditer(r"SRUN_ARGS=\"([^\"]*)\"", joined):
        out += [opt_name(t) for t in m.group(1).split() if t.startswith("-")]
    return out


def main() -> None:
    cases = json.loads((CORPUS / "cases.json").read_text())
    sb, sr, var, cmd, stub = (collections.Counter() for _ in range(5))
    per_script = {}
    for f in sorted(CORPUS.glob("*.sbatch")):
        text = f.read_text()
        name = f.stem
        body = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
        o = set(sbatch_opts(text)) | {opt_name(a) for a in cases[name].get("sbatch_args", [])}
        sb.update(o)
        so = set(srun_opts(body))
        sr.update(so)
        v = set(re.findall(r"\b(SLURM_[A-Z_]+|SLURMD_NODENAME)\b", body))
        var.update(v)
        c = set()
        if re.search(r"\bsrun\b", body): c.add("srun")
        for k, pat in {"srun CMD (no options)": r"srun (standin|python|torchrun|uv)\b",
                       "srun bash -c": r"srun\b[^\n]*\bbash -c", "srun ... & (background step)": r"srun\b[^\n]*&\s*$",
                       "srun -w NODE (one node)": r"srun\b.*(-w |--nodelist)", "srun ... | tee": r"srun\b[^\n]*\| *tee",
                       "exec srun": r"exec srun",
                       "MASTER_ADDR from scontrol": r"MASTER_ADDR=\$\(scontrol|head_node=|MASTER_ADDR=\$\{?NODELIST"}.items():
            if re.search(pat, re.sub(r"\\\n", " ", body), re.M): c.add(k)
        for k, pat in {"scontrol show hostnames": r"scontrol show hostnames?", "squeue": r"\bsqueue\b",
                       "sbatch (inside)": r"(^|\$\()\s*sbatch\b", "scontrol (other)": r"scontrol (?!show host)",
                       "sacct": r"\bsacct\b", "scancel": r"\bscancel\b"}.items():
            if re.search(pat, body, re.M): c.add(k)
        cmd.update(c)
        st = {s for s in STUBS if re.search(r"(^|[\s(`])" + re.escape(s) + r"\b", body, re.M)}
        st |= {"mamba (in ~/load_env.sh)" for t in cases[name].get("home_files", {}).values() if "mamba" in t}
        stub.update(st)
        per_script[name] = (sorted(o), sorted(so), sorted(v), sorted(c), sorted(st))
    n = len(per_script)
    for title, counter in (("#SBATCH / sbatch options", sb), ("srun options (inside the scripts)", sr),
                           ("SLURM_* variables read", var), ("Slurm commands called and srun forms", cmd),
                           ("commands that need a stub", stub)):
        print(f"\n#### {title} (scripts using it, of {n})\n")
        print(" | ".join(f"`{k}` {v}" for k, v in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))))
    print("\n<!-- per script: options | srun options | variables | commands | stubs -->")
    for name, (o, so, v, c, st) in per_script.items():
        print(f"<!-- {name}: {' '.join(o)} | {' '.join(so)} | {' '.join(v)} | {', '.join(c)} | {', '.join(st)} -->")


if __name__ == "__main__":
    main()
