#!/usr/bin/env bash
# Paper-scale experiments on a lent GPU in one device command, resumably.
#
# Runs `python -m leakagelib campaign --no-estimate` (the device's minutes go to the units, not
# to probing step times) for the given experiments under `timeout`, so that the
# command ends before the device's per-command limit: a unit's attack under way saves its
# checkpoint at the end of its step when the SIGTERM comes (leakagelib/attacks/checkpoint.py;
# a search saves at the end of its running program, which on a GPU is a whole stage).
# SIGTERM comes GRACE (default 60) seconds before SECONDS and SIGKILL a quarter of GRACE before,
# so the whole command, copying included, ends within SECONDS: give the device call a timeout_s
# of at least SECONDS (a call cut at 600 s with the kill planned at 605 brought nothing back,
# 2026-11-28). Then it copies each experiment's record, partial record and attack checkpoints
# into $OUT, from where they come back to the developer's machine: put the records and partial
# records in results/ and commit them; put a checkpoint folder beside its partial record (it is
# not committed) and name it in the next device call's `carry` to resume the unit there.
#
# Usage, from the repository root of the device machine, with the offline samples copied into
# .shared-data/ (git-ignored) and carried:
#   tools/lent_gpu.sh SECONDS ID [ID ...]
# e.g. tools/lent_gpu.sh 580 cvb/table5-architectures  (with timeout_s 600)
# WORKERS=N runs N campaigns side by side as shards of each run (`--shard K/N`: a GPU that one
# process of small networks leaves nearly idle runs N units at a time; the last shard to finish
# writes the record), e.g. WORKERS=8 tools/lent_gpu.sh 580 bayes/fig2-training.
# UNITS=TEXT runs only the units whose key contains TEXT (`--units`, one experiment), e.g.
# UNITS=ats for Fig. 2's ATS units while this CPU makes its Soteria ones; stop the CPU's run
# before the call and resume it after the partial record has come back.
# SCALE, DEVICE, RESULTS, PYTHON and GRACE (default paper, cuda, results, python3, 60) allow a smoke
# test elsewhere:
#   SCALE=ci DEVICE=cpu RESULTS=/tmp/smoke PYTHON=.venv/bin/python OUT=/tmp/o tools/lent_gpu.sh 600 ID
set -u
seconds=$1
shift
grace=${GRACE:-60}
if [ "$seconds" -le "$grace" ]; then
  echo "SECONDS must exceed GRACE = $grace (the stop signal comes GRACE before it), got $seconds" >&2
  exit 2
fi
export PYTHONUNBUFFERED=1
# Table 2's CIFAR-10 units ran out of the H100's 79 GiB with 23 GiB reserved but unallocated (the
# caching allocator's fragments); growable segments let them finish.
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
python=${PYTHON:-python3}
data=()  # the offline samples of the datasets these experiments use (naming another is an error)
for dataset in $("$python" -c 'import sys; from leakagelib import experiments
print(*sorted({d for i in sys.argv[1:] for d in experiments.get(i).datasets}))' "$@"); do
  case $dataset in
    mnist) data+=(--data mnist=.shared-data/mnist_test_0_4999.npz) ;;
    cifar10) data+=(--data cifar10=.shared-data/cifar10_test_0_499.npz) ;;
  esac
done
changes=()
for id in "$@"; do  # client 0 of ten holds only 36 of the CIFAR-10 sample's images
  case $id in cvb/*) changes=(--set "victims_at={'cifar10': 32}") ;; esac
done
units=()
if [ -n "${UNITS:-}" ]; then units=(--units "$UNITS"); fi
workers=${WORKERS:-1}  # N > 1: N campaigns side by side, shards of each run (--shard K/N)
left=$((seconds - SECONDS - grace))  # bash's SECONDS: this script's time so far (the query above)
pids=()
for ((k = 0; k < workers; k++)); do
  shard=()
  if [ "$workers" -gt 1 ]; then shard=(--shard "$k/$workers"); fi
  timeout -s TERM -k "$((grace * 3 / 4))" "$((left > 1 ? left : 1))" "$python" -m leakagelib campaign \
    --scale "${SCALE:-paper}" --device "${DEVICE:-cuda}" --results "${RESULTS:-results}" --quiet \
    --no-estimate \
    "${data[@]}" "${changes[@]}" "${shard[@]}" "${units[@]}" --only "$@" &
  pids+=($!)
done
status=0  # the first worker's failure (124: cut by the timeout), else 0
for pid in "${pids[@]}"; do
  wait "$pid"
  code=$?
  if [ "$status" -eq 0 ]; then status=$code; fi
done
for id in "$@"; do
  record=${RESULTS:-results}/${id//\//-}.json
  for file in "$record" "$record.partial"; do
    if [ -f "$file" ]; then cp "$file" "$OUT/"; fi
  done
  if compgen -G "$record.partial.attacks/*.pt" > /dev/null; then
    mkdir -p "$OUT/$(basename "$record").partial.attacks"
    cp "$record.partial.attacks"/*.pt "$OUT/$(basename "$record").partial.attacks/"
  fi
done
exit $status
