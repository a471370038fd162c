#!/usr/bin/env python3
"""Sequential read throughput on a shared store, as a second machine sees a file the first wrote.

Writes N MiB of random data through mount A, waits until mount B shows it, then reads it through
B three times, dropping the page cache before each: cold (B evicted its copy: every chunk comes
from the object store), warm (B's chunk cache has it: local file reads), and the same file in the
native folder. Prints MiB/s and the ratio to native; repeats `--rounds` times, interleaved, and
prints medians.
"""
import argparse, os, statistics, subprocess, time

def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")

def read_all(path):
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(1 << 20):
            pass
    return time.perf_counter() - start

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--native", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    # Options of other suites pass through (scripts/bench all takes them all).
    args, _ = ap.parse_known_args()
    size = args.mib << 20
    data = os.urandom(size)
    native = os.path.join(args.native, "throughput.bin")
    with open(native, "wb") as f:
        f.write(data)
    a = os.path.join(args.a, "throughput.bin")
    start = time.perf_counter()
    with open(a, "wb") as f:
        f.write(data)
    write_s = time.perf_counter() - start
    b = os.path.join(args.b, "throughput.bin")
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            if os.stat(b).st_size == size:
                break
        except OSError:
            pass
        time.sleep(0.05)
    results = {"cold": [], "warm": [], "native": []}
    for _ in range(args.rounds):
        subprocess.run([args.bin, "evict", b], check=True, stdout=subprocess.DEVNULL)
        drop_caches()
        results["cold"].append(size / read_all(b) / (1 << 20))
        drop_caches()
        results["warm"].append(size / read_all(b) / (1 << 20))
        drop_caches()
        results["native"].append(size / read_all(native) / (1 << 20))
    with open(b, "rb") as f:
        same = f.read() == data
    native_median = statistics.median(results["native"])
    print("throughput: sequential read of %d MiB through mount B, written through A (%.0f MiB/s to write and close)"
          % (args.mib, size / write_s / (1 << 20)))
    print("%-8s %10s %8s %s" % ("read", "MiB/s", "ratio", "rounds"))
    for kind, xs in results.items():
        m = statistics.median(xs)
        print("%-8s %10.1f %8.3f %s" % (kind, m, m / native_median, " ".join("%.0f" % x for x in xs)))
    print("content read back through B is %s" % ("identical" if same else "DIFFERENT"))

if __name__ == "__main__":
    main()
