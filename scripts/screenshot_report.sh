#!/usr/bin/env bash
# Regenerate the README's screenshot from the main job: `servebook run` (the built-in
# tiny-pd on vLLM's CPU build), then headless Chromium over the report it wrote.
#   scripts/screenshot_report.sh        # writes docs/img/report-tiny-pd.png
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp -d)"
.venv/bin/servebook run -o "$out/run"
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$out/chrome" --hide-scrollbars --window-size=1200,1250 \
  --screenshot=docs/img/report-tiny-pd.png "file://$out/run/report.html"
echo "docs/img/report-tiny-pd.png from $out/run/report.html"
