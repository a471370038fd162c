#!/usr/bin/env python3
"""A workload to kill a filesystem under, and the check of what it left.

  crashload.py run DIR LOG SEED [WORKERS]   work in DIR until killed (or until LOG.stop
                                            exists), logging to LOG
  crashload.py check DIR LOG                exit 1 (one line per problem) unless DIR holds
                                            what the log says it must

Each worker owns its own files in DIR and does, at random: writes that end with fsync, writes
that end with close, appends, truncates, atomic saves (a temporary file renamed over the
file), renames, deletes and extended attributes. Before each operation it logs what it is
about to do and the state it leaves, and after it that it is done; the log (outside the
filesystem under test) is fsync'ed at each line. An operation that fails for any reason but
the filesystem going away is logged, and fails the check. After a kill, every file must hold exactly what its last finished
operation left (a file closed or fsync'ed keeps its last content, whole), except the files of
the operation each worker had begun: those hold what was there before it, or after it (or,
for a write that opens with O_TRUNC, nothing yet). A conflict copy that recovery made beside
a file must hold content the workload once gave that file, whole.
"""
import hashlib
import json
import os
import random
import sys
import errno
import threading

ATTR = "user.crash"
# What a call on a mount whose daemon was killed fails with.
GONE = (errno.ENOTCONN, errno.ECONNABORTED)


def digest(data):
    return hashlib.sha256(data).hexdigest()[:16]


class Log:
    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.lock = threading.Lock()

    def write(self, record):
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self.lock:
            os.write(self.fd, line)
            os.fsync(self.fd)


def worker(root, log, seed, w, stop):
    try:
        work(root, log, seed, w, stop)
    except OSError as e:
        if e.errno not in GONE:
            log.write({"w": w, "error": "%s: %s" % (errno.errorcode.get(e.errno, e.errno), e)})
    except Exception as e:   # a bug of this script: said, not swallowed
        log.write({"w": w, "error": repr(e)})


