#!/usr/bin/env python3
"""`rm -rf` of a tree of N small files, which in a container's Documents moves everything into
Recently Deleted (a metadata change per item), against the native folder; then emptying Recently
Deleted (`ubiquityfs trash empty`), which deletes versions and content for good.

Three interleaved rounds; prints each time, the medians and the ratio native time / time.
"""
import argparse, os, statistics, subprocess, time

def make_tree(root, files):
    os.makedirs(root)
    per = 100
    for d in range((files + per - 1) // per):
        sub = os.path.join(root, "d%03d" % d)
        os.mkdir(sub)
        for i in range(min(per, files - d * per)):
            with open(os.path.join(sub, "f%03d" % i), "w") as f:
                f.write("x")

def timed(argv):
    t = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - t

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--native", required=True)
    ap.add_argument("--mount", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--files", type=int, default=10000)
    # Options of other suites pass through (scripts/bench all takes them all).
    args, _ = ap.parse_known_args()
    native, mounted, empty = [], [], []
    for r in range(3):
        for label, folder, out in (("native", args.native, native), ("ubiquityfs", args.mount, mounted)):
            tree = os.path.join(folder, "rmrf-%d" % r)
            make_tree(tree, args.files)
            subprocess.run(["sync"], check=True)
            out.append(timed(["rm", "-rf", tree]))
            print(f"round {r + 1} {label}: rm -rf of {args.files} files {out[-1]:.3f} s", flush=True)
        empty.append(timed([args.bin, "trash", "empty", "--store", args.store]))
        print(f"round {r + 1} ubiquityfs: trash empty {empty[-1]:.3f} s", flush=True)
    n, m, e = statistics.median(native), statistics.median(mounted), statistics.median(empty)
    print(f"rm -rf {args.files} files: native {n:.3f} s, ubiquityfs {m:.3f} s (into Recently Deleted), ratio {n / m:.3f}")
    print(f"trash empty of {args.files + args.files // 100 + 1} items: {e:.3f} s ({(args.files + args.files // 100 + 1) / e:.0f} items/s)")

if __name__ == "__main__":
    main()
