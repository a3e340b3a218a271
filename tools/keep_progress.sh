#!/usr/bin/env bash
# Stage the small checkpoints of the paper-scale units under way, so that a fresh machine resumes them.
#
# A unit's attack or search that was stopped halfway resumes from its checkpoint in
# results/ID.json.partial.attacks/ (git-ignored: leakagelib/experiments/resume.py). A session on a
# machine that does not outlast it loses that folder, and a unit longer than a session never
# ends: a step-500 CIFAR-10 unit of Table 2 searches for 4-6 h on one thread of this
# project's CPU (about 185 programs of 83-122 s). Its checkpoints are small: the finished
# programs' scores (313 KB after 37 programs) and its trained network (1.7 MB). This stages,
# with `git add -f`, every file of such a folder up to MAX_MB (default 16) and the removal of
# those the campaign deleted when their unit landed; a larger file (a trained ConvBig of
# Fig. 2, 50 MB) stays on the machine and is trained again. A
# checkpoint resumes only on the kind of device that saved it (a CPU's on a CPU).
#
# Usage, from the repository root, with the runs stopped (SIGTERM: they save first):
#   tools/keep_progress.sh && git commit -m "..."
set -eu
max_mb=${MAX_MB:-16}
git ls-files -- 'results/*.partial.attacks/*' | while read -r kept; do
  [ -e "$kept" ] || git rm -q --cached -- "$kept"  # its unit landed, the campaign removed it
done
find results -path '*.partial.attacks/*.pt' -size -"$((max_mb * 1024 + 1))"k -print0 |
  xargs -0 -r git add -f --
for big in $(find results -path '*.partial.attacks/*.pt' -size +"$((max_mb * 1024))"k); do
  echo "not kept (over $max_mb MB): $big" >&2
done
git status --short -- results
