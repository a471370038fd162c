#!/usr/bin/env python3
"""Cost of one metadata change against namespace size, on the mount and on the native folder.

Grows a tree of files spread over 100 folders to each size in turn and, at each size, times a
batch of mkdir+rmdir, create+close and unlink in a folder of its own. Prints microseconds per
operation (median of batches), each size's cost against the empty namespace (flat is the goal),
the mount against native, and how long each tenth of the growth took (linear is the goal).
"""
import argparse, os, statistics, time

def grow(base, start, stop, folders=100):
    for i in range(start, stop):
        d = os.path.join(base, "d%02d" % (i % folders))
        if i < folders:
            os.mkdir(d)
        os.close(os.open(os.path.join(d, "f%07d" % i), os.O_CREAT | os.O_WRONLY, 0o644))

def per_op(fn, ops, batches=5):
    times = []
    for b in range(batches):
        t = time.perf_counter()
        fn(b, ops)
        times.append((time.perf_counter() - t) / ops * 1e6)
    return statistics.median(times)

def measure(base, ops, tag):
    probe = os.path.join(base, "probe-" + tag)
    os.mkdir(probe)
    def mkdirs(b, n):
        for i in range(n):
            p = os.path.join(probe, "m%d-%d" % (b, i))
            os.mkdir(p)
            os.rmdir(p)
    def creates(b, n):
        for i in range(n):
            os.close(os.open(os.path.join(probe, "c%d-%d" % (b, i)), os.O_CREAT | os.O_WRONLY, 0o644))
    def unlinks(b, n):
        for i in range(n):
            os.unlink(os.path.join(probe, "c%d-%d" % (b, i)))
    r = {"mkdir+rmdir": per_op(mkdirs, ops), "create": per_op(creates, ops), "unlink": per_op(unlinks, ops)}
    os.rmdir(probe)
    return r

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--native", required=True)
    ap.add_argument("--sizes", default="0,10000,100000")
    ap.add_argument("--ops", type=int, default=300)
    # Options of other suites pass through (scripts/bench all takes them all).
    a, _ = ap.parse_known_args()
    sizes = sorted(int(s) for s in a.sizes.split(","))
    rows = []
    growth = {"mount": [], "native": []}
    have = 0
    for size in sizes:
        for label, base in (("mount", a.mount), ("native", a.native)):
            step = max(1, (size - have) // 10) if size > have else 0
            n = have
            while n < size:
                m = min(size, n + step)
                t = time.perf_counter()
                grow(base, n, m)
                growth[label].append((m - n, time.perf_counter() - t))
                n = m
        have = size
        rows.append((size, measure(a.mount, a.ops, str(size)), measure(a.native, a.ops, str(size))))
    ops = list(rows[0][1].keys())
    print("namespace: µs per operation (median of 5 batches of %d) against namespace size" % a.ops)
    print("%9s  " % "items" + "  ".join("%-34s" % o for o in ops))
    print("%9s  " % "" + "  ".join("%-34s" % "mount   native  vs-empty  vs-native" for _ in ops))
    for size, mount, native in rows:
        cells = []
        for o in ops:
            cells.append("%7.1f %8.1f %8.2fx %9.3f " % (mount[o], native[o], mount[o] / rows[0][1][o], native[o] / mount[o]))
        print("%9d  " % size + "  ".join(cells))
    for label in ("mount", "native"):
        slices = [t / c * 1e6 for c, t in growth[label] if c]
        if len(slices) >= 2:
            print("growth (%s): %s µs/file per tenth; last/first = %.2f" %
                  (label, " ".join("%.0f" % s for s in slices[-10:]), slices[-1] / slices[0]))
    print("(vs-empty: this size's cost / the first size's, flat = 1.00; vs-native: native time / mount time)")

if __name__ == "__main__":
    main()
