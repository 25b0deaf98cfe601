# Sourced by scripts/demo and scripts/test: a virtual environment in .venv with gq installed
# (editable, with the test extra), created on first use and refreshed when pyproject.toml or this
# script changes. The editable install is a plain path entry in a .pth file (pyproject.toml's
# package-dir): setuptools' import-hook finder would cost every `gq` call ~20 ms at start-up.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${GQ_VENV:-$repo/.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
    echo "gq: creating a virtual environment in $venv" >&2
    "$python" -m venv "$venv"
fi
stamp="$venv/.gq-installed"
if [ ! -f "$stamp" ] || [ "$repo/pyproject.toml" -nt "$stamp" ] \
        || [ "${BASH_SOURCE[0]}" -nt "$stamp" ]; then
    echo "gq: installing gq and its dependencies into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e "$repo[test]"
    touch "$stamp"
fi
export PATH="$venv/bin:$PATH"
