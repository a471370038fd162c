#!/usr/bin/env python3
"""What the kernel's cache time buys: `ls -l` and `stat` of many files, again after a pause.

Creates N files in a folder (through the first mount), then for each folder given (the native
folder, a mount with the default cache time, a mount of the same store with a 1 s cache time)
lists it with `ls -l` and stats every file once to warm it, then after 2 s (past a 1 s cache
time) times a `stat` of every file, and after 2 s more an `ls -l` (which also reads two extended
attributes per file, which the kernel never caches). Prints the warm times and the ratio native time / time.
"""
import argparse, os, subprocess, time

def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--native", required=True)
    ap.add_argument("--mount", action="append", required=True, help="LABEL=FOLDER")
    ap.add_argument("--files", type=int, default=10000)
    # Options of other suites pass through (scripts/bench all takes them all).
    args, _ = ap.parse_known_args()
    folders = [("native", args.native)] + [tuple(m.split("=", 1)) for m in args.mount]
    for label, folder in folders[:2]:
        os.makedirs(os.path.join(folder, "many"), exist_ok=True)
        for i in range(args.files):
            open(os.path.join(folder, "many", "f%05d" % i), "w").close()
    time.sleep(1)   # the other mounts see the files through the change feed
    results = {}
    for label, folder in folders:
        d = os.path.join(folder, "many")
        names = [os.path.join(d, n) for n in sorted(os.listdir(d))]
        ls = lambda: subprocess.run(["ls", "-l", d], stdout=subprocess.DEVNULL, check=True)
        st = lambda: [os.stat(n) for n in names]
        ls(); st()
        time.sleep(2)
        stat_time = timed(st)
        time.sleep(2)
        results[label] = (timed(ls), stat_time)
    native = results["native"]
    for label, (ls_t, st_t) in results.items():
        print("%-22s ls -l %7.1f ms (%.2f)   stat all %7.1f ms (%.2f)" % (
            label, ls_t * 1e3, native[0] / ls_t, st_t * 1e3, native[1] / st_t))

if __name__ == "__main__":
    main()
