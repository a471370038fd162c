#!/usr/bin/env python3
"""Power cuts of a folder's files, from the undo log of scripts/powercut.c.

  powercut.py build OUT.so               compile the recording library
  powercut.py restore ROOT LOG SEED      take every file under ROOT back to what a disk may hold
                                         after the power failed when the log ended

Run the process under test with LD_PRELOAD=OUT.so, POWERCUT_ROOT=ROOT, POWERCUT_LOG=LOG (and
POWERCUT_BOOT_ID=FILE to give it a boot id of the test's); kill it with SIGKILL; then restore.

What a restore does, file by file: the writes a sync covered stay. Of the writes after the last
sync, the file keeps a random prefix in their order (none, half of the time), and the first write
it loses may be torn: each 4 KiB page of it keeps its new bytes or gets its old ones back, at
random, and the file's size is its old or its new one. Files are cut independently of each other,
so a write to one file can survive while an earlier write to another is lost, as a disk's cache
may reorder them. The seed makes a cut repeat.

Not modelled: directory entries (a file's creation, rename and unlink are durable at once, and a
file created and never synced is there, holding what survived of its writes), reordering within
one file, writes through mmap, and processes the library was not preloaded into.
"""
import os
import random
import shutil
import struct
import subprocess
import sys

HEADER = struct.Struct("<IIQQqqQ")
UNDO, SYNC_FILE, SYNC_ALL, BORN, UNDO_SIZE = 1, 2, 3, 4, 5
PAGE = 4096


def build(out):
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "powercut.c")
    compiler = shutil.which("cc") or shutil.which("clang") or "gcc"
    subprocess.run([compiler, "-O2", "-Wall", "-shared", "-fPIC", "-o", out, source, "-ldl", "-lpthread"], check=True)


def read_log(path):
    """The log's records: (position, kind, dev, ino, offset, old_size, old_bytes)."""
    records = []
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at + HEADER.size <= len(data):
        kind, _, dev, ino, offset, old_size, length = HEADER.unpack_from(data, at)
        end = at + HEADER.size + length
        if kind not in (UNDO, SYNC_FILE, SYNC_ALL, BORN, UNDO_SIZE):
            raise SystemExit("powercut: %s: a damaged record at %d" % (path, at))
        if end > len(data):
            # The last record, cut short: SIGKILL can end a large write(2) part way. A record
            # comes before the change it undoes, so that change never began.
            break
        records.append((at, kind, dev, ino, offset, old_size, data[at + HEADER.size:end]))
        at = end
    # Fewer bytes than a record's header at the end: a header cut short, the same way.
    return records


def files_under(root):
    """(dev, ino) -> a path, for every regular file under root."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            if (st.st_mode & 0o170000) == 0o100000:
                found.setdefault((st.st_dev, st.st_ino), p)
    return found


def kind_of(root, path):
    """What a store file is, for the summary: chunks, wal, database, work, log or other."""
    relative = os.path.relpath(path, root)
    if relative.startswith("blobs/"):
        return "chunks"
    if relative.startswith("work/"):
        return "work"
    if relative.endswith("-wal"):
        return "wal"
    if relative.endswith(".sqlite3"):
        return "database"
    if relative.endswith(".log"):
        return "log"
    return "other"


def undo(fd, record, pages=None):
    """Writes back what `record` replaced (only where it meets the 4 KiB file pages in `pages`,
    if given)."""
    _, _, _, _, offset, old_size, old = record
    at = 0
    while at < len(old):
        page = (offset + at) // PAGE
        end = min(len(old), (page + 1) * PAGE - offset)
        if pages is None or page in pages:
            os.pwrite(fd, old[at:end], offset + at)
        at = end


def restore(root, log_path, seed):
    rng = random.Random(seed)
    records = read_log(log_path)
    synced_all = max([r[4] for r in records if r[1] == SYNC_ALL], default=-1)
    synced = {}
    born = {}
    for r in records:
        key = (r[2], r[3])
        if r[1] == SYNC_FILE:
            synced[key] = max(synced.get(key, -1), r[4])
        elif r[1] == BORN:
            born[key] = r[0]
    pending = {}
    for r in records:
        key = (r[2], r[3])
        if r[1] not in (UNDO, UNDO_SIZE) or r[0] < born.get(key, -1):
            continue   # not a write, or a write to an earlier file of that inode number
        if r[0] < max(synced_all, synced.get(key, -1)):
            continue   # a sync after it made it durable
        pending.setdefault(key, []).append(r)
    paths = files_under(root)
    lost = torn = kept = 0
    kinds = {}
    for key in sorted(pending):
        writes = pending[key]
        path = paths.get(key)
        if path is None:
            continue   # unlinked since: nothing of it is left to cut
        keep = 0 if rng.random() < 0.5 else rng.randint(0, len(writes))
        kept += keep
        if keep == len(writes):
            continue
        fd = os.open(path, os.O_WRONLY)
        try:
            for r in reversed(writes[keep + 1:]):
                undo(fd, r)
                os.ftruncate(fd, r[5])
            first = writes[keep]
            if first[1] != UNDO or not first[6] or rng.random() < 0.5:
                # Whole: a truncate is not torn, nor a write that replaced nothing but the size.
                undo(fd, first)
                os.ftruncate(fd, first[5])
            else:
                start = first[4] // PAGE
                pages = range(start, (first[4] + len(first[6]) - 1) // PAGE + 1)
                undo(fd, first, {p for p in pages if rng.random() < 0.5})
                if rng.random() < 0.5:
                    os.ftruncate(fd, first[5])
                torn += 1
        finally:
            os.close(fd)
        lost += len(writes) - keep
        kinds[kind_of(root, path)] = kinds.get(kind_of(root, path), 0) + len(writes) - keep
    print("powercut: %d records; %d files had unsynced writes: %d writes kept, %d lost (%d torn); lost by kind: %s"
          % (len(records), len(pending), kept, lost, torn,
             ", ".join("%s %d" % kv for kv in sorted(kinds.items())) or "none"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "restore":
        restore(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.stderr.write(__doc__)
        sys.exit(64)
