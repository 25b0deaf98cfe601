"""The sysadmin's side: systemd units that `systemd-analyze verify` accepts (issue 6, Done when
4), and shell completion."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNITS = ("gqd.service", "gqnode.service", "gq-relay.service", "gq-api.service")


def _unit(name: str) -> dict[str, str]:
    """KEY -> value of a unit file (the last one wins, as in systemd)."""
    out = {}
    for line in (REPO / "systemd" / name).read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            out[key.strip()] = value.strip()
    return out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (.ci/run installs it)")
def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path) -> None:
    # Documentation=man:gqd(8) is checked by running man(1): point it at the repo's pages, laid
    # out as a man directory. Without man(1) at all there is nothing to check them with.
    mandir = tmp_path / "man"
    for page in (REPO / "man").iterdir():
        section = mandir / f"man{page.suffix[1:]}"
        section.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, section / page.name)
    man = ["--man=yes"] if shutil.which("man") else ["--man=no"]
    # verify checks that ExecStart's program exists: as scripts/install does for a BINDIR
    # other than /usr/local/bin, point the units at where this gq's programs are.
    bindir = Path(sys.executable).parent
    units = tmp_path / "units"
    units.mkdir()
    for name in UNITS:
        text = (REPO / "systemd" / name).read_text()
        (units / name).write_text(text.replace("/usr/local/bin/", f"{bindir}/"))
    result = subprocess.run(["systemd-analyze", "verify", *man,
                             *(str(units / u) for u in UNITS)],
                            env={**os.environ, "MANPATH": str(mandir)}, capture_output=True,
                            text=True, timeout=60)
    # systemd-analyze also lints units it reaches through dependencies, and complaints about
    # the host's own units are none of ours: only lines naming our units count.
    ours = [ln for ln in (result.stdout + result.stderr).splitlines()
            if any(u in ln for u in UNITS)]
    assert result.returncode == 0 and not ours, result.stdout + result.stderr


def test_units_keep_jobs_alive_and_notify_when_serving() -> None:
    head, node, relay = _unit("gqd.service"), _unit("gqnode.service"), _unit("gq-relay.service")
    for unit in (head, node, relay, _unit("gq-api.service")):
        assert unit["Type"] == "notify" and unit["Restart"] == "on-failure"
        # The installed programs (scripts/install), not whatever `env` finds on root's PATH.
        assert unit["ExecStart"].startswith("/usr/local/bin/gq"), unit["ExecStart"]
    # Restarting gqnode must not kill the jobs' shepherds (they are in its cgroup).
    assert node["KillMode"] == "process"
    assert head["ExecReload"].endswith("kill -HUP $MAINPID")


def test_shell_completion_is_offered() -> None:
    # typer finds the shell to complete for among the command's parents (shellingham): run
    # it from bash, as a user would, not from whatever started the tests (`sh -c` gets "Shell
    # sh not supported").
    result = subprocess.run(["bash", "-c", '"$0" -m gq.cli.main --show-completion; exit $?',
                             sys.executable], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "_gq_completion" in result.stdout and "complete " in result.stdout
    # Completing `gq su` offers `submit`, through the same program.
    done = subprocess.run([sys.executable, "-m", "gq.cli.main"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "_GQ_COMPLETE": "complete_bash",
                                           "COMP_WORDS": "gq su", "COMP_CWORD": "1"})
    assert "submit" in done.stdout.split(), done.stdout + done.stderr


def test_units_keep_state_private_and_do_not_restart_on_a_refused_database() -> None:
    from gq.errors import ExitStatus, StoreRefused
    head, node = _unit("gqd.service"), _unit("gqnode.service")
    for unit in (head, node):
        assert unit["UMask"] == "0077"
        # 0711: jobs execute their scripts, as their owners, from run directories below.
        assert unit["StateDirectoryMode"] == "0711"
    refused = {int(ExitStatus[name]) for name in ExitStatus.__members__
               if name.startswith("STORE_")}
    assert {int(c.exit_status) for c in StoreRefused.__subclasses__()} == refused
    assert set(map(int, head["RestartPreventExitStatus"].split())) == refused
