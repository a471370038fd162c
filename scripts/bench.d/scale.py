#!/usr/bin/env python3
"""The mount at scale: a namespace grown to each size in turn (files spread over 100 folders, and
one folder of 1,000), on the mount and on the native folder. At each size it prints how long
each tenth of the growth took (linear is the goal), one mkdir's cost, the daemon's RSS, how long
an unmount and a mount take until the mount answers, the RSS after that mount, and a cold `ls -l`
of the 1,000-entry folder against native.
"""
import argparse, os, statistics, subprocess, time

from namespace import grow


def rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mkdir_us(base, ops=300):
    probe = os.path.join(base, "probe")
    os.makedirs(probe, exist_ok=True)
    times = []
    for b in range(5):
        t = time.perf_counter()
        for i in range(ops):
            p = os.path.join(probe, "m%d-%d" % (b, i))
            os.mkdir(p)
            os.rmdir(p)
        times.append((time.perf_counter() - t) / ops * 1e6)
    os.rmdir(probe)
    return statistics.median(times)


def ls_cold(folder):
    drop_caches()
    t = time.perf_counter()
    subprocess.run(["ls", "-l", folder], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="the mountpoint")
    ap.add_argument("--container", default="SugoiApp")
    ap.add_argument("--native", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--apps", required=True)
    ap.add_argument("--items", default="100000,1000000", help="namespace sizes, comma-separated")
    a, _ = ap.parse_known_args()
    sizes = sorted(int(s) for s in a.items.split(","))
    pidfile = os.path.join(a.store, "daemon.pid")
    base = {"mount": os.path.join(a.mount, a.container), "native": a.native}
    for label in base:
        os.makedirs(os.path.join(base[label], "thousand"))
        for i in range(1000):
            os.close(os.open(os.path.join(base[label], "thousand", "f%04d" % i), os.O_CREAT | os.O_WRONLY, 0o644))
    pid = int(open(pidfile).read())
    print("scale: idle RSS %.0f MiB" % rss_mib(pid))
    have = 0
    for size in sizes:
        tenths = {}
        for label in ("mount", "native"):
            step = max(1, (size - have) // 10)
            n, tenths[label] = have, []
            while n < size:
                m = min(size, n + step)
                t = time.perf_counter()
                grow(base[label], n, m)
                tenths[label].append((m - n, time.perf_counter() - t))
                n = m
        have = size
        print("scale: %d items" % size)
        for label in ("mount", "native"):
            per = [t / c * 1e6 for c, t in tenths[label]]
            print("  growth (%s): %s µs/file per tenth; last/first = %.2f; %.1f s in all"
                  % (label, " ".join("%.0f" % x for x in per), per[-1] / per[0], sum(t for _, t in tenths[label])))
        print("  mkdir+rmdir: mount %.0f µs, native %.0f µs" % (mkdir_us(base["mount"]), mkdir_us(base["native"])))
        print("  daemon RSS after growing: %.0f MiB" % rss_mib(pid))
        t = time.perf_counter()
        subprocess.run([a.bin, "unmount", a.mount], check=True, stdout=subprocess.DEVNULL)
        unmounted = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run([a.bin, "mount", "--apps", a.apps, "--store", a.store, a.mount], check=True)
        mounted = time.perf_counter() - t
        pid = int(open(pidfile).read())
        # The daemon hands the pages of the snapshot it loaded back right after it answers.
        time.sleep(1)
        print("  unmount %.2f s; mount until it answers %.2f s; RSS 1 s after the mount %.0f MiB"
              % (unmounted, mounted, rss_mib(pid)))
        ours = statistics.median(ls_cold(os.path.join(base["mount"], "thousand")) for _ in range(3))
        native = statistics.median(ls_cold(os.path.join(base["native"], "thousand")) for _ in range(3))
        print("  ls -l of 1,000 entries, cold: mount %.3f s, native %.3f s (%.2fx native's time); RSS %.0f MiB"
              % (ours, native, ours / native, rss_mib(pid)))


if __name__ == "__main__":
    main()
