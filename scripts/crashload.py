#!/usr/bin/env python3
"""A workload to kill a filesystem under, and the check of what it left.

  crashload.py run DIR LOG SEED [WORKERS]   work in DIR until killed (or until LOG.stop
                                            exists), logging to LOG
  crashload.py check DIR LOG [--power]      exit 1 (one line per problem) unless DIR holds
                                            what the log says it must (after a power cut,
                                            with --power)
  crashload.py state DIR                    print what every file in DIR holds

Each worker owns its own files in DIR and does, at random: writes that end with fsync, writes
that end with close, appends, truncates, patches (a few rewrites of a page of the open file,
each followed by an fsync, each logged as an operation of its own), atomic saves (a temporary file renamed
over the file), renames, deletes and extended attributes. Before each operation it logs what it is
about to do and the state it leaves, and after it that it is done; the log (outside the
filesystem under test) is fsync'ed at each line. An operation that fails for any reason but
the filesystem going away is logged, and fails the check. After a kill, every file must hold exactly what its last finished
operation left (a file closed or fsync'ed keeps its last content, whole), except the files of
the operation each worker had begun: those hold what was there before it, or after it (or,
for a write that opens with O_TRUNC, nothing yet). A conflict copy that recovery made beside
a file must hold content the workload once gave that file, whole.

After a power cut (--power) only what was synced is promised, as POSIX promises it: a name
whose last fsync'ed write finished holds that content, or what a later operation on the name
gave it; any other name holds a state it had at some moment (empty included, where a write
that opens with O_TRUNC made it so), its content and attribute each whole, never torn.
"""
import hashlib
import json
import os
import random
import sys
import errno
import threading

ATTR = "user.crash"
# What a call on a mount whose daemon was killed fails with (ECANCELED: a call the kernel had
# put in one of the daemon's io_uring rings).
GONE = (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED)


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

    def patch(n, op):
        """Writes into the open file, an fsync after each: the later ones sync what they wrote
        alone (a working copy's page log). Each rewrites one 4 KiB page (or the file's tail)
        in place: after a power cut before its fsync, the page is as before it or as after it,
        as a disk keeps a page, where a write across pages could be half there."""
        nonlocal state
        if not contents[n]:
            return op
        fd = os.open(path(n), os.O_WRONLY)
        try:
            for _ in range(rng.randint(2, 4)):
                old = contents[n]
                at = rng.randrange(0, len(old)) // 4096 * 4096
                piece = rng.randbytes(min(4096, len(old) - at))
                new = old[:at] + piece + old[at + len(piece):]
                after = dict(state)
                after[n] = [digest(new), state[n][1]]
                log.write({"w": w, "op": op, "begin": "patch", "name": n, "before": {n: state[n]}, "after": {n: after[n]}})
                os.pwrite(fd, piece, at)
                os.fsync(fd)
                contents[n] = new
                state = after
                log.write({"w": w, "op": op, "end": "patch"})
                op += 1
        finally:
            os.close(fd)
        return op

    while not os.path.exists(stop):
        op += 1
        n = rng.choice(names)
        present = state[n] is not None
        kind = rng.choice(["fsync", "close", "append", "truncate", "patch", "save", "rename", "delete", "xattr"]
                          if present else ["fsync", "close", "save"])
        if kind == "patch":
            op = patch(n, op)
            continue
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
    except OSError as e:
        return ["unreadable (%s)" % errno.errorcode.get(e.errno, e.errno), None]
    try:
        attr = os.getxattr(p, ATTR).decode()
    except OSError:
        attr = None
    return [digest(data), attr]


