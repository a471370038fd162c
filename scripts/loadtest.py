#!/usr/bin/env python3
"""Load on one mount or two mounts of one store, and the check that nothing was lost.

  loadtest.py run SECONDS RESULT DIR [DIR2]

8 writers, 8 readers and 4 `ls -l` loops work for SECONDS in DIR (with DIR2, a second mount's
view of the same folder: writers, readers and listings split between the two). Each writer
owns 4 files, made before the clock starts, and saves them at random, in place (open with
O_TRUNC, write, close) or atomically (a temporary file renamed over it), with sizes from 100
bytes to 1.2 MiB. Every saved content carries a header with its length and checksum, so a
reader can tell a whole version from a torn one. A reader must see whole versions of files
saved atomically, and of every file saved through the other mount; a file saved in place
through the reader's own mount may be read mid-save (POSIX: a reader sees each write as it
lands). Any error fails the run, but ENOENT on a temporary file a listing saw go.
At the end every file must hold, through every mount, what its writer saved last (a lost
update fails the run), and no conflict copy may exist (each file has one writer).

Writes RESULT (JSON: operations per kind, problems) and exits 1 on any problem.
"""
import errno
import hashlib
import json
import os
import random
import sys
import threading
import time

WRITERS, READERS, LISTERS, FILES = 8, 8, 4, 4
SIZES = [100, 4096, 65_536, 300_000, 1_200_000]


def content(seq, size, rng):
    payload = rng.randbytes(size)
    header = b"seq=%d len=%d sha=%s\n" % (seq, size, hashlib.sha256(payload).hexdigest()[:16].encode())
    return header + payload


def whole(data):
    """None if `data` is a whole saved content, else what is wrong with it."""
    end = data.find(b"\n")
    if end < 0:
        return "no header (%d bytes)" % len(data)
    try:
        fields = dict(f.split(b"=", 1) for f in data[:end].split(b" "))
        size, sha = int(fields[b"len"]), fields[b"sha"].decode()
    except (ValueError, KeyError):
        return "a damaged header %r" % data[:60]
    payload = data[end + 1:]
    if len(payload) != size or hashlib.sha256(payload).hexdigest()[:16] != sha:
        return "torn: %d of %d bytes, or other bytes" % (len(payload), size)
    return None


class Run:
    def __init__(self, dirs, seconds):
        self.dirs = dirs
        self.deadline = time.monotonic() + seconds
        self.lock = threading.Lock()
        self.problems = []
        self.counts = {}
        self.last = {}       # name -> digest of what its writer saved last
        self.in_place = {}   # name -> in-place saves begun and ended
        self.busy = {}       # name -> an in-place save is under way
        self.ended = {}      # name -> when the last in-place save ended (monotonic)

    def problem(self, text):
        with self.lock:
            if len(self.problems) < 50:
                self.problems.append(text)

    def count(self, kind):
        with self.lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def going(self):
        return time.monotonic() < self.deadline and len(self.problems) < 50


def save(path, data, atomic, tag):
    if atomic:
        temp = "%s.tmp-%s" % (path, tag)
        with open(temp, "wb") as f:
            f.write(data)
        os.rename(temp, path)
    else:
        with open(path, "wb") as f:
            f.write(data)


def writer(run, w):
    rng = random.Random(1000 + w)
    mount = w % len(run.dirs)
    names = ["w%d-f%d" % (w, i) for i in range(FILES)]
    seq = 0
    while run.going():
        name = rng.choice(names)
        seq += 1
        data = content(seq, rng.choice(SIZES), rng)
        atomic = rng.random() < 0.5
        with run.lock:
            if not atomic:
                run.in_place[name] += 1
                run.busy[name] = True
        try:
            save(os.path.join(run.dirs[mount], name), data, atomic, "w%d-%d" % (w, seq))
            with run.lock:
                run.last[name] = hashlib.sha256(data).hexdigest()
            run.count("atomic save" if atomic else "save")
        except OSError as e:
            run.problem("writer %d: saving %s: %s" % (w, name, e))
        finally:
            if not atomic:
                with run.lock:
                    run.in_place[name] += 1
                    run.busy[name] = False
                    run.ended[name] = time.monotonic()


