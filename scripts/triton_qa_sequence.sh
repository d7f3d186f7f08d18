#!/bin/bash
# Triton's own stateful-model client tests against this checkout's wattserve, as Triton's
# qa/L0_sequence_batcher/test.sh and qa/L0_implicit_state/test.sh run them for ONNX Runtime
# and LibTorch (docs/triton.md, "Stateful models"): a fresh server per test, on the model
# repository and with the TRITONSERVER_*DELAY_SCHEDULER variables test.sh gives that test.
#
#   QA=<server repo>/qa GEN=<dir> scripts/triton_qa_sequence.sh [TRIALS] [TESTS]
#
# GEN holds what Triton's generators wrote (KIND_GPU becomes KIND_CPU in the copies):
#   GEN/seq   gen_qa_sequence_models.py --onnx --libtorch
#   GEN/imp   gen_qa_implicit_models.py --onnx --libtorch
#   GEN/vseq  gen_qa_sequence_models.py --onnx --variable
#   GEN/vimp  gen_qa_implicit_models.py --onnx --variable
# TRIALS: test.sh's model trials (default "1 0 2 4 v q"; q: its queue-delay models);
# TESTS: SequenceBatcherTest methods (default: the ones test.sh runs). One line per test.
# Then L0_implicit_state's implicit_state.py against its models folder.
set -u
QA=${QA:?path to Triton server qa/}; GEN=${GEN:?generated models}
TRIALS=${1:-1 0 2 4 v q}
TESTS=${2:-test_simple_sequence test_length1_sequence test_batch_size test_no_sequence_start \
test_no_sequence_start2 test_no_sequence_end test_no_correlation_id test_backlog_fill test_backlog_fill_no_end \
test_backlog_same_correlation_id test_backlog_same_correlation_id_no_end test_backlog_sequence_timeout \
test_half_batch test_skip_batch test_full_batch test_ragged_batch test_backlog}
ROOT=$(cd "$(dirname "$0")/.." && pwd); PY=${PYTHON:-$ROOT/.venv/bin/python}; [ -x "$PY" ] || PY=python3
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
read -r HP GP < <("$PY" -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]; print(*[x.getsockname()[1] for x in s])')
mkdir -p "$WORK/qa" && cp -r "$QA/common" "$QA/L0_sequence_batcher" "$QA/L0_implicit_state" "$WORK/qa/"
grep -rl ':800[01]' "$WORK/qa" | xargs sed -i "s/:8000/:$HP/g; s/:8001/:$GP/g"

repo() {  # repo V TRIAL -> the folder test.sh builds for it (models$TRIAL, modelsv, queue_delay_models)
  local V=$1 T=$2 R="$WORK/$1.$2" DT="int32 bool" SRC="$GEN/$1" B M N MB C
  [ "$V" = imp ] && DT="object int32 bool"
  mkdir -p "$R"
  for B in onnx libtorch; do for D in $DT; do
    case $T in
      0) M=$SRC/${B}_nobatch_sequence_$D; MB=; C=4;;
      v) [ "$B" = onnx ] || continue; M=$GEN/v$V/${B}_sequence_$D; MB=4; C=1;;
      q|1) M=$SRC/${B}_sequence_$D; MB=4; C=1;;
      2) M=$SRC/${B}_sequence_$D; MB=2; C=2;;
      4) M=$SRC/${B}_sequence_$D; MB=1; C=4;;
    esac
    N=$(basename "$M"); [ -d "$M" ] || continue
    [[ "$T" != 0 && "$N" =~ libtorch.*object ]] && continue
    cp -r "$M" "$R/" && sed -i "s/KIND_GPU/KIND_CPU/; s/kind: KIND_CPU/kind: KIND_CPU\ncount: $C/" "$R/$N/config.pbtxt"
    [ -n "$MB" ] && sed -i "s/^max_batch_size:.*/max_batch_size: $MB/" "$R/$N/config.pbtxt"
    if [ "$T" = q ]; then
      sed -i "s/sequence_batching {/sequence_batching {\ndirect {\nmax_queue_delay_microseconds: 3000000\nminimum_slot_utilization: 0\n}/" "$R/$N/config.pbtxt"
      for U in half:0.5 full:1; do
        cp -r "$R/$N" "$R/${N}_${U%%:*}"
        sed -i "s/$N/${N}_${U%%:*}/; s/minimum_slot_utilization: 0/minimum_slot_utilization: ${U#*:}/" "$R/${N}_${U%%:*}/config.pbtxt"
      done
    fi
  done; done
  echo "$R"
}