def check(root, log_path, power=False):
    finished = {}   # name -> state its last finished operation left
    begun = {}      # worker -> its last begun record
    errors = []
    done = 0
    ever = {}       # name -> every content digest an operation gave it
    # name -> [(operation kind, state it left, where it came from)], from the round's start; for a
    # rename, where = (source name, the source's floor then or None, the source's history length then)
    history = {}
    floor = {}      # name -> index in history of its last finished fsync'ed write

    with open(log_path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break   # a line the kill cut short
            r = json.loads(raw)
            if "error" in r:
                errors.append("worker %d stopped: %s" % (r["w"], r["error"]))
            elif "begin" in r:
                begun[r["w"]] = r
                # The source as the rename found it (a later fsync of a new file under its name
                # says nothing of the file that moved).
                source = (r["name"], floor.get(r["name"]), len(history.setdefault(r["name"], [(None, None, None)])))
                for name, state in r["after"].items():
                    if state:
                        ever.setdefault(name, set()).add(state[0])
                    h = history.setdefault(name, [(None, None, None)])
                    if name == r["name"]:
                        h.append((r["begin"], state, None))
                    else:
                        h.append(("moved", state, source))
            elif begun.get(r["w"], {}).get("op") == r["op"]:
                r = begun.pop(r["w"])
                finished.update(r["after"])
                if r["begin"] in ("fsync", "patch"):
                    floor[r["name"]] = max(i for i, (kind, _, _) in enumerate(history[r["name"]]) if kind in ("fsync", "patch"))
                done += 1
    open_ops = list(begun.values())
    loose = {m for r in open_ops for m in r["after"]}
    problems = list(errors)
    if power:
        return report(problems + power_problems(root, history, floor), len(history), done, 0)
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
    return report(problems, len(known), done, copies)


def power_problems(root, history, floor):
    """What breaks the promises of a power cut (see the top)."""
    problems = []
    empty = digest(b"")

    known = {}

    def allowed(name, start, end, floored):
        """The contents and attributes `name` may hold: its states in history[start:end] (from its
        last fsync); where a rename brought another name's file, what that file could hold when
        it moved (its states since its own fsync before the rename: a cut may keep the rename and
        lose the file's later content)."""
        if (name, start, end) in known:
            return known[(name, start, end)]
        since = history.get(name, [(None, None, None)])[start:end]
        contents = {state[0] if state else None for _, state, _ in since}
        attrs = {state[1] for _, state, _ in since if state}
        # An O_TRUNC open empties the file before its write; without a synced floor the file's
        # creation (empty) may be all that survived of it.
        if not floored or any(kind in ("fsync", "close", "moved") for kind, _, _ in since[1:]):
            contents.add(empty)
        for kind, _, source in since:
            if kind == "moved":
                source_name, source_floor, source_end = source
                more_contents, more_attrs = allowed(source_name, source_floor or 0, source_end, source_floor is not None)
                contents |= more_contents - {None}
                attrs |= more_attrs
        known[(name, start, end)] = (contents, attrs)
        return contents, attrs

    for name, h in sorted(history.items()):
        contents, attrs = allowed(name, floor.get(name, 0), None, name in floor)
        got = observed(root, name)
        if (got[0] if got else None) not in contents or (got and got[1] not in attrs):
            problems.append("%s: holds %s, not a state it had since its last fsync (%s)"
                            % (name, got, "from the start" if name not in floor else h[floor[name]][1]))
    names = set(history)
    for entry in sorted(os.listdir(root)):
        if entry in names or ".tmp" in entry:
            continue
        base = entry.split(" (conflict from ")[0]
        got = observed(root, entry)
        if base == entry or got is None or got[0] not in {s[0] for _, s, _ in history.get(base, []) if s}:
            problems.append("%s: holds %s, no state the workload gave a file" % (entry, got))
    return problems


def report(problems, files, done, copies):
    for line in problems:
        print(line)
    print("checked %d files after %d finished operations%s: %s"
          % (files, done, ", and %d conflict copies" % copies if copies else "",
             "%d problems" % len(problems) if problems else "as logged"))
    return 1 if problems else 0


def state(root):
    """Every file in root and what it holds, a line each."""
    for entry in sorted(os.listdir(root)):
        print(entry, json.dumps(observed(root, entry)))


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else 4)
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "check" and sys.argv[4:] in ([], ["--power"]):
        sys.exit(check(sys.argv[2], sys.argv[3], power=sys.argv[4:] == ["--power"]))
    elif len(sys.argv) == 3 and sys.argv[1] == "state":
        state(sys.argv[2])
    else:
        sys.stderr.write(__doc__)
        sys.exit(64)
