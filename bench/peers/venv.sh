#!/bin/sh
# Creates bench/.venv (git-ignored) with what the CNN/GPT peers need, from
# PyPI, once: jax[cpu], flax, optax (the JAX peer) and torch (the PyTorch
# peer; PyPI's Linux wheel, run on the CPU). Builds on bench/venv.sh (jax,
# matplotlib). Prints the venv's python on success; exits non-zero when it
# cannot (no network, no PyPI).
set -e
here=$(cd "$(dirname "$0")" && pwd)
py=$(sh "$here/../venv.sh")
if ! "$py" -c "import flax, optax, torch" >/dev/null 2>&1; then
    "$py" -m pip install --quiet --disable-pip-version-check flax optax torch >&2
fi
echo "$py"
