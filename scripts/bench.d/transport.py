#!/usr/bin/env python3
"""What a bare FUSE round trip costs on this machine, through /dev/fuse and through
FUSE-over-io_uring: a one-file server (transport-probe.c, built here) answers getxattr with
ENODATA, and a loop of getxattr calls times it. UbiquityFS itself is not involved: the figures say
how much of a metadata operation's cost is the transport, and what io_uring would buy.

FUSE-over-io_uring needs the fuse module's `enable_uring` parameter: with --enable-uring the
suite sets it for the run and puts it back after; without, the io_uring rows are left out.
"""
import argparse, errno, os, shutil, signal, statistics, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
PARAM = "/sys/module/fuse/parameters/enable_uring"
VARIANTS = [("dev", ["dev"], "/dev/fuse, 4 threads"),
            ("uring", ["uring"], "io_uring, a queue per CPU, threads pinned"),
            ("uring-idle", ["uring", "--idle"], "io_uring, pinned, SCHED_IDLE threads")]


def log(msg):
    print(msg, flush=True)


def mounted(path):
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


class Interrupted(Exception):
    pass


def round_trip_us(path, calls, answers):
    """Microseconds per getxattr, the median of five loops of `calls`; each must fail with one of
    `answers` (the probe's ENODATA), or the measurement is of something else."""
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            try:
                os.getxattr(path, "user.none")
            except OSError as e:
                if e.errno not in answers:
                    raise RuntimeError("getxattr %s: %s" % (path, os.strerror(e.errno)))
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def unmount(mnt):
    for args in (["fusermount3", "-u", mnt], ["fusermount3", "-uz", mnt]):
        if not mounted(mnt):
            return
        try:
            subprocess.run(args, capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            pass


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3; quick 1)")
    ap.add_argument("--calls", type=int, default=2000, help="getxattr calls per loop (2000; quick 200)")
    ap.add_argument("--enable-uring", action="store_true", help="set the fuse module's enable_uring for the run")
    ap.add_argument("--quick", action="store_true", help="a short run: proves the suite works")
    a, _ = ap.parse_known_args()
    if a.quick:
        a.rounds, a.calls = 1, 200
    if os.geteuid() != 0:
        ap.error("run as root: the probe mounts with mount(2)")
    def on_signal(signum, _frame):
        raise Interrupted("signal %d" % signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    work = tempfile.mkdtemp(prefix="ubiquityfs-transport-")
    variants, old_param, procs = list(VARIANTS), None, {}
    try:
        probe = os.path.join(work, "transport-probe")
        subprocess.run(["cc", "-O2", "-Wall", "-o", probe, os.path.join(HERE, "transport-probe.c"), "-lpthread"],
                       check=True, timeout=120)
        if not os.path.exists(PARAM):
            log("transport: this kernel has no FUSE-over-io_uring: /dev/fuse only")
            variants = variants[:1]
        else:
            with open(PARAM) as f:
                current = f.read().strip()
            if current != "Y" and a.enable_uring:
                old_param = current
                with open(PARAM, "w") as f:
                    f.write("Y")
            elif current != "Y":
                log("transport: the fuse module's enable_uring is off (pass --enable-uring to set it for the run): /dev/fuse only")
                variants = variants[:1]

        for name, args, _ in variants:
            mnt = os.path.join(work, name)
            os.mkdir(mnt)
            procs[name] = subprocess.Popen([probe] + args + [mnt], stdin=subprocess.DEVNULL)
            deadline = time.time() + 10
            while not mounted(mnt) and time.time() < deadline and procs[name].poll() is None:
                time.sleep(0.05)
            if not mounted(mnt):
                raise RuntimeError("%s: the probe did not mount" % name)
            os.stat(os.path.join(mnt, "x"))   # the rings register right after INIT
            time.sleep(0.2)
        results = {name: [] for name, _, _ in variants}
        for _ in range(a.rounds):
            for name, _, _ in variants:
                results[name].append(round_trip_us(os.path.join(work, name, "x"), a.calls, (errno.ENODATA,)))
        native = round_trip_us(probe, a.calls, (errno.ENODATA, errno.EOPNOTSUPP))
        # Each probe still serving, and the rings (not /dev/fuse) carrying the io_uring rows' calls.
        for name, _, _ in variants:
            if procs[name].poll() is not None:
                raise RuntimeError("%s: the probe ended (status %s)" % (name, procs[name].returncode))
            served = os.stat(os.path.join(work, name, "served")).st_size
            if name != "dev" and served < a.rounds * 5 * a.calls:
                raise RuntimeError("%s: the rings carried %d of the %d calls" % (name, served, a.rounds * 5 * a.calls))
        log("transport: getxattr round trip, median of %d round(s) of 5 x %d calls, app not pinned" % (a.rounds, a.calls))
        log("  %-12s %8s  %s" % ("transport", "us/call", "how"))
        log("  %-12s %8.1f  %s" % ("native", native, "the probe's own file, no round trip"))
        for name, _, how in variants:
            log("  %-12s %8.1f  %s" % (name, statistics.median(results[name]), how))
        return 0
    except (Interrupted, RuntimeError, OSError, subprocess.SubprocessError) as e:
        log("transport: %s" % e)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)   # the clean-up below runs to its end
        for name, p in procs.items():
            unmount(os.path.join(work, name))
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if old_param is not None:
            with open(PARAM, "w") as f:
                f.write(old_param)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
