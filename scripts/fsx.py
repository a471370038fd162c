#!/usr/bin/env python3
"""A random I/O checker: random operations on one file, each checked against an in-memory
model of what the file must hold.

  fsx.py FILE OPS SEED [--other FILE2] [--drop-every N]

Operations: writes at random offsets (some across 1 MiB chunk boundaries, some past the
end), reads, truncates (shrinking and growing), reads and writes through a shared mapping,
close and reopen, reads through a second descriptor, fsync, and (every N operations)
dropping the kernel's page cache. With --other (the same file through a second mount of the
same store), the file is closed now and then and read whole through the other mount, which
must show the same content soon after. Exits 1 at the first difference, printing the
operations that led to it.
"""
import mmap
import os
import random
import sys
import time

# Over three chunks of 1 MiB, ending inside the fourth: writes and truncates cross chunk edges.
MAX_SIZE = 3 << 20 | 12345


def fail(history, message):
    for line in history[-25:]:
        print("  " + line)
    print("FAILED: " + message)
    sys.exit(1)


def first_difference(a, b):
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return min(len(a), len(b))


def main():
    args = sys.argv[1:]
    if len(args) < 3:
        sys.stderr.write(__doc__)
        sys.exit(64)
    path, ops, seed = args[0], int(args[1]), int(args[2])
    other = args[args.index("--other") + 1] if "--other" in args else None
    drop_every = int(args[args.index("--drop-every") + 1]) if "--drop-every" in args else 0
    rng = random.Random(seed)
    model = bytearray()
    history = []
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def check(got, off, n, what):
        want = bytes(model[off:off + n])
        if got != want:
            at = first_difference(got, want)
            fail(history, "%s at %d: %d bytes differ from byte %d (got %d bytes, model %d)"
                 % (what, off, len(got), off + at, len(got), len(want)))

    for step in range(1, ops + 1):
        r = rng.random()
        size = len(model)
        if r < 0.33:
            # Mostly small writes; some large ones, some across a chunk boundary.
            n = rng.choice([1, 7, 512, 4096, 9000, 65536]) if rng.random() < 0.9 else rng.randint(100_000, 300_000)
            off = rng.choice([rng.randint(0, MAX_SIZE - n), (rng.randint(1, 3) << 20) - rng.randint(0, n)])
            off = max(0, min(off, MAX_SIZE - n))
            data = rng.randbytes(n)
            history.append("%d write %d+%d" % (step, off, n))
            if os.pwrite(fd, data, off) != n:
                fail(history, "short write")
            if off > len(model):
                model.extend(bytes(off - len(model)))
            model[off:off + n] = data
        elif r < 0.68:
            off = rng.randint(0, size + 1000)
            n = rng.choice([1, 100, 4096, 70_000, 1 << 20])
            history.append("%d read %d+%d" % (step, off, n))
            check(os.pread(fd, n, off), off, n, "read")
        elif r < 0.76:
            new = rng.choice([0, rng.randint(0, MAX_SIZE), size // 2, size + rng.randint(1, 100_000), 1 << 20])
            new = min(new, MAX_SIZE)
            history.append("%d truncate %d" % (step, new))
            os.ftruncate(fd, new)
            if new < len(model):
                del model[new:]
            else:
                model.extend(bytes(new - len(model)))
        elif r < 0.86 and size > 0:
            off = rng.randint(0, size - 1)
            n = min(rng.choice([1, 4096, 100_000]), size - off)
            with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
                if rng.random() < 0.5:
                    history.append("%d mapread %d+%d" % (step, off, n))
                    check(bytes(m[off:off + n]), off, n, "mapped read")
                else:
                    data = rng.randbytes(n)
                    history.append("%d mapwrite %d+%d" % (step, off, n))
                    m[off:off + n] = data
                    model[off:off + n] = data
                    m.flush()
        elif r < 0.91:
            off = rng.randint(0, max(0, size - 1))
            history.append("%d second-handle read %d" % (step, off))
            second = os.open(path, os.O_RDONLY)
            try:
                check(os.pread(second, 65536, off), off, 65536, "read through a second descriptor")
            finally:
                os.close(second)
        elif r < 0.912:
            history.append("%d reopen" % step)
            os.close(fd)
            fd = os.open(path, os.O_RDWR)
        elif r < 0.914:
            history.append("%d fsync" % step)
            os.fsync(fd)
        elif other and r < 0.9155:
            history.append("%d close, read through the other mount" % step)
            os.close(fd)
            want = bytes(model)
            deadline = time.monotonic() + 5
            while True:
                try:
                    with open(other, "rb") as f:
                        got = f.read()
                except FileNotFoundError:   # the other mount has not heard of it yet
                    got = None
                if got == want or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if got is None:
                fail(history, "the other mount does not show the file")
            if got != want:
                fail(history, "the other mount shows %d bytes, the model %d (first difference at %d)"
                     % (len(got), len(want), first_difference(got, want)))
            fd = os.open(path, os.O_RDWR)
        else:
            history.append("%d stat" % step)
            st = os.fstat(fd)
            if st.st_size != len(model):
                fail(history, "size %d, the model %d" % (st.st_size, len(model)))
        if drop_every and step % drop_every == 0:
            # Closed first, so that the kernel may forget the file, and asks for it again.
            history.append("%d close, drop caches, reopen" % step)
            os.close(fd)
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
            fd = os.open(path, os.O_RDWR)
        if len(history) > 1000:
            del history[:500]
    os.close(fd)
    with open(path, "rb") as f:
        history.append("end: read whole")
        check(f.read(), 0, MAX_SIZE + 1, "the whole file after the last close")
    print("%d operations on %s: the file matches the model (%d bytes)" % (ops, path, len(model)))


if __name__ == "__main__":
    main()