def reader(run, r):
    rng = random.Random(2000 + r)
    mount = r % len(run.dirs)
    names = ["w%d-f%d" % (w, i) for w in range(WRITERS) for i in range(FILES)]

    def in_place_state(name):
        with run.lock:
            return run.in_place[name], run.busy[name], run.ended[name]

    while run.going():
        name = rng.choice(names)
        start = time.monotonic()
        events, busy, ended = in_place_state(name)
        try:
            with open(os.path.join(run.dirs[mount], name), "rb") as f:
                data = f.read()
        except OSError as e:
            run.problem("reader %d: reading %s: %s" % (r, name, e))
            continue
        run.count("read")
        # A file saved in place may be read mid-save: through the writer's own mount each write
        # shows as it lands (POSIX), and through another mount a new version that arrives while
        # a read is under way replaces the pages not read yet. So only reads that no in-place
        # save overlapped (nor ended within a second before, the time a new version may take to
        # arrive) must find a whole version; every read of an atomically saved file must.
        later_events, later_busy, _ = in_place_state(name)
        if busy or later_busy or later_events != events or start - ended < 1.0:
            run.count("read mid-save")
            continue
        run.count("read checked whole")
        wrong = whole(data)
        if wrong:
            run.problem("reader %d on mount %d: %s is %s" % (r, mount, name, wrong))


def lister(run, k):
    mount = k % len(run.dirs)
    while run.going():
        try:
            entries = list(os.scandir(run.dirs[mount]))
        except OSError as e:
            run.problem("ls %d: %s" % (k, e))
            continue
        for entry in entries:
            try:
                entry.stat(follow_symlinks=False)
            except OSError as e:
                if not (e.errno == errno.ENOENT and ".tmp-" in entry.name):
                    run.problem("ls %d: stat %s: %s" % (k, entry.name, e))
        run.count("ls -l")


def main(seconds, result, dirs):
    run = Run(dirs, seconds)
    boot = random.Random(7)
    for w in range(WRITERS):
        for i in range(FILES):
            name = "w%d-f%d" % (w, i)
            data = content(0, 100, boot)
            save(os.path.join(dirs[w % len(dirs)], name), data, False, "")
            run.last[name] = hashlib.sha256(data).hexdigest()
            run.in_place[name], run.busy[name], run.ended[name] = 0, False, time.monotonic()
    # Every mount shows every file before the clock starts.
    limit = time.monotonic() + 20
    for d in dirs:
        while time.monotonic() < limit and len([n for n in os.listdir(d) if n in run.last]) < len(run.last):
            time.sleep(0.05)
    run.deadline = time.monotonic() + seconds
    threads = ([threading.Thread(target=writer, args=(run, w)) for w in range(WRITERS)]
               + [threading.Thread(target=reader, args=(run, r)) for r in range(READERS)]
               + [threading.Thread(target=lister, args=(run, k)) for k in range(LISTERS)])
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    # No lost update: every file, through every mount, holds what its writer saved last (the
    # other mount may take a moment to learn of the last saves).
    for m, d in enumerate(dirs):
        limit = time.monotonic() + 15
        while True:
            wrong = []
            for name, digest in sorted(run.last.items()):
                try:
                    with open(os.path.join(d, name), "rb") as f:
                        got = hashlib.sha256(f.read()).hexdigest()
                except OSError as e:
                    got = str(e)
                if got != digest:
                    wrong.append(name)
            if not wrong or time.monotonic() > limit:
                break
            time.sleep(0.2)
        for name in wrong:
            run.problem("mount %d: %s does not hold what its writer saved last" % (m, name))
        leftovers = [n for n in os.listdir(d) if "conflict" in n or ".tmp-" in n]
        if leftovers:
            run.problem("mount %d: conflict copies or temporary files left: %s" % (m, leftovers[:5]))

    with open(result, "w") as f:
        json.dump({"counts": run.counts, "problems": run.problems}, f)
    for line in run.problems:
        print(line)
    print("%s: %s" % (", ".join("%d %s" % (v, k) for k, v in sorted(run.counts.items())),
                      "%d problems" % len(run.problems) if run.problems else "no problems"))
    return 1 if run.problems else 0


if __name__ == "__main__":
    if len(sys.argv) in (5, 6) and sys.argv[1] == "run":
        sys.exit(main(float(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    sys.stderr.write(__doc__)
    sys.exit(64)
