#!/usr/bin/env bash
# README command 1: install what is missing, build, and start a single-node stratad on the
# embedded default config (127.0.0.1:7420, 1 GiB host tier), then show its status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
RUN_DIR=${STRATA_RUN_DIR:-/tmp/strata}
mkdir -p "$RUN_DIR"
if [ -f "$RUN_DIR/stratad.pid" ] && kill -0 "$(cat "$RUN_DIR/stratad.pid")" 2>/dev/null; then
  echo "start: stopping the stratad already running (pid $(cat "$RUN_DIR/stratad.pid"))"
  kill -TERM "$(cat "$RUN_DIR/stratad.pid")"
  for _ in $(seq 100); do kill -0 "$(cat "$RUN_DIR/stratad.pid")" 2>/dev/null || break; sleep 0.1; done
fi
rm -f "$RUN_DIR/ready.json"
DATA_DIR=${STRATA_DATA_DIR:-/var/lib/strata}
nohup "$BUILD_DIR/daemon/stratad" --data-dir "$DATA_DIR" --ready-file "$RUN_DIR/ready.json" \
  >"$RUN_DIR/stratad.log" 2>&1 &
echo $! >"$RUN_DIR/stratad.pid"
for _ in $(seq 200); do
  [ -f "$RUN_DIR/ready.json" ] && break
  if ! kill -0 "$(cat "$RUN_DIR/stratad.pid")" 2>/dev/null; then
    echo "start: stratad exited; its log:"; cat "$RUN_DIR/stratad.log"; exit 1
  fi
  sleep 0.1
done
[ -f "$RUN_DIR/ready.json" ] || { echo "start: stratad did not become ready"; cat "$RUN_DIR/stratad.log"; exit 1; }
echo "start: stratad running (pid $(cat "$RUN_DIR/stratad.pid"), log $RUN_DIR/stratad.log)"
"$BUILD_DIR/client/stratactl" --endpoint 127.0.0.1:7420 status
