#!/bin/sh
# ctest gpu_check_graphs: the tensor-core check graphs scripts/gpu-pack compiles for a
# GPU session (tests/gpu/tc_*.sf) still take the paths they are there to check on
# sm_90a, one per variant of tests/gpu/variants.txt: wgmma + TMA by default, wgmma +
# cp.async with --no-tma, warp-specialised, persistent, ping-pong (also 128 x 128), both with their
# registers reallocated (setmaxnreg) and with TMA stores (tma_store), in clusters of two with TMA
# multicast (cluster_m, cluster_n), TF32 for the f32 graph under
# --allow-tf32 (also warp-specialised and split-K; exact FMA without), split-K of
# 16-bit groups through the workspace (also warp-specialised and persistent); and the fused
# attention check graphs (tests/gpu/attn_*.sf) one attention kernel on mma.sync, its
# scores and output in registers (and with --attention-config wgmma=1 on wgmma). Each
# graph also matches the reference on the CPU (run --check).
#   check_paths.sh SHARDFUSE SOURCE_DIR [all|sample]
# `sample` (the sanitizer build, as tests/sanitized.h samples sweeps there) compiles
# every other (graph, variant) pair, alternating, so that each variant and each graph
# still comes up; `all` (the default) compiles every pair.
set -u
sf="$1"
src="$2"
mode="${3:-all}"
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
fail=0
has() {  # has PLAN_DIR TEXT: some kernel's PTX contains TEXT
  grep -q -F -- "$2" "$1"/*.ptx || { echo "FAIL: $1: no '$2' in its PTX"; echo x >> "$d/failed"; }
}
lacks() {
  if grep -q -F -- "$2" "$1"/*.ptx; then echo "FAIL: $1: '$2' in its PTX"; echo x >> "$d/failed"; fi
}
for g in "$src"/tests/gpu/tc_*.sf; do
  n=$(basename "$g" .sf)
  "$sf" run "$g" --check >/dev/null || { echo "FAIL: run $g --check"; fail=1; }
done
# Every variant of variants.txt, as scripts/gpu-pack compiles it, and what shows it
# took its path.
vi=0
grep -v '^#' "$src/tests/gpu/variants.txt" | while read -r variant which rest; do
  [ -n "$variant" ] || continue
  eval "set -- $rest"
  vi=$((vi + 1))
  pair=0
  for g in "$src"/tests/gpu/tc_*.sf; do
    n=$(basename "$g" .sf)
    case "$which:$n" in all:* | f32:*_f32 | 16bit:*_bf16 | 16bit:*_f16 | splitk:tc_splitk_*) ;; *) continue ;; esac
    pair=$((pair + 1))
    # The sample: of a 16-bit variant's graphs, those of one parity, the parity
    # shifting from variant to variant (so every graph still takes every other path).
    if [ "$mode" = sample ] && [ "$which" = 16bit ] && [ $(((pair + vi) % 2)) = 0 ]; then continue; fi
    p="$d/$n.$variant"
    "$sf" compile "$g" --arch sm_90a --no-ptxas --no-host "$@" -o "$p" >/dev/null || { echo "FAIL: compile $g $rest"; echo x >> "$d/failed"; continue; }
    case "$variant:$n" in
      default:*_f32) lacks "$p" "tf32" ;;
      default:tc_heads_bf16) has "$p" "wgmma.mma_async"; has "$p" "cp.async.bulk.tensor.4d" ;;  # two batch dims out of order
      default:*) has "$p" "wgmma.mma_async"; has "$p" "cp.async.bulk.tensor" ;;
      no-tma:*) has "$p" "wgmma.mma_async"; has "$p" "cp.async.cg"; lacks "$p" "cp.async.bulk.tensor" ;;
      ws:* | tf32-ws:*) has "$p" "mbarrier.arrive.shared::cta.b64"; has "$p" "wgmma.mma_async" ;;
      persistent:*) has "$p" "wgmma.mma_async"; grep -q "persistent=3" "$p/plan.json" || { echo "FAIL: $p: not persistent"; echo x >> "$d/failed"; } ;;
      ws-persistent:*) has "$p" "mbarrier.arrive.shared::cta.b64"; grep -q "persistent=3" "$p/plan.json" || { echo "FAIL: $p: not persistent"; echo x >> "$d/failed"; } ;;
      pingpong:*) has "$p" "bar.arrive"; has "$p" "wgmma.mma_async"; grep -q "pingpong=1" "$p/plan.json" || { echo "FAIL: $p: not ping-pong"; echo x >> "$d/failed"; } ;;
      # 128 x 128: each warpgroup's tile in two m64 steps of 128 columns (a graph of
      # one such tile leaves the second warpgroup without an item, and no turn to pass).
      pingpong-128:*) has "$p" "wgmma.mma_async.sync.aligned.m64n128k16"; grep -q "pingpong=1" "$p/plan.json" || { echo "FAIL: $p: not ping-pong"; echo x >> "$d/failed"; } ;;
      # Register reallocation: the producer's .dec, the consumers' .inc, and the
      # launch bound ptxas needs to honour them.
      ws-regs:* | pingpong-regs:*) has "$p" "setmaxnreg.dec.sync.aligned.u32"; has "$p" "setmaxnreg.inc.sync.aligned.u32"; has "$p" ".minnctapersm 1" ;;
      # The sm_90a default's tile: m64n256k16 per warpgroup, the registers reallocated.
      ws-256:*) has "$p" "wgmma.mma_async.sync.aligned.m64n256k16"; has "$p" "setmaxnreg.inc.sync.aligned.u32 232"
        grep -q "persistent=3" "$p/plan.json" || { echo "FAIL: $p: not persistent"; echo x >> "$d/failed"; } ;;
      # TMA stores: the bulk tensor stores from shared memory, the drain before the
      # kernel returns, and the output's map in plan.json.
      ws-256-store:* | pingpong-store:* | tf32-ws-store:*)
        has "$p" ".global.shared::cta.bulk_group"; has "$p" "cp.async.bulk.wait_group 0;"; lacks "$p" "st.global"
        grep -q '"output": 0' "$p/plan.json" || { echo "FAIL: $p: no tensor map over the output"; echo x >> "$d/failed"; } ;;
      # Clusters: the cluster shape in the PTX and plan.json, the multicast copies, the
      # releases on both blocks' mbarriers.
      cluster-m:* | cluster-tile:* | cluster-n:* | ws-256-cluster:* | pingpong-cluster:* | tf32-cluster:*)
        has "$p" ".reqnctapercluster 2, 1, 1"; has "$p" ".multicast::cluster"; has "$p" "mapa.shared::cluster.u32"
        grep -q '"cluster": 2' "$p/plan.json" || { echo "FAIL: $p: no cluster in plan.json"; echo x >> "$d/failed"; } ;;
      tf32:*) has "$p" ".f32.tf32.tf32" ;;
      tf32-split-k:*) has "$p" ".f32.tf32.tf32"; has "$p" ".global.add.f32" ;;  # red. or atom.
      # The workspace: partial sums added, membar.gl, the count, the sums read back.
      split-k:* | ws-split-k:*)
        has "$p" "membar.gl"; has "$p" "ld.volatile"; has "$p" "atom.global.add.u32"
        grep -q '"workspace_bytes"' "$p/plan.json" || { echo "FAIL: $p: no workspace"; echo x >> "$d/failed"; }
        [ "$variant" = split-k ] || has "$p" "mbarrier.arrive.shared::cta.b64" ;;
      *) echo "FAIL: variant $variant has no check here"; echo x >> "$d/failed" ;;
    esac
  done
done
# The fused attention check graphs (tests/gpu/attn_*.sf, gpu-pack's plans/ARCH/attn/):
# one attention kernel, on the tensor cores on sm_90a.
for g in "$src"/tests/gpu/attn_*.sf; do
  n=$(basename "$g" .sf)
  "$sf" run "$g" --check >/dev/null || { echo "FAIL: run $g --check"; fail=1; }
  p="$d/$n"
  "$sf" compile "$g" --arch sm_90a --no-ptxas --no-host -o "$p" >/dev/null || { echo "FAIL: compile $g"; fail=1; continue; }
  [ "$(grep -c '"kind": "attention"' "$p/plan.json")" = 1 ] && [ "$(grep -c '"kind"' "$p/plan.json")" = 1 ] \
    || { echo "FAIL: $p: not one attention kernel"; fail=1; }
  if grep -q "wgmma=1" "$p/plan.json"; then  # sm_90a's default from 256 rows a head
    has "$p" "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"; lacks "$p" "mma.sync"
  else
    has "$p" "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
  fi
  has "$p" "shfl.sync.bfly"  # the register-resident form (16 rows a warp)
  [ "$n" != attn_proj_bf16 ] || has "$p" "cp.async.bulk.tensor.4d"  # TMA over the permuted heads
  # gpu-pack's wgmma variants (sm_90a's default tile and its fallback among them): the
  # products by wgmma (A from registers: the scores m64 x block_n, the output m64 x
  # 128), no mma.sync.
  for w in "block_m=64 block_n=64 warps=4 wgmma=1" "block_m=128 block_n=64 warps=8 wgmma=1" \
    "block_m=128 block_n=64 warps=8 wgmma=2" "block_m=256 block_n=64 warps=16 wgmma=1" \
    "block_m=192 block_n=96 warps=12 wgmma=1" "block_m=256 block_n=64 warps=16 wgmma=1 stages=3" \
    "block_m=128 block_n=64 warps=8 wgmma=1 stages=4" "block_m=128 block_n=64 warps=8 wgmma=2 pingpong=1" \
    "block_m=128 block_n=128 warps=8 wgmma=2 pingpong=1" "block_m=256 block_n=64 warps=16 wgmma=1 group_heads=1" \
    "block_m=128 block_n=128 warps=8 wgmma=2 pingpong=1 warp_specialize=1" \
    "block_m=128 block_n=64 warps=8 wgmma=1 stages=3 warp_specialize=1"; do
    # The sample: the knobs added since run 11 (stages, ping-pong, group_heads, the
    # producer) on attn_long_bf16 only, whose 320 keys the copy-site count needs.
    case "$mode:$n:$w" in sample:attn_sdpa_bf16:*stages=* | sample:attn_sdpa_bf16:*pingpong=* | sample:attn_sdpa_bf16:*group_heads=*) continue ;; esac
    # attn_proj_bf16 is there for its 4-D maps: the default tile and the producer's.
    case "$n:$w" in attn_proj_bf16:*block_m=256*stages=* | attn_proj_bf16:*block_m=256*group_heads=*) continue ;; esac
    case "$mode:$n:$w" in *:attn_proj_bf16:*block_m=256* | all:attn_proj_bf16:*stages=3\ warp_specialize=1) ;; *:attn_proj_bf16:*) continue ;; esac
    dims=3d; [ "$n" = attn_proj_bf16 ] && dims=4d
    q="$d/$n.wgmma"
    rm -rf "$q"
    "$sf" compile "$g" --arch sm_90a --no-ptxas --no-host --attention-config "$w" -o "$q" >/dev/null \
      || { echo "FAIL: compile $g --attention-config '$w'"; fail=1; continue; }
    # (attn_sdpa_bf16's 80 keys cut a 96-key tile to 80; attn_long_bf16 has 320)
    bn=${w#*block_n=}; bn=${bn%% *}
    [ "$n" = attn_sdpa_bf16 ] && [ "$bn" -gt 80 ] && bn=80
    has "$q" "wgmma.mma_async.sync.aligned.m64n${bn}k16.f32.bf16.bf16"
    has "$q" "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
    lacks "$q" "mma.sync"
    has "$q" "cp.async.bulk.tensor.$dims"  # k and v by TMA (sm_90a's default; 4-D over permuted heads)
    # The softmax under the products (where there is a second key tile: attn_sdpa_bf16's
    # 80 keys are one 128-key tile)
    case "$n:$w" in attn_sdpa_bf16:*block_n=128*) ;; *wgmma=2*) has "$q" "wgmma.wait_group.sync.aligned 1" ;; esac
    # The warpgroups' turns (named barriers of the pair's 256 threads).
    case "$w" in *pingpong=1*) has "$q" "bar.arrive" ;; *) lacks "$q" "bar.arrive" ;; esac
    # The producer warpgroup: its registers to the consumers, the copies at its one site.
    case "$w" in
      *warp_specialize=1) has "$q" "setmaxnreg.dec.sync.aligned.u32 24"; has "$q" "setmaxnreg.inc.sync.aligned.u32 240" ;;
      *) lacks "$q" "setmaxnreg" ;;
    esac
    # k's and v's 2 panels each at stages copy sites (tiles 0 .. stages - 2 before the
    # key loop, one in it; pipelined: 3; a producer warpgroup's loop: 1), over
    # attn_long_bf16's 320 keys (LLVM drops
    # the sites of tiles past 80 keys from attn_sdpa_bf16's kernel).
    st=2; case "$w" in *stages=*) st=${w#*stages=}; st=${st%% *} ;; *wgmma=2*) st=3 ;; esac
    case "$w" in *warp_specialize=1) st=1 ;; esac
    sites=$(cat "$q"/*.ptx | grep -c "cp.async.bulk.tensor.3d")
    [ "$n" != attn_long_bf16 ] || [ "$sites" = $((4 * st)) ] ||
      { echo "FAIL: $q: $sites TMA copies in the PTX, not $((4 * st))"; fail=1; }
    case "$w" in *group_heads=1) grep -q "group_heads=1" "$q/plan.json" || { echo "FAIL: $q: not group_heads=1"; fail=1; } ;; esac
  done
done
# The outer-reduction check graphs (tests/gpu/red_*.sf, gpu-pack's plans/ARCH/red/):
# right on the CPU; on sm_90a, in each of gpu-pack's variants, the form report.txt
# names: the default and "shuffles" with a warp's lanes on neighbouring rows (32 and 8
# of them; the partials through shared memory behind a barrier; shuffles only in
# "shuffles"), "one-row" with one row a block.
for g in "$src"/tests/gpu/red_*.sf; do
  n=$(basename "$g" .sf)
  "$sf" run "$g" --check >/dev/null || { echo "FAIL: run $g --check"; fail=1; }
  for v in default one-row shuffles; do
    p="$d/$n.$v"
    case "$v" in
      default) set -- ;;
      one-row) set -- --reduction-config "rows_per_block=1 threads_per_row=256" ;;
      shuffles) set -- --reduction-config "rows_per_block=8 threads_per_row=16" ;;
    esac
    "$sf" compile "$g" --arch sm_90a --no-ptxas --no-host "$@" -o "$p" >/dev/null || { echo "FAIL: compile $g $v"; fail=1; continue; }
    case "$v" in
      default) grep -q "a warp's lanes read 32 neighbouring rows" "$p/report.txt" || { echo "FAIL: $p: not 32 rows a warp"; fail=1; }
        has "$p" "bar.sync"; lacks "$p" "shfl.sync" ;;
      one-row) grep -q "outer reduction with one row a block" "$p/report.txt" || { echo "FAIL: $p: not one row a block"; fail=1; } ;;
      shuffles) grep -q "a warp's lanes read 8 neighbouring rows" "$p/report.txt" || { echo "FAIL: $p: not 8 rows a warp"; fail=1; }
        has "$p" "shfl.sync.bfly"; has "$p" "bar.sync" ;;
    esac
  done
done
# The split-row check graphs (tests/gpu/split_*.sf, gpu-pack's plans/ARCH/split/):
# right on the CPU; on sm_90a the default splits its rows (report.txt's form line,
# the count on the workspace's counter in the PTX) and no-split does not.
for g in "$src"/tests/gpu/split_*.sf; do
  n=$(basename "$g" .sf)
  "$sf" run "$g" --check >/dev/null || { echo "FAIL: run $g --check"; fail=1; }
  p="$d/$n.default"
  "$sf" compile "$g" --arch sm_90a --no-ptxas --no-host -o "$p" >/dev/null || { echo "FAIL: compile $g"; fail=1; continue; }
  grep -q "each row split over" "$p/report.txt" || { echo "FAIL: $p: rows not split"; fail=1; }
  has "$p" "atom.global.add.u32"
  p="$d/$n.no-split"
  "$sf" compile "$g" --arch sm_90a --no-ptxas --no-host --reduction-config "split_reduction=1" -o "$p" >/dev/null ||
    { echo "FAIL: compile $g no-split"; fail=1; continue; }
  ! grep -q "each row split over" "$p/report.txt" || { echo "FAIL: $p: rows split"; fail=1; }
  lacks "$p" "atom.global.add.u32"
done
[ -e "$d/failed" ] && fail=1
[ "$fail" = 0 ] && echo "ok: every tensor-core, outer-reduction and split-row check graph takes its paths"
