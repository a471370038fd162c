#!/usr/bin/env python3
"""UbiquityFS side by side with the native folder and other FUSE filesystems ("peers").

Systems, each over a folder of its own on the same disk: native (the plain folder), ubiquityfs
(the mount scripts/bench made, inside its SugoiApp container), ubiquityfs_dev (with --mount-dev:
a second UbiquityFS daemon that keeps every request on /dev/fuse, beside one served over
io_uring), passthrough_ll and passthrough_fh
(libfuse's examples, built here from Debian's libfuse3-dev), bindfs and rclone (`rclone mount
:local:DIR --vfs-cache-mode writes`). A peer that fails to mount is reported as such; the run goes
on. libfuse's C++ passthrough_hp is not shipped by Debian (and cannot be fetched here): not run.

Workloads (the rows), each on every system, interleaved: each round runs every workload on every
system in turn, the next round in another order. Per system: the median over rounds, the ratio to
native (system / native for rates, native time / system time for times: above 1 is faster than
native) and the spread (lowest and highest ratio of one round to the same round's native figure).
For ubiquityfs also the daemon's CPU seconds (utime+stime) spent in each workload (median), its
RSS after it and its peak RSS (VmHWM) so far (largest over rounds).

Prints one table; writes peers.csv, ratios.dat and peers.png (gnuplot, when installed) to --out.
"""
import argparse, csv, json, math, os, random, shutil, signal, statistics, subprocess, sys, tarfile, tempfile, time

EXAMPLES = "/usr/share/doc/libfuse3-dev/examples"
# What libfuse's meson build defines on Linux: without them passthrough_fh has no utimens (tar
# fails to set times), no fallocate and no extended attributes.
EXAMPLE_DEFINES = ["-DHAVE_UTIMENSAT", "-DHAVE_POSIX_FALLOCATE", "-DHAVE_FALLOCATE", "-DHAVE_SETXATTR",
                   "-DHAVE_FSTATAT", "-DHAVE_COPY_FILE_RANGE"]
ALL_SYSTEMS = ["native", "ubiquityfs", "passthrough_ll", "passthrough_fh", "bindfs", "rclone"]
OURS = ("ubiquityfs", "ubiquityfs_dev")   # mounted by scripts/bench, not here
QUICK = dict(size=16, files=500, git_files=500, tar_entries=200, rounds=1, fio_size=16, fio_runtime=2, appends=20)
FULL = dict(size=1024, files=10000, git_files=10000, tar_entries=2000, rounds=3, fio_size=256, fio_runtime=10, appends=50)
MIB = 1 << 20


class Interrupted(Exception):
    def __init__(self, signum):
        super().__init__("signal %d" % signum)
        self.signum = signum


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return "%.0f" % v
    return "%.3g" % v


