#!/usr/bin/env bash
# Regenerate the README's screenshot from the main job: `servebook run` (the built-in
# tiny-pd on vLLM's CPU build), then headless Chromium over the report it wrote.
#   scripts/screenshot_report.sh          # a fresh `servebook run`, then its report
#   scripts/screenshot_report.sh RUN_DIR  # the report a `servebook run -o RUN_DIR` wrote
# Either way it writes docs/img/report-tiny-pd.png.  Any directory holding a report.html
# (`servebook report DIR`, an experiment's too) with another picture and page height:
#   scripts/screenshot_report.sh out/spec docs/img/experiment-spec-vs-mixed.png 2150
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp -d)"
png="${2:-docs/img/report-tiny-pd.png}"
height="${3:-1250}"
if [ $# -ge 1 ]; then
  run="$(cd "$1" && pwd)"
else
  run="$out/run"
  .venv/bin/servebook run -o "$run"
fi
test -f "$run/report.html" || { echo "no report.html in $run" >&2; exit 2; }
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$out/chrome" --hide-scrollbars --window-size="1200,$height" \
  --screenshot="$png" "file://$run/report.html"
echo "$png from $run/report.html"
