#!/usr/bin/env python3
"""Do lookups wait for other processes' metadata commits?

A reader looks up a name that does not exist (the kernel caches no negative answer here, so each
one reaches the daemon) as fast as it can, first alone and then while a writer process makes and
removes folders with an fsync of their parent after each (a durable commit each time). Prints the
reader's latency (median, p99, maximum) in both phases, on the mount and on the native folder.
"""
import argparse, multiprocessing, os, statistics, time

def writer(folder, stop):
    fd = os.open(folder, os.O_RDONLY)
    i = 0
    while not stop.is_set():
        path = os.path.join(folder, "w%06d" % i)
        os.mkdir(path)
        os.fsync(fd)
        os.rmdir(path)
        i += 1
    os.close(fd)

def read_for(folder, seconds):
    missing = os.path.join(folder, "no-such-name")
    out = []
    end = time.perf_counter() + seconds
    while True:
        t = time.perf_counter()
        if t > end:
            return out
        try:
            os.stat(missing)
        except FileNotFoundError:
            pass
        out.append(time.perf_counter() - t)

def figures(xs):
    xs = sorted(xs)
    us = lambda v: "%.0f µs" % (v * 1e6)
    return "median %s, p99 %s, max %s (%d lookups)" % (
        us(statistics.median(xs)), us(xs[int(len(xs) * 0.99)]), us(xs[-1]), len(xs))

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True)
    ap.add_argument("--native", required=True)
    ap.add_argument("--seconds", type=float, default=5)
    # Options of other suites pass through (scripts/bench all takes them all).
    args, _ = ap.parse_known_args()
    for label, folder in (("native", args.native), ("ubiquityfs", args.mount)):
        alone = read_for(folder, args.seconds)
        stop = multiprocessing.Event()
        w = multiprocessing.Process(target=writer, args=(folder, stop))
        w.start()
        time.sleep(0.2)
        busy = read_for(folder, args.seconds)
        stop.set()
        w.join()
        print("%-10s lookups alone:            %s" % (label, figures(alone)))
        print("%-10s lookups beside a writer:  %s" % (label, figures(busy)))

if __name__ == "__main__":
    main()