def mounted(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            if line.split()[1].replace("\\040", " ") == path:
                return True
    return False


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class System:
    def __init__(self, name, folder, mnt=None):
        self.name, self.folder, self.mnt = name, folder, mnt
        self.proc = None        # the peer's daemon, run in the foreground as our child
        self.error = None       # why it is not measured at all (did not build or mount)
        self.dead = False
        self.setup_errors = {}  # step -> why its setup failed
        self.log = None


class Bench:
    def __init__(self, a):
        self.a = a
        self.work = os.path.join(a.work, "peers")
        self.pidfile = os.path.join(a.work, "peers.pids")
        self.systems = []
        self.shm = None
        self.timeout = 300 if a.quick else 3600
        self.rows = []          # (key, label, unit, kind) with kind "rate" or "time"
        self.values = {}        # key -> system -> [figure per round] (None for a failed round)
        self.errors = {}        # (key, system) -> first error
        self.cpu = {}           # key -> [daemon CPU seconds per round]
        self.rss = {}           # key -> (largest VmRSS after, largest VmHWM) in KiB
        self.notes = []

    # ---- systems -------------------------------------------------------------------------------

    def record_pid(self, pid):
        with open(self.pidfile, "a") as f:
            f.write("%d\n" % pid)

    def build_example(self, name):
        out = os.path.join(self.work, "bin", name)
        if os.path.exists(out):
            return out
        os.makedirs(os.path.dirname(out), exist_ok=True)
        flags = subprocess.run(["pkg-config", "fuse3", "--cflags", "--libs"], capture_output=True, text=True)
        if flags.returncode != 0:
            raise RuntimeError("pkg-config fuse3: " + flags.stderr.strip())
        cmd = ["cc", "-Wall", "-O2"] + EXAMPLE_DEFINES + ["-I" + EXAMPLES, os.path.join(EXAMPLES, name + ".c"),
                                                          "-o", out] + flags.stdout.split() + ["-lfuse3"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("cc %s.c failed: %s" % (name, (r.stderr.strip().splitlines() or ["?"])[-1]))
        return out

    def start_peer(self, s, argv, src):
        os.makedirs(s.mnt, exist_ok=True)
        s.log = os.path.join(self.work, s.name + ".log")
        logf = open(s.log, "w")
        try:
            s.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                      start_new_session=True)   # a Ctrl-C is ours to handle, not the daemon's
        finally:
            logf.close()
        self.record_pid(s.proc.pid)
        deadline = time.time() + 30
        while time.time() < deadline:
            if mounted(s.mnt):
                break
            if s.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not mounted(s.mnt):
            with open(s.log, errors="replace") as f:
                tail = [l.strip() for l in f.read().splitlines() if l.strip()][-1:]
            raise RuntimeError("did not mount (%s)%s" % (
                "exited %s" % s.proc.returncode if s.proc.poll() is not None else "no mount after 30 s",
                ": " + tail[0] if tail else ""))
        os.makedirs(s.folder, exist_ok=True)

    def add_system(self, name):
        a = self.a
        base = os.path.join(self.work, name)
        src, mnt = os.path.join(base, "src"), os.path.join(base, "mnt")
        if name == "native":
            s = System(name, os.path.join(a.native, "peers"))
        elif name == "ubiquityfs":
            s = System(name, os.path.join(a.mount, "peers"))
        elif name == "ubiquityfs_dev":
            s = System(name, os.path.join(a.mount_dev or "/nonexistent", "peers"))
        elif name == "passthrough_fh":   # mirrors / whole: the source folder is under the mount
            s = System(name, mnt + os.path.realpath(src), mnt)
        else:
            s = System(name, mnt, mnt)
        self.systems.append(s)
        try:
            if name in ("native",) + OURS:
                if name == "ubiquityfs" and not a.mount:
                    raise RuntimeError("no --mount given")
                if name == "ubiquityfs_dev" and not a.mount_dev:
                    raise RuntimeError("no --mount-dev given")
                os.makedirs(s.folder, exist_ok=True)
                return
            os.makedirs(src, exist_ok=True)
            if name == "passthrough_ll":
                self.start_peer(s, [self.build_example(name), "-f", "-o", "source=" + src, mnt], src)
            elif name == "passthrough_fh":
                self.start_peer(s, [self.build_example(name), "-f", mnt], src)
            elif name == "bindfs":
                if not shutil.which("bindfs"):
                    raise RuntimeError("bindfs is not installed")
                self.start_peer(s, ["bindfs", "-f", src, mnt], src)
            elif name == "rclone":
                if not shutil.which("rclone"):
                    raise RuntimeError("rclone is not installed")
                self.start_peer(s, ["rclone", "mount", "--config", os.path.join(base, "rclone.conf"),
                                    "--cache-dir", os.path.join(base, "cache"), "--vfs-cache-mode", "writes",
                                    ":local:" + src, mnt], src)
        except Exception as e:   # noqa: BLE001 (a peer that fails is reported, the run goes on)
            s.error = str(e)
            log("peers: %s: %s" % (name, s.error))

    def stop_peers(self):
        for s in self.systems:
            if s.mnt and mounted(s.mnt):
                r = subprocess.run(["fusermount3", "-u", s.mnt], capture_output=True)
                if r.returncode != 0:
                    subprocess.run(["fusermount3", "-uz", s.mnt], capture_output=True)
            if s.proc is not None and s.proc.poll() is None:
                try:
                    s.proc.wait(timeout=15)   # rclone writes back what it still holds first
                except subprocess.TimeoutExpired:
                    s.proc.terminate()
                    try:
                        s.proc.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        s.proc.kill()
                        s.proc.wait()
        try:
            os.unlink(self.pidfile)
        except FileNotFoundError:
            pass

    # ---- measuring -----------------------------------------------------------------------------

    def row(self, key, label, unit, kind):
        self.rows.append((key, label, unit, kind))
        self.values[key] = {s.name: [] for s in self.systems}

    def daemon_stat(self):
        if not self.a.pid:
            return None
        try:
            with open("/proc/%d/stat" % self.a.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            mem = {}
            with open("/proc/%d/status" % self.a.pid) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in ("VmRSS", "VmHWM"):
                        mem[k] = int(v.split()[0])
            return cpu, mem.get("VmRSS", 0), mem.get("VmHWM", 0)
        except (OSError, IndexError, ValueError):
            return None

    def measure(self, s, key, fn):
        """Runs fn (which returns the figure) for system s and records it under row key."""
        before = self.daemon_stat() if s.name == "ubiquityfs" else None
        value = fn()
        self.values[key][s.name].append(value)
        if before is not None:
            after = self.daemon_stat()
            if after is not None:
                self.cpu.setdefault(key, []).append(after[0] - before[0])
                rss, hwm = self.rss.get(key, (0, 0))
                self.rss[key] = (max(rss, after[1]), max(hwm, after[2]))
        return value

    def run(self, argv, **kw):
        kw.setdefault("stdout", subprocess.DEVNULL)
        kw.setdefault("stderr", subprocess.PIPE)
        r = subprocess.run(argv, timeout=self.timeout, **kw)
        if r.returncode != 0:
            err = r.stderr.decode(errors="replace").strip().splitlines() if r.stderr else []
            raise RuntimeError("%s exited %d%s" % (os.path.basename(argv[0]), r.returncode, ": " + err[-1] if err else ""))
        return r

    def timed(self, argv, **kw):
        t = time.perf_counter()
        self.run(argv, **kw)
        return time.perf_counter() - t

    # ---- fixtures ------------------------------------------------------------------------------

    def make_fixtures(self):
        a = self.a
        # Random data for the sequential write, in RAM (tmpfs) when there is room: dropping the page
        # cache does not evict it, so dd measures the filesystem, not the disk it reads from.
        st = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
        if st and st.f_bavail * st.f_frsize > a.size * MIB * 2 + (1 << 30):
            self.shm = tempfile.mkdtemp(prefix="ubiquityfs-peers-", dir="/dev/shm")
            self.rand = os.path.join(self.shm, "random.bin")
        else:
            self.rand = os.path.join(self.work, "random.bin")
        with open(self.rand, "wb") as f:
            for _ in range(a.size):
                f.write(os.urandom(MIB))
        # The same tarball for every system: the first entries of /usr/include (folders and regular
        # files only, so that every peer can take it).
        self.tarball = os.path.join(self.work, "tree.tar")
        n = 0
        with tarfile.open(self.tarball, "w") as t:
            for dirpath, dirnames, filenames in os.walk("/usr/include"):
                dirnames.sort()
                rel = os.path.relpath(dirpath, "/usr")
                t.add(dirpath, arcname=rel, recursive=False)
                n += 1
                for name in sorted(filenames):
                    p = os.path.join(dirpath, name)
                    if n >= a.tar_entries:
                        break
                    if os.path.isfile(p) and not os.path.islink(p):
                        t.add(p, arcname=os.path.join(rel, name), recursive=False)
                        n += 1
                if n >= a.tar_entries:
                    break
        self.tar_count = n
        self.fio = shutil.which("fio")
        self.git = shutil.which("git")
        rng = random.Random(1)
        self.offsets = [rng.randrange(0, a.size * MIB // 4096) * 4096 for _ in range(a.appends)]
        self.blocks = [os.urandom(4096) for _ in range(a.appends)]

    def setup_system(self, s):
        """Untimed: the fio file and the git checkout each system works on."""
        a = self.a
        if self.fio:
            try:
                with open(os.path.join(s.folder, "fio.bin"), "wb") as f:
                    for _ in range(a.fio_size):
                        f.write(os.urandom(MIB))
            except OSError as e:
                s.setup_errors["fio"] = "fio file: %s" % e
        if self.git:
            try:
                repo = os.path.join(s.folder, "repo")
                os.makedirs(repo)
                for i in range(a.git_files):
                    d = os.path.join(repo, "d%02d" % (i % 100))
                    if i < 100:
                        os.mkdir(d)
                    with open(os.path.join(d, "f%05d.txt" % i), "w") as f:
                        f.write("file %d %s\n" % (i, os.urandom(16).hex()))
                self.git_cmd(repo, "init", "-q")
                self.git_cmd(repo, "add", "-A")
                self.git_cmd(repo, "commit", "-q", "-m", "files")
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
                s.setup_errors["git"] = "git checkout: %s" % e

    def git_cmd(self, repo, *args):
        env = dict(os.environ, GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL="/dev/null")
        return self.timed(["git", "-C", repo, "-c", "user.name=bench", "-c", "user.email=bench@example.com",
                           "-c", "safe.directory=*", *args], env=env)

    # ---- workloads (each a step: one or more rows, run for one system) -------------------------

    def step_seq(self, s):
        a = self.a
        big = os.path.join(s.folder, "big.bin")
        if os.path.exists(big):
            os.unlink(big)
        with open(self.rand, "rb") as f:   # in the page cache (or tmpfs) before dd reads it
            while f.read(8 * MIB):
                pass
        os.sync()
        self.measure(s, "seqwrite", lambda: a.size / self.timed(
            ["dd", "if=" + self.rand, "of=" + big, "bs=1M", "count=%d" % a.size, "conv=fsync", "status=none"]))
        drop_caches()
        read = ["dd", "if=" + big, "of=/dev/null", "bs=1M", "status=none"]
        self.measure(s, "seqread_cold", lambda: a.size / self.timed(read))
        self.measure(s, "seqread_warm", lambda: a.size / self.timed(read))

    def fio_iops(self, s, rw, extra):
        a = self.a
        path = os.path.join(s.folder, "fio.bin")
        r = self.run(["fio", "--name=" + rw, "--filename=" + path, "--rw=" + rw, "--bs=4k", "--size=%dM" % a.fio_size,
                      "--ioengine=psync", "--runtime=%d" % a.fio_runtime, "--time_based", "--output-format=json"] + extra,
                     stdout=subprocess.PIPE)
        out = r.stdout.decode(errors="replace")
        job = json.loads(out[out.index("{"):])["jobs"][0]
        if job.get("error"):
            raise RuntimeError("fio error %d" % job["error"])
        return job["read" if rw == "randread" else "write"]["iops"]

    def step_fio(self, s):
        if not self.fio:
            raise RuntimeError("fio is not installed")
        if "fio" in s.setup_errors:
            raise RuntimeError(s.setup_errors["fio"])
        with open(os.path.join(s.folder, "fio.bin"), "rb") as f:   # warm
            while f.read(8 * MIB):
                pass
        self.measure(s, "randread", lambda: self.fio_iops(s, "randread", ["--invalidate=0"]))
        # fio's write figure counts the final fsync in its runtime.
        self.measure(s, "randwrite", lambda: self.fio_iops(s, "randwrite", ["--end_fsync=1"]))

    def step_meta(self, s):
        d = os.path.join(s.folder, "meta")
        if os.path.exists(d):
            shutil.rmtree(d)
        os.mkdir(d)
        names = [os.path.join(d, "f%06d" % i) for i in range(self.a.files)]

        def create():
            t = time.perf_counter()
            for n in names:
                os.close(os.open(n, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return time.perf_counter() - t

        def stat_all():
            t = time.perf_counter()
            for n in names:
                os.stat(n)
            return time.perf_counter() - t

        def unlink_all():
            t = time.perf_counter()
            for n in names:
                os.unlink(n)
            return time.perf_counter() - t

        self.measure(s, "create", create)
        stat_all()
        self.measure(s, "stat_warm", stat_all)
        drop_caches()
        self.measure(s, "stat_cold", stat_all)
        drop_caches()
        self.measure(s, "ls_cold", lambda: self.timed(["ls", "-l", d]))
        self.measure(s, "unlink", unlink_all)
        os.rmdir(d)

    def step_tree(self, s):
        d = os.path.join(s.folder, "untar")
        if os.path.exists(d):
            shutil.rmtree(d)
        os.mkdir(d)
        os.sync()

        def untar():
            t = time.perf_counter()
            self.run(["tar", "--no-same-owner", "-xf", self.tarball, "-C", d])
            self.run(["sync"])
            return time.perf_counter() - t

        self.measure(s, "untar", untar)
        os.sync()
        self.measure(s, "rmrf", lambda: self.timed(["rm", "-rf", d]))

    def step_git(self, s):
        if not self.git:
            raise RuntimeError("git is not installed")
        if "git" in s.setup_errors:
            raise RuntimeError(s.setup_errors["git"])
        repo = os.path.join(s.folder, "repo")
        self.git_cmd(repo, "status")   # warm-up
        self.measure(s, "git", lambda: self.git_cmd(repo, "status") * 1e3)

    def step_big(self, s):
        big = os.path.join(s.folder, "big.bin")
        if not os.path.exists(big):
            raise RuntimeError("no big.bin (the sequential write failed)")
        n = self.a.appends

        def append():
            t = time.perf_counter()
            for _ in range(n):   # what `echo line >> big.bin` does: its own open and close each time
                fd = os.open(big, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(fd, b"line\n")
                os.close(fd)
            return (time.perf_counter() - t) / n * 1e3

        def pwrite():
            fd = os.open(big, os.O_WRONLY)
            try:
                t = time.perf_counter()
                for off, block in zip(self.offsets, self.blocks):
                    os.pwrite(fd, block, off)
                    os.fsync(fd)
                return (time.perf_counter() - t) / n * 1e3
            finally:
                os.close(fd)

        self.measure(s, "append", append)
        self.measure(s, "pwrite", pwrite)

    # ---- the run ---------------------------------------------------------------------------------

    def main(self):
        a = self.a
        os.makedirs(self.work, exist_ok=True)
        log("peers: setting up %s" % ", ".join(a.systems))
        for name in a.systems:
            self.add_system(name)
        if "native" not in [s.name for s in self.systems] or self.systems[0].error:
            raise SystemExit("peers: the native system is needed (ratios are to native)")
        self.make_fixtures()
        steps = [
            ("seq", self.step_seq, [("seqwrite", "seq write %d MiB (dd conv=fsync)" % a.size, "MiB/s", "rate"),
                                    ("seqread_cold", "seq read cold", "MiB/s", "rate"),
                                    ("seqread_warm", "seq read warm", "MiB/s", "rate")]),
            ("fio", self.step_fio, [("randread", "fio 4k randread warm (%d MiB, %d s)" % (a.fio_size, a.fio_runtime), "IOPS", "rate"),
                                    ("randwrite", "fio 4k randwrite + end fsync", "IOPS", "rate")]),
            ("meta", self.step_meta, [("create", "create %d empty files" % a.files, "s", "time"),
                                      ("stat_warm", "stat %d files warm" % a.files, "s", "time"),
                                      ("stat_cold", "stat %d files cold" % a.files, "s", "time"),
                                      ("ls_cold", "ls -l %d files cold" % a.files, "s", "time"),
                                      ("unlink", "unlink %d files" % a.files, "s", "time")]),
            ("tree", self.step_tree, [("untar", "untar %d entries + sync" % self.tar_count, "s", "time"),
                                      ("rmrf", "rm -rf %d entries" % self.tar_count, "s", "time")]),
            ("git", self.step_git, [("git", "git status, %d files, warm" % a.git_files, "ms", "time")]),
            ("big", self.step_big, [("append", "append a line to big file (each)", "ms", "time"),
                                    ("pwrite", "4k pwrite + fsync in big file (each)", "ms", "time")]),
        ]
        for _, _, rows in steps:
            for r in rows:
                self.row(*r)
        live = [s for s in self.systems if not s.error]
        for s in live:
            t = time.perf_counter()
            self.setup_system(s)
            log("peers: set up %s in %.1f s%s" % (s.name, time.perf_counter() - t,
                "".join("; " + e for e in s.setup_errors.values())))
        for r in range(a.rounds):
            order = live[r % len(live):] + live[:r % len(live)]
            if r % 2:
                order.reverse()
            log("peers: round %d/%d: %s" % (r + 1, a.rounds, ", ".join(s.name for s in order)))
            for step, fn, rows in steps:
                for s in order:
                    if s.dead:
                        continue
                    t = time.perf_counter()
                    try:
                        fn(s)
                    except Interrupted:
                        raise
                    except Exception as e:   # noqa: BLE001 (reported in the table, the run goes on)
                        msg = "%s: %s" % (type(e).__name__, e)
                        for key, *_ in rows:
                            v = self.values[key][s.name]
                            if len(v) <= r:
                                v.append(None)
                            self.errors.setdefault((key, s.name), msg)
                        if s.mnt and not mounted(s.mnt) or s.proc is not None and s.proc.poll() is not None:
                            s.dead = True
                            s.error = "died during %s: %s" % (step, msg)
                        log("peers: round %d %s %s: %s" % (r + 1, step, s.name, msg))
                        continue
                    log("peers: round %d %-4s %-14s %6.1f s" % (r + 1, step, s.name, time.perf_counter() - t))

    # ---- output ----------------------------------------------------------------------------------

    def summary(self):
        """row key -> system -> (median, ratio, lo, hi) or an error string."""
        out = {}
        for key, _, _, kind in self.rows:
            nat = self.values[key].get("native", [])
            out[key] = {}
            for s in self.systems:
                xs = self.values[key][s.name]
                good = [x for x in xs if x]
                if s.error and not good:
                    out[key][s.name] = "not mounted" if not s.dead else "died"
                    continue
                if not good:
                    out[key][s.name] = "error" if (key, s.name) in self.errors else "-"
                    continue
                med = statistics.median(good)
                natgood = [x for x in nat if x]
                if not natgood:
                    out[key][s.name] = (med, None, None, None)
                    continue
                nmed = statistics.median(natgood)
                per = [(x / n if kind == "rate" else n / x) for x, n in zip(xs, nat) if x and n]
                ratio = med / nmed if kind == "rate" else nmed / med
                out[key][s.name] = (med, ratio, min(per) if per else None, max(per) if per else None)
        return out

    def report(self, started):
        a = self.a
        summ = self.summary()
        names = [s.name for s in self.systems]
        others = [n for n in names if n != "native"]
        hdr = ["workload", "native"] + others + ["ubqfs cpu s", "rss MiB", "peak MiB"]
        lines = []
        for key, label, unit, kind in self.rows:
            nat = summ[key]["native"]
            cells = [label, (fmt(nat[0]) + " " + unit) if isinstance(nat, tuple) else nat]
            for n in others:
                v = summ[key][n]
                if isinstance(v, str):
                    cells.append(v)
                elif v[1] is None:
                    cells.append(fmt(v[0]))
                else:
                    cells.append("%s %sx [%s-%s]" % (fmt(v[0]), fmt(v[1]), fmt(v[2]), fmt(v[3])))
            cpu = self.cpu.get(key)
            rss = self.rss.get(key)
            cells += [fmt(statistics.median(cpu)) if cpu else "-",
                      "%.0f" % (rss[0] / 1024) if rss else "-", "%.0f" % (rss[1] / 1024) if rss else "-"]
            lines.append(cells)
        widths = [max(len(r[i]) for r in lines + [hdr]) for i in range(len(hdr))]
        print()
        print("peers: %d round(s), interleaved; each system: median, ratio to native [lowest-highest round ratio];" % a.rounds)
        print("       ratio above 1 is better than native (system/native for rates, native/system for times)")
        print("  ".join(h.ljust(w) for h, w in zip(hdr, widths)))
        print("  ".join("-" * w for w in widths))
        for cells in lines:
            print("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        print()
        for s in self.systems:
            if s.error:
                print("%s: %s" % (s.name, s.error))
        for (key, name), msg in sorted(self.errors.items()):
            sysobj = next(s for s in self.systems if s.name == name)
            if not sysobj.dead:
                print("%s on %s: %s" % (key, name, msg))
        print("passthrough_hp: not run (libfuse's C++ example is not shipped by Debian's libfuse3-dev, "
              "and its source cannot be fetched here)")
        for n in self.notes:
            print(n)
        self.write_files(summ, others)
        print("peers: run took %.0f s; results in %s" % (time.perf_counter() - started, a.out))

    def write_files(self, summ, others):
        a = self.a
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "peers.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["workload", "label", "unit", "kind", "system", "median", "ratio", "ratio_min", "ratio_max",
                        "rounds", "error", "daemon_cpu_s", "daemon_rss_mib", "daemon_peak_rss_mib"])
            for key, label, unit, kind in self.rows:
                for s in self.systems:
                    v = summ[key][s.name]
                    med, ratio, lo, hi = v if isinstance(v, tuple) else (None, None, None, None)
                    err = v if isinstance(v, str) else ""
                    err = self.errors.get((key, s.name), s.error or err) if err else ""
                    extra = ["", "", ""]
                    if s.name == "ubiquityfs" and key in self.cpu:
                        extra = ["%.3f" % statistics.median(self.cpu[key]), "%.1f" % (self.rss[key][0] / 1024),
                                 "%.1f" % (self.rss[key][1] / 1024)]
                    w.writerow([key, label, unit, kind, s.name] +
                               ["" if x is None else "%.6g" % x for x in (med, ratio, lo, hi)] +
                               [";".join("" if x is None else "%.6g" % x for x in self.values[key][s.name]), err] + extra)
        dat = os.path.join(a.out, "ratios.dat")
        with open(dat, "w") as f:
            f.write("\t".join(["workload"] + others) + "\n")
            for key, label, unit, kind in self.rows:
                cells = [key]
                for n in others:
                    v = summ[key][n]
                    cells.append("%.6g" % v[1] if isinstance(v, tuple) and v[1] else "?")
                f.write("\t".join(cells) + "\n")
        if not shutil.which("gnuplot"):
            print("peers: gnuplot is not installed: no chart")
            return
        png = os.path.join(a.out, "peers.png")
        ratios = [v[1] for key in summ for n, v in summ[key].items() if n != "native" and isinstance(v, tuple) and v[1]]
        floor = 10 ** math.floor(math.log10(min(ratios + [0.1]))) / 2   # every bar shows, however slow
        script = """
set terminal {term} size 1600,800 noenhanced
set output '{png}'
set datafile separator '\\t'
set datafile missing '?'
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set logscale y
set yrange [{floor}:*]
set grid ytics
set key outside right top
set xtics rotate by -35 scale 0
set ylabel 'ratio to native (log scale; above 1 = faster than native)'
set title 'UbiquityFS and FUSE peers against the native folder: median of {rounds} round(s)'
set arrow from graph 0, first 1 to graph 1, first 1 nohead dt 2 lw 2 lc rgb 'black' front
plot for [i=2:{ncol}] '{dat}' using i:xtic(1) title columnheader(i)
"""
        for term in ("pngcairo", "png"):
            r = subprocess.run(["gnuplot"], input=script.format(term=term, png=png, dat=dat, rounds=a.rounds, floor=floor,
                                                                ncol=len(others) + 1),
                               text=True, capture_output=True)
            if r.returncode == 0 and os.path.exists(png) and os.path.getsize(png) > 0:
                return
        print("peers: gnuplot failed: %s" % r.stderr.strip().splitlines()[-1:] )

    def cleanup(self):
        self.stop_peers()
        for s in self.systems:
            if s.name in ("native",) + OURS and os.path.isdir(s.folder):
                shutil.rmtree(s.folder, ignore_errors=True)
        if self.shm:
            shutil.rmtree(self.shm, ignore_errors=True)
        if not any(s.mnt and mounted(s.mnt) for s in self.systems):
            shutil.rmtree(self.work, ignore_errors=True)
        if self.a.out_made and os.path.isdir(self.a.out) and not os.listdir(self.a.out):
            os.rmdir(self.a.out)   # interrupted before any result


def main():
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    ap.add_argument("--native", required=True, help="the native folder (on the disk of the store)")
    ap.add_argument("--mount", help="the UbiquityFS container folder to work in (MNT/SugoiApp)")
    ap.add_argument("--pid", type=int, help="the UbiquityFS daemon's PID (for its CPU and RSS)")
    ap.add_argument("--mount-dev", help="a second UbiquityFS container folder, its daemon on /dev/fuse only (adds ubiquityfs_dev)")
    ap.add_argument("--work", help="where the peers' folders go (default: beside --native)")
    ap.add_argument("--out", help="where peers.csv and peers.png go (default: a new /tmp/ubiquityfs-peers-* folder, kept)")
    ap.add_argument("--systems", default=",".join(ALL_SYSTEMS), help="comma-separated subset of " + ",".join(ALL_SYSTEMS))
    ap.add_argument("--quick", action="store_true", help="tiny sizes and one round: proves the script works")
    ap.add_argument("--size", type=int, help="MiB of the sequential write and the big file (1024; quick 16)")
    ap.add_argument("--files", type=int, help="empty files created, stat'ed, listed, unlinked (10000; quick 500)")
    ap.add_argument("--git-files", type=int, help="files in the git checkout (10000; quick 500)")
    ap.add_argument("--tar-entries", type=int, help="entries of the tarball (2000; quick 200)")
    ap.add_argument("--rounds", type=int, help="rounds (3; quick 1)")
    ap.add_argument("--fio-size", type=int, help="MiB of fio's file (256; quick 16)")
    ap.add_argument("--fio-runtime", type=int, help="seconds of each fio run (10; quick 2)")
    ap.add_argument("--appends", type=int, help="appends, and pwrite+fsync, averaged over (50; quick 20)")
    # Options of other suites pass through (scripts/bench takes them all).
    a, _ = ap.parse_known_args()
    for k, v in (QUICK if a.quick else FULL).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    if a.mount_dev and "ubiquityfs" in a.systems and "ubiquityfs_dev" not in a.systems:
        a.systems.insert(a.systems.index("ubiquityfs") + 1, "ubiquityfs_dev")
    unknown = [s for s in a.systems if s not in ALL_SYSTEMS + ["ubiquityfs_dev"]]
    if unknown:
        ap.error("unknown system(s): %s" % ", ".join(unknown))
    if "native" in a.systems:
        a.systems.remove("native")
    a.systems.insert(0, "native")
    a.native = os.path.abspath(a.native)
    a.work = os.path.abspath(a.work or os.path.dirname(a.native))
    a.out_made = not a.out
    a.out = os.path.abspath(a.out) if a.out else tempfile.mkdtemp(prefix="ubiquityfs-peers-", dir="/tmp")
    if os.geteuid() != 0:
        ap.error("run as root: the cold figures drop the page cache")

    def on_signal(signum, _frame):
        raise Interrupted(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    started = time.perf_counter()
    b = Bench(a)
    code = 0
    try:
        b.main()
        b.report(started)
        # Figures are never asserted, but the script must work: a workload that failed on the
        # native folder or on UbiquityFS (or UbiquityFS not mounted) fails the run. Peers may fail.
        broken = sorted("%s on %s" % (key, name) for (key, name) in b.errors if name in ("native", "ubiquityfs"))
        broken += ["%s: %s" % (s.name, s.error) for s in b.systems if s.name in ("native", "ubiquityfs") and s.error]
        if broken:
            log("peers: failed on the native folder or UbiquityFS: " + "; ".join(broken))
            code = 1
    except Interrupted as e:
        log("peers: interrupted by signal %d: cleaning up" % e.signum)
        code = 128 + e.signum
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        b.cleanup()
    sys.exit(code)


if __name__ == "__main__":
    main()
