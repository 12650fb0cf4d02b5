#!/usr/bin/env python3
"""An estimate, not a measurement: how long a causal attention grid takes on a GPU
whose SMs each start the next block (in index order) as soon as they are free, in
the grid's plain order (kv-head group by group, query tiles ascending) and in the
longest-first order of KernelConfig::group_heads (docs/kernels.md, "Block order").

A block's cost is its key tiles (query tile t of a causal attention with as many
keys as rows reads t + 1) plus a fixed cost for its q tile and store. One block an
SM at a time (the sm_90a default tile's 512 threads and 160 KiB take a whole SM).

  bench/models/attention_order.py                      # the bench's sdpa shapes
  bench/models/attention_order.py --groups 64 --tiles 32 --width 16 --sms 132
"""
import argparse
import heapq


def makespan(costs, sms):
    free = [0.0] * sms
    heapq.heapify(free)
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + c)
    return max(free)


def orders(groups, tiles, width, fixed):
    plain = [t + 1 + fixed for g in range(groups) for t in range(tiles)]
    lpt = []
    for first in range(0, groups, width):
        n = min(width, groups - first)
        lpt += [t + 1 + fixed for t in reversed(range(tiles)) for _ in range(n)]
    return plain, lpt


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, nargs="*", default=[64, 32, 8],
                   help="kv-head groups (batch x kv heads); sdpa: 8 x 8 = 64")
    p.add_argument("--tiles", type=int, default=32, help="query tiles a group (sdpa at 64 rows a head: 32)")
    p.add_argument("--width", type=int, default=16, help="groups a section (group_heads; sdpa default 16)")
    p.add_argument("--sms", type=int, default=132)
    p.add_argument("--fixed", type=float, default=1.5, help="a block's fixed cost, in key tiles")
    a = p.parse_args()
    print("groups tiles width  plain/ideal  longest-first/ideal  time saved")
    for g in a.groups:
        plain, lpt = orders(g, a.tiles, min(a.width, g), a.fixed)
        ideal = sum(plain) / a.sms
        tp, tl = makespan(plain, a.sms), makespan(lpt, a.sms)
        print(f"{g:6d} {a.tiles:5d} {min(a.width, g):5d}  {tp / ideal:11.3f}  {tl / ideal:19.3f}  {1 - tl / tp:10.3f}")


if __name__ == "__main__":
    main()
