#!/usr/bin/env bash
# Encode and decode speed of two codec_eval builds on the real KV, in alternating rounds, with
# the medians per model and mode (docs/codec.md, "Pca speed"). On a shared VM one binary's speed
# moves by up to 1.5x from minute to minute, so a single run of each says little: alternate
# them, repeat, and compare medians (and the per-round pairs, which the script prints too).
#
#   bench/codec/real_kv/speed_rounds.sh ROUNDS OLD_CODEC_EVAL NEW_CODEC_EVAL [MODEL ...]
#       MODEL: qwen2.5-coder-1.5b and/or smollm2 (default both)
#
# Env: WORKDIR (default /tmp/strata-real-kv: mq-MODEL/prefix.safetensors and calib.safetensors
# as model_quality.py prefix writes them, the GPL-3 and Apache-2.0 prefixes in docs/codec.md),
# MODES (default pca:b1.5,pca:b3), REPS (timing repetitions per run, default 9), TOGETHER=1 (run
# the two builds at the same time, one per core, cores swapped each round: both see the same
# moment's load, but each also the other's).
# Prints per round "rN MODEL old|new memcpy MODE enc E dec D ...", then per model and mode the
# median GB/s of each build and the medians of enc / memcpy and dec / memcpy.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n 2,17p "$0" >&2; exit 2; }
rounds=$1 old=$2 new=$3
shift 3
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(qwen2.5-coder-1.5b smollm2)
work=${WORKDIR:-/tmp/strata-real-kv}
modes=${MODES:-pca:b1.5,pca:b3}
reps=${REPS:-9}

theta() {
  case "$1" in
    qwen2.5-coder-1.5b) echo 1000000 ;;
    smollm2) echo 100000 ;;
    *) echo "speed_rounds: unknown model $1" >&2; exit 2 ;;
  esac
}

# One run: "memcpy MODE enc E dec D | MODE enc E dec D | ..." from codec_eval's table.
run() {
  local bin=$1 model=$2 cpu=$3
  local d=$work/mq-$model
  local pin=()
  [[ -n $cpu ]] && pin=(taskset -c "$cpu")
  "${pin[@]}" "$bin" --data "$d/prefix.safetensors:kv" --calibrate-from "$d/calib.safetensors:kv" \
    --pca-rope-theta "$(theta "$model")" --tokens-per-block 256 --modes "$modes" --reps "$reps" \
    --cpu-time 2>/dev/null |
    awk '/^memcpy:/ { printf "%s", $2 }
         $1 ~ /:/ && NF >= 12 && $2 ~ /^[0-9.]+$/ && $9 ~ /^[0-9.]+$/ {
           printf " %s enc %s dec %s |", $1, $9, $10 }
         END { print "" }'
}

out=$(mktemp)
trap 'rm -f "$out" "$out".*' EXIT
for r in $(seq "$rounds"); do
  for m in "${models[@]}"; do
    if [[ ${TOGETHER:-0} == 1 ]]; then
      co=$(( r % 2 )) cn=$(( (r + 1) % 2 ))
      run "$old" "$m" "$co" > "$out.o" & run "$new" "$m" "$cn" > "$out.n"
      wait
    else
      run "$old" "$m" "" > "$out.o"
      run "$new" "$m" "" > "$out.n"
    fi
    echo "r$r $m old $(cat "$out.o")" | tee -a "$out"
    echo "r$r $m new $(cat "$out.n")" | tee -a "$out"
  done
done

echo "medians over $rounds rounds (GB/s of fp16; enc and dec over the same run's memcpy):"
awk '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; --j) {
      t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    model = $2; side = $3; mc = $4
    for (i = 5; i + 4 <= NF; i += 6) {
      key = model " " $i " " side
      enc[key] = enc[key] " " $(i + 2); dec[key] = dec[key] " " $(i + 4)
      encr[key] = encr[key] " " $(i + 2) / mc; decr[key] = decr[key] " " $(i + 4) / mc
      keys[key] = 1
    }
  }
  END {
    for (k in keys) printf "  %s: enc %.2f dec %.2f | enc/memcpy %.3f dec/memcpy %.3f\n", k,
      median(enc[k]), median(dec[k]), median(encr[k]), median(decr[k])
  }' "$out" | sort