def work(root, log, seed, w, stop):
    rng = random.Random(seed * 1000 + w)
    names = ["w%d-f%d" % (w, i) for i in range(4)]
    # What each name holds: None (absent) or [content digest, attribute value or None].
    state = {n: None for n in names}
    contents = {}
    op = 0

    def path(n):
        return os.path.join(root, n)

    def write_file(n, data, sync):
        fd = os.open(path(n), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    while not os.path.exists(stop):
        op += 1
        n = rng.choice(names)
        present = state[n] is not None
        kind = rng.choice(["fsync", "close", "append", "truncate", "save", "rename", "delete", "xattr"]
                          if present else ["fsync", "close", "save"])
        after = dict(state)
        size = rng.choice([0, 10, 4096, 70_000, 1_100_000])
        data = rng.randbytes(size)
        attr = state[n][1] if present else None
        if kind in ("fsync", "close", "save"):
            new = data
            after[n] = [digest(new), None if kind == "save" else attr]
        elif kind == "append":
            new = contents[n] + data[:5000]
            after[n] = [digest(new), attr]
        elif kind == "truncate":
            cut = rng.choice([0, 1, 4095, 1 << 20, 1_500_000])
            old = contents[n]
            new = old[:cut] + bytes(max(0, cut - len(old)))
            after[n] = [digest(new), attr]
        elif kind == "rename":
            other = rng.choice([m for m in names if m != n])
            after[other] = state[n]
            after[n] = None
        elif kind == "delete":
            after[n] = None
        elif kind == "xattr":
            value = "v%d" % op
            after[n] = [state[n][0], value]
        touched = [m for m in names if after[m] != state[m]] or [n]
        log.write({"w": w, "op": op, "begin": kind, "name": n,
                   "before": {m: state[m] for m in touched}, "after": {m: after[m] for m in touched}})
        if kind in ("fsync", "close"):
            write_file(n, new, kind == "fsync")
        elif kind == "append":
            fd = os.open(path(n), os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, data[:5000])
            finally:
                os.close(fd)
        elif kind == "truncate":
            fd = os.open(path(n), os.O_WRONLY)
            try:
                os.ftruncate(fd, cut)
            finally:
                os.close(fd)
        elif kind == "save":
            temp = "%s.tmp%d" % (n, op)
            write_file(temp, new, True)
            os.rename(path(temp), path(n))
        elif kind == "rename":
            os.rename(path(n), path(other))
            contents[other] = contents.pop(n)
        elif kind == "delete":
            os.unlink(path(n))
            contents.pop(n, None)
        elif kind == "xattr":
            os.setxattr(path(n), ATTR, value.encode())
        if kind in ("fsync", "close", "append", "truncate", "save"):
            contents[n] = new
        state = after
        log.write({"w": w, "op": op, "end": kind})


def run(root, log_path, seed, workers):
    log = Log(log_path)
    stop = log_path + ".stop"
    threads = [threading.Thread(target=worker, args=(root, log, seed, w, stop), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def observed(root, name):
    p = os.path.join(root, name)
    try:
        with open(p, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        attr = os.getxattr(p, ATTR).decode()
    except OSError:
        attr = None
    return [digest(data), attr]


def check(root, log_path):
    finished = {}   # name -> state its last finished operation left
    begun = {}      # worker -> its last begun record
    errors = []
    done = 0
    ever = {}       # name -> every content digest an operation gave it

    with open(log_path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break   # a line the kill cut short
            r = json.loads(raw)
            if "error" in r:
                errors.append("worker %d stopped: %s" % (r["w"], r["error"]))
            elif "begin" in r:
                begun[r["w"]] = r
                for name, state in r["after"].items():
                    if state:
                        ever.setdefault(name, set()).add(state[0])
            elif begun.get(r["w"], {}).get("op") == r["op"]:
                finished.update(begun.pop(r["w"])["after"])
                done += 1
    open_ops = list(begun.values())
    loose = {m for r in open_ops for m in r["after"]}
    problems = list(errors)
    for name, want in sorted(finished.items()):
        if name in loose:
            continue
        got = observed(root, name)
        if got != want:
            problems.append("%s: holds %s, its last finished operation left %s" % (name, got, want))
    empty = digest(b"")
    for r in open_ops:
        # The names an operation touches are judged together: all as before it, or all as after.
        got = {name: observed(root, name) for name in r["after"]}
        allowed = [r["before"], r["after"]]
        if r["begin"] in ("fsync", "close"):
            # open(O_CREAT | O_TRUNC) empties (or makes) the file before the write comes.
            before = r["before"][r["name"]]
            allowed.append({r["name"]: [empty, before[1] if before else None]})
        if got not in allowed:
            problems.append("%s holds %s while %s was under way; before it %s, after it %s"
                            % (", ".join(sorted(got)), got, r["begin"], r["before"], r["after"]))
    known = set(finished) | loose
    copies = 0
    for entry in sorted(os.listdir(root)):
        if entry in known or ".tmp" in entry:
            continue
        base = entry.split(" (conflict from ")[0]
        if base != entry:
            # A conflict copy recovery made beside a file: it must hold, whole, content the
            # workload once gave that file (never bytes it did not write).
            got = observed(root, entry)
            if got is None or got[0] not in ever.get(base, set()):
                problems.append("%s: a conflict copy holding %s, never %s's content" % (entry, got, base))
            copies += 1
        elif entry.split("-")[0].startswith("w"):
            problems.append("%s: a file no operation left" % entry)
    for line in problems:
        print(line)
    print("checked %d files after %d finished operations%s: %s"
          % (len(known), done, ", and %d conflict copies" % copies if copies else "",
             "%d problems" % len(problems) if problems else "as logged"))
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 4)
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    else:
        sys.stderr.write(__doc__)
        sys.exit(64)
