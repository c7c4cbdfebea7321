#!/bin/sh
# Create the virtual environment and install gaudi-gui into it, never replacing an existing torch.
#
# Gaudi machines (and Intel's containers) ship Intel's own torch build plus habana_frameworks in the
# system Python. If the base interpreter already imports torch, the venv sees the system packages and
# pip is pinned to that exact torch; otherwise torch==2.13.0 (CPU build) is installed.
set -eu
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"

# The Slurm tests (tests/slurm) start a real one-node cluster from Debian's slurm-wlm and munge, as
# root, as CI runs. Install them where that can happen: root, apt-get, and no slurmctld yet. A failure
# here is said and not fatal: those tests then fail saying Slurm is missing.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ ! -x /usr/sbin/slurmctld ]; then
    echo "bootstrap: installing slurm-wlm and munge with apt-get (non-interactive) for the Slurm tests"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1; then
        apt-get update -q >/dev/null 2>&1 || true
        apt-get install -y -q --no-install-recommends slurm-wlm munge \
            || echo "bootstrap: could not install slurm-wlm and munge; the Slurm tests will fail saying so"
    fi
fi

if [ ! -x "$VENV/bin/python" ]; then
    if "$PYTHON" -c "import torch" >/dev/null 2>&1; then
        echo "bootstrap: $PYTHON already has torch; creating $VENV with --system-site-packages"
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true

CONSTRAINTS="$VENV/torch-constraint.txt"
if TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)" 2>/dev/null); then
    echo "bootstrap: keeping the installed torch $TORCH_VERSION"
else
    echo "bootstrap: no torch found; installing torch==2.13.0 (CPU build)"
    "$PY" -m pip install "torch==2.13.0"
    TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
fi
# Pin whatever torch is present so no dependency can pull another build over it.
echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
"$PY" -m pip install -c "$CONSTRAINTS" -e ".[test]"
# An editable install leaves the package's own modules uncompiled, and where PYTHONDONTWRITEBYTECODE
# is set (CI and sandbox images) no process ever writes them: every command and worker child would
# compile what it imports at each start (40-50 ms a command child). Compile them once, as pip does
# for an installed wheel; an edited module's stale file is simply not used.
"$PY" -m compileall -q gaudi_gui >/dev/null || true
