#!/usr/bin/env python3
"""How long a change made through one mount takes to show through another mount of the same store.

Makes N changes through mount A, one at a time (create, new content, rename, chmod, in turn),
and after each polls mount B every millisecond until it shows: with `stat` and, for content, a
read. Prints the latency's median, p99 and maximum (the goal: p99 under 1 s).
"""
import argparse, os, statistics, time

def wait_for(check, limit=10.0):
    start = time.perf_counter()
    while True:
        if check():
            return time.perf_counter() - start
        if time.perf_counter() - start > limit:
            return None
        time.sleep(0.001)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--changes", type=int, default=1000)
    # Options of other suites pass through (scripts/bench all takes them all).
    args, _ = ap.parse_known_args()
    a, b = args.a, args.b
    kinds = {"create": [], "content": [], "rename": [], "chmod": []}
    missed = 0
    name = None
    for i in range(args.changes):
        kind = list(kinds)[i % 4]
        if kind == "create":
            name = "f%05d" % i
            t = time.perf_counter()
            with open(os.path.join(a, name), "w") as f:
                f.write("first\n")
            check = lambda: os.path.exists(os.path.join(b, name))
        elif kind == "content":
            text = "content %d\n" % i
            with open(os.path.join(a, name), "w") as f:
                f.write(text)
            def check(text=text):
                try:
                    with open(os.path.join(b, name)) as f:
                        return f.read() == text
                except OSError:
                    return False
        elif kind == "rename":
            new = name + ".renamed"
            os.rename(os.path.join(a, name), os.path.join(a, new))
            name = new
            check = lambda: os.path.exists(os.path.join(b, name))
        else:
            os.chmod(os.path.join(a, name), 0o600)
            def check():
                try:
                    return os.stat(os.path.join(b, name)).st_mode & 0o777 == 0o600
                except OSError:
                    return False
        latency = wait_for(check)
        if latency is None:
            missed += 1
        else:
            kinds[kind].append(latency)
    every = sorted(x for v in kinds.values() for x in v)
    def p(xs, q):
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")
    print("twomounts: latency of %d changes through mount A until mount B shows them (ms)" % args.changes)
    print("%-8s %6s %8s %8s %8s" % ("kind", "count", "median", "p99", "max"))
    for kind, xs in kinds.items():
        xs = sorted(xs)
        print("%-8s %6d %8.1f %8.1f %8.1f" % (kind, len(xs), p(xs, 0.5), p(xs, 0.99), p(xs, 1.0)))
    print("%-8s %6d %8.1f %8.1f %8.1f" % ("all", len(every), p(every, 0.5), p(every, 0.99), p(every, 1.0)))
    if missed:
        print("missed (not seen within 10 s): %d" % missed)

if __name__ == "__main__":
    main()
