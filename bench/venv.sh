#!/bin/sh
# Creates bench/.venv with jax (CPU), numpy and matplotlib from PyPI, once.
# Prints the venv's python on success; exits non-zero when it cannot.
set -e
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/.venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import jax, matplotlib" >/dev/null 2>&1; then
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2 || true
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "jax[cpu]" matplotlib >&2
fi
echo "$venv/bin/python"
