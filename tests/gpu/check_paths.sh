#!/bin/sh
# ctest gpu_check_graphs: the tensor-core check graphs scripts/gpu-pack compiles for a
# GPU session (tests/gpu/tc_*.sf) still take the paths they are there to check on
# sm_90a: wgmma + TMA by default, wgmma + cp.async with --no-tma, TF32 for the f32
# graph under --allow-tf32 (and exact FMA without). Each graph also matches the
# reference on the CPU (run --check).
#   check_paths.sh SHARDFUSE SOURCE_DIR
set -u
sf="$1"
src="$2"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
has() {  # has PLAN_DIR TEXT: some kernel's PTX contains TEXT
  grep -q -F -- "$2" "$1"/*.ptx || { echo "FAIL: $1: no '$2' in its PTX"; fail=1; }
}
lacks() {
  if grep -q -F -- "$2" "$1"/*.ptx; then echo "FAIL: $1: '$2' in its PTX"; fail=1; fi
}
for g in "$src"/tests/gpu/tc_*.sf; do
  n=$(basename "$g" .sf)
  "$sf" run "$g" --check >/dev/null || { echo "FAIL: run $g --check"; fail=1; }
  "$sf" compile "$g" --arch sm_90a --no-ptxas -o "$d/$n" >/dev/null || { echo "FAIL: compile $g"; fail=1; continue; }
  "$sf" compile "$g" --arch sm_90a --no-ptxas --no-tma -o "$d/$n.no-tma" >/dev/null || { echo "FAIL: compile --no-tma $g"; fail=1; continue; }
  case "$n" in
    *_f32)
      "$sf" compile "$g" --arch sm_90a --no-ptxas --allow-tf32 -o "$d/$n.tf32" >/dev/null || { echo "FAIL: compile --allow-tf32 $g"; fail=1; continue; }
      has "$d/$n.tf32" ".f32.tf32.tf32"
      lacks "$d/$n" "tf32"
      ;;
    *)
      has "$d/$n" "wgmma.mma_async"
      has "$d/$n" "cp.async.bulk.tensor"
      has "$d/$n.no-tma" "wgmma.mma_async"
      has "$d/$n.no-tma" "cp.async.cg"
      lacks "$d/$n.no-tma" "cp.async.bulk.tensor"
      ;;
  esac
done
[ "$fail" = 0 ] && echo "ok: every tensor-core check graph takes its paths"
exit "$fail"