serve() {  # serve REPO LOG [READY_PATH]: start wattserve, wait until it (or that model) is ready
  (cd "$ROOT" && WATTSERVE_TELEMETRY=false exec "$PY" -m wattserve serve --model-repository "$1" \
    --port "$HP" --grpc-port "$GP") > "$2" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 120); do curl -sf "localhost:$HP${3:-/v2/health/ready}" >/dev/null && break; sleep 1; done
}

stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null; }

delays() {  # test.sh's TRITONSERVER_DELAY_SCHEDULER / TRITONSERVER_BACKLOG_DELAY_SCHEDULER per test
  case $1 in
    test_backlog_fill_no_end) echo "10 3";; test_backlog_fill) echo "10 2";;
    test_backlog_same_correlation_id) echo "12 2";; test_backlog_same_correlation_id_no_end) echo "16 0";;
    test_half_batch) echo "8 0";; test_backlog_sequence_timeout) echo "4 0";;
    test_skip_batch|test_full_batch|test_ragged_batch|test_backlog) echo "12 0";;
    test_queue_delay_*) echo "2 0";; *) echo "";;
  esac
}

for V in seq imp; do for T in $TRIALS; do
  R=$(repo "$V" "$T"); LIST=$TESTS
  [ "$T" = q ] && LIST="test_queue_delay_no_min_util test_queue_delay_half_min_util test_queue_delay_full_min_util"
  for TEST in $LIST; do
    read -r D B <<< "$(delays "$TEST")"
    if [ -n "${D:-}" ]; then export TRITONSERVER_DELAY_SCHEDULER=$D TRITONSERVER_BACKLOG_DELAY_SCHEDULER=$B
    else unset TRITONSERVER_DELAY_SCHEDULER TRITONSERVER_BACKLOG_DELAY_SCHEDULER; fi
    serve "$R" "$WORK/server.log"
    INST=$T; [ "$T" = 0 ] && INST=4; [[ "$T" = q || "$T" = v ]] && INST=1
    BT=FIXED; [ "$T" = v ] && BT=VARIABLE
    NOB=0; [ "$T" = 0 ] && NOB=1
    IMPL=0; [ "$V" = imp ] && IMPL=1
    (cd "$WORK/qa/L0_sequence_batcher" && BACKENDS="onnx libtorch" ENSEMBLES=0 NO_BATCHING=$NOB \
      MODEL_INSTANCES=$INST IMPLICIT_STATE=$IMPL INITIAL_STATE_FILE=0 BATCHER_TYPE=$BT \
      TRITONSERVER_IPADDR=localhost timeout 400 "$PY" sequence_batcher_test.py "SequenceBatcherTest.$TEST" \
      > "$WORK/test.log" 2>&1)
    echo "$V trial $T $TEST: $(tail -n 1 "$WORK/test.log")"
    stop
  done
done; done
unset TRITONSERVER_DELAY_SCHEDULER TRITONSERVER_BACKLOG_DELAY_SCHEDULER

# L0_implicit_state: its models folder with the int32 nobatch models and their _output copies
I=$WORK/qa/L0_implicit_state/models
for B in libtorch onnx; do
  N=${B}_nobatch_sequence_int32; O=OUTPUT_STATE; [ "$B" = libtorch ] && O=OUTPUT_STATE__1
  cp -r "$GEN/imp/$N" "$I/" && cp -r "$GEN/imp/$N" "$I/${N}_output" && sed -i s/KIND_GPU/KIND_CPU/ "$I"/*/config.pbtxt
  sed -i "s/^name:.*/name: \"${N}_output\"/" "$I/${N}_output/config.pbtxt"
  echo -e "output [{ name: \"$O\" \n data_type: TYPE_INT32 \n dims: [ 1 ] }]" >> "$I/${N}_output/config.pbtxt"
done
serve "$I" "$WORK/server.log" /v2/models/onnx_nobatch_sequence_int32/ready  # its custom-backend ones fail
(cd "$WORK/qa/L0_implicit_state" && BACKENDS="libtorch onnx" timeout 300 "$PY" implicit_state.py -v 2>&1 \
  | grep -E "^test_.* \.\.\. ") 
stop
