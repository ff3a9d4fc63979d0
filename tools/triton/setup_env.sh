#!/usr/bin/env bash
# Create the Triton test environment: $(repo)/.venv-triton with nvidia-pytriton
# (a real tritonserver 2.51 with the Python backend, CPU-only here).
#
# It lives in its own virtual environment because nvidia-pytriton forces
# numpy<2, while the main environment runs numpy 2.
#
# Idempotent: when the environment exists and was built from the current
# tools/triton/requirements.txt, it does nothing. A partial or stale one is
# removed and built again.
#
# Environment: PYTHON (the interpreter to build it from; default python3.11,
# then python3), FERRY_TRITON_VENV (default $(repo)/.venv-triton).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
venv="${FERRY_TRITON_VENV:-${repo}/.venv-triton}"
reqs="${here}/requirements.txt"
marker="${venv}/.ferry-triton-ready"

fail() {
    echo "setup_env.sh: error: $*" >&2
    exit 1
}

[[ -f "${reqs}" ]] || fail "missing ${reqs}"
want="$(sha256sum "${reqs}" | cut -d' ' -f1)"

if [[ -f "${marker}" && "$(cat "${marker}")" == "${want}" && -x "${venv}/bin/python" ]]; then
    if "${venv}/bin/python" -c 'import pytriton, numpy' 2>/dev/null; then
        echo "setup_env.sh: ${venv} is up to date (nothing to do)"
        exit 0
    fi
fi

python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
    python="$(command -v python3.11 || command -v python3 || true)"
fi
[[ -n "${python}" ]] || fail "no python3 found; set PYTHON=/path/to/python3.11"
"${python}" -c 'import sys; sys.exit(0 if (3, 8) <= sys.version_info[:2] <= (3, 12) else 1)' \
    || fail "${python} is not Python 3.8 to 3.12, which nvidia-pytriton 0.7.0 needs"
"${python}" -c 'import sysconfig, pathlib, sys; d = sysconfig.get_config_var("LIBDIR"); sys.exit(0 if d and any(pathlib.Path(d).glob("libpython3*.so*")) else 1)' \
    || fail "${python} has no shared libpython in its LIBDIR; the Triton Python backend stub needs one (build Python with --enable-shared)"

start_ms=$(( $(date +%s%N) / 1000000 ))
echo "setup_env.sh: creating ${venv} from $("${python}" --version 2>&1) (${python})"
rm -rf "${venv}"
"${python}" -m venv "${venv}" || fail "python -m venv ${venv} failed"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"${venv}/bin/python" -m pip install --quiet --no-input -r "${reqs}" \
    || fail "pip install -r ${reqs} failed (see above); the registry must be reachable"
"${venv}/bin/python" -m pip check || fail "pip check failed in ${venv}"
"${venv}/bin/python" - <<'PY' || fail "the installed pytriton does not carry a tritonserver binary"
import pathlib
import pytriton

root = pathlib.Path(pytriton.__file__).parent
binary = root / "tritonserver" / "bin" / "tritonserver"
if not binary.exists():
    raise SystemExit(f"missing {binary}")
PY
echo "${want}" > "${marker}"
end_ms=$(( $(date +%s%N) / 1000000 ))
elapsed_ms=$(( end_ms - start_ms ))
size="$(du -sh "${venv}" | cut -f1)"
printf 'setup_env.sh: %s ready in %d.%01d s (%s)\n' "${venv}" $(( elapsed_ms / 1000 )) $(( elapsed_ms % 1000 / 100 )) "${size}"
