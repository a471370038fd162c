#!/usr/bin/env python3
"""POSIX checks, run as root in a folder of any filesystem, printing one line per check.

  posixcheck.py DIR

Each line is `CHECK: RESULT`, where RESULT is `ok`, an errno name, or what a check saw (which
of atime, mtime and ctime an operation changed, a mode, a group). Run it in a folder on ext4
and in a folder of the mount, and compare: the lines must be the same but where the mount
differs on purpose. Calls as another user (nobody, 65534) run in a child process that drops to
that user. DIR must be empty, and other users must be able to reach it.
"""
import ctypes
import errno
import os
import stat
import sys
import time

NOBODY = 65534
libc = ctypes.CDLL(None, use_errno=True)


def name(e):
    return errno.errorcode.get(e, str(e))


def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return name(e.errno)


def as_nobody(fn, gid=NOBODY, groups=()):
    """Runs fn in a child as uid nobody; its result (ok or the errno name)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgroups(list(groups))
            os.setresgid(gid, gid, gid)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            out = attempt(fn)
        except Exception as e:  # a bug of this script, said as such
            out = "error " + repr(e)
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 1000).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return out


def renameat2(a, b, flags):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def write(path, data=b"x", mode=0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    os.write(fd, data)
    os.close(fd)


def times(path):
    st = os.lstat(path)
    return (st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns)


def changed(before, after):
    return "".join(c if b != a else "-" for c, b, a in zip("amc", before, after))


def main(d):
    out = []

    def check(label, result):
        out.append("%s: %s" % (label, result))

    p = lambda *parts: os.path.join(d, *parts)
    os.chmod(d, 0o755)
    write(p("f"))
    os.mkdir(p("dir"))
    write(p("dir", "inner"))
    os.mkdir(p("empty"))
    os.symlink("loop", p("loop"))
    os.symlink("f", p("link-to-f"))

    # Errors as root.
    check("open a missing file", attempt(lambda: os.open(p("missing"), os.O_RDONLY)))
    check("O_CREAT|O_EXCL of an existing file", attempt(lambda: os.open(p("f"), os.O_WRONLY | os.O_CREAT | os.O_EXCL)))
    check("open a folder to write", attempt(lambda: os.open(p("dir"), os.O_WRONLY)))
    check("a path through a file", attempt(lambda: os.open(p("f", "x"), os.O_RDONLY)))
    check("a symlink loop", attempt(lambda: os.open(p("loop"), os.O_RDONLY)))
    check("O_NOFOLLOW on a symlink", attempt(lambda: os.open(p("link-to-f"), os.O_RDONLY | os.O_NOFOLLOW)))
    check("O_DIRECTORY on a file", attempt(lambda: os.open(p("f"), os.O_RDONLY | os.O_DIRECTORY)))
    check("a 256-byte name", attempt(lambda: os.open(p("n" * 256), os.O_WRONLY | os.O_CREAT)))
    check("a 255-byte name", attempt(lambda: os.close(os.open(p("n" * 255), os.O_WRONLY | os.O_CREAT))))
    check("mkdir of an existing name", attempt(lambda: os.mkdir(p("f"))))
    check("rmdir of a folder with a file", attempt(lambda: os.rmdir(p("dir"))))
    check("rmdir of a file", attempt(lambda: os.rmdir(p("f"))))
    check("unlink of a folder", attempt(lambda: os.unlink(p("dir"))))
    check("rename a folder into itself", attempt(lambda: os.rename(p("dir"), p("dir", "sub"))))
    check("rename a file over a folder", attempt(lambda: os.rename(p("f"), p("empty"))))
    check("rename a folder over a file", attempt(lambda: os.rename(p("empty"), p("f"))))
    check("rename a folder over a folder with a file", attempt(lambda: os.rename(p("empty"), p("dir"))))
    check("RENAME_NOREPLACE onto a name", attempt(lambda: renameat2(p("f"), p("n" * 255), 1)))
    check("RENAME_EXCHANGE with a missing name", attempt(lambda: renameat2(p("f"), p("missing"), 2)))
    check("rename of a missing name", attempt(lambda: os.rename(p("missing"), p("other"))))
    check("hard link to a folder", attempt(lambda: os.link(p("dir"), p("dir-link"))))
    check("hard link onto a name", attempt(lambda: os.link(p("f"), p("dir", "inner"))))
    check("readlink of a file", attempt(lambda: os.readlink(p("f"))))
    check("truncate a folder", attempt(lambda: os.truncate(p("dir"), 0)))
    check("truncate to a negative size", attempt(lambda: os.truncate(p("f"), -1)))
    check("symlink onto a name", attempt(lambda: os.symlink("x", p("f"))))
    check("symlink with an empty target", attempt(lambda: os.symlink("", p("empty-target"))))
    check("getxattr of a missing attribute", attempt(lambda: os.getxattr(p("f"), "user.missing")))
    check("removexattr of a missing attribute", attempt(lambda: os.removexattr(p("f"), "user.missing")))
    check("setxattr XATTR_CREATE twice", attempt(lambda: (os.setxattr(p("f"), "user.a", b"1"),
                                                       os.setxattr(p("f"), "user.a", b"2", os.XATTR_CREATE))))
    check("setxattr XATTR_REPLACE of a missing one", attempt(lambda: os.setxattr(p("f"), "user.b", b"1", os.XATTR_REPLACE)))
    check("a 256-byte attribute name", attempt(lambda: os.setxattr(p("f"), "user." + "a" * 251, b"1")))
    check("a 64 KiB + 1 attribute value", attempt(lambda: os.setxattr(p("f"), "user.big", b"v" * 65537)))
    check("mknod of a FIFO", attempt(lambda: os.mkfifo(p("fifo"))))
    check("mknod of a character device", attempt(lambda: os.mknod(p("chr"), 0o644 | stat.S_IFCHR, os.makedev(1, 3))))
    check("mknod of a block device", attempt(lambda: os.mknod(p("blk"), 0o644 | stat.S_IFBLK, os.makedev(7, 0))))
    check("mknod of a socket", attempt(lambda: os.mknod(p("sock"), 0o644 | stat.S_IFSOCK)))
    for kind in ("fifo", "chr", "blk", "sock"):
        if os.path.lexists(p(kind)):
            st = os.lstat(p(kind))
            check("%s: type and device" % kind, "%o %d:%d" % (stat.S_IFMT(st.st_mode), os.major(st.st_rdev), os.minor(st.st_rdev)))

    # Other users.
    write(p("root-0600"), mode=0o600)
    os.chmod(p("root-0600"), 0o600)
    write(p("root-0666"), mode=0o666)
    os.chmod(p("root-0666"), 0o666)
    os.mkdir(p("private"), 0o700)
    os.chmod(p("private"), 0o700)
    check("nobody creates in root's 0755 folder", as_nobody(lambda: os.close(os.open(p("nobody"), os.O_WRONLY | os.O_CREAT))))
    check("nobody reads root's 0600 file", as_nobody(lambda: os.close(os.open(p("root-0600"), os.O_RDONLY))))
    check("nobody lists root's 0700 folder", as_nobody(lambda: os.listdir(p("private"))))
    check("nobody writes root's 0666 file", as_nobody(lambda: write(p("root-0666"), b"by nobody", 0o666)))
    check("nobody chmods root's file", as_nobody(lambda: os.chmod(p("root-0666"), 0o600)))
    check("nobody chowns root's file", as_nobody(lambda: os.chown(p("root-0666"), NOBODY, NOBODY)))
    check("nobody sets root's writable file's times to now", as_nobody(lambda: os.utime(p("root-0666"))))
    check("nobody sets root's writable file's times to a date", as_nobody(lambda: os.utime(p("root-0666"), (1, 1))))
    check("nobody sets an attribute on root's writable file", as_nobody(lambda: os.setxattr(p("root-0666"), "user.n", b"1")))
    check("nobody renames in root's folder", as_nobody(lambda: os.rename(p("root-0666"), p("moved"))))
    os.mkdir(p("sticky"))
    os.chmod(p("sticky"), 0o1777)
    write(p("sticky", "roots"), mode=0o666)
    os.chmod(p("sticky", "roots"), 0o666)
    check("nobody creates in a sticky folder", as_nobody(lambda: write(p("sticky", "nobodys"))))
    if os.path.exists(p("sticky", "nobodys")):
        st = os.stat(p("sticky", "nobodys"))
        check("nobody's new file: owner", "%d:%d" % (st.st_uid, st.st_gid))
    check("nobody removes root's file in a sticky folder", as_nobody(lambda: os.unlink(p("sticky", "roots"))))
    check("nobody renames root's file in a sticky folder", as_nobody(lambda: os.rename(p("sticky", "roots"), p("sticky", "x"))))
    check("nobody removes its own file in a sticky folder", as_nobody(lambda: os.unlink(p("sticky", "nobodys"))))
    check("root removes nobody's file in a sticky folder",
          attempt(lambda: (as_nobody(lambda: write(p("sticky", "again"))), os.unlink(p("sticky", "again")))))
    # setgid folders: the group and the bit pass on.
    os.mkdir(p("setgid"))
    os.chown(p("setgid"), 0, 4242)
    os.chmod(p("setgid"), 0o2777)
    check("nobody creates in a setgid folder", as_nobody(lambda: write(p("setgid", "file"))))
    check("nobody makes a folder in a setgid folder", as_nobody(lambda: os.mkdir(p("setgid", "sub"))))
    for n in ("file", "sub"):
        if os.path.exists(p("setgid", n)):
            st = os.stat(p("setgid", n))
            check("setgid folder's new %s: group and mode" % n, "%d %o" % (st.st_gid, stat.S_IMODE(st.st_mode)))
    # Writes and chown clear set-user-ID and set-group-ID.
    write(p("suid"), mode=0o6777)
    os.chmod(p("suid"), 0o6777)
    check("nobody writes a 6777 file", as_nobody(lambda: write(p("suid"), b"y", 0o6777)))
    check("a 6777 file after nobody wrote it", "%o" % stat.S_IMODE(os.stat(p("suid")).st_mode))
    write(p("suid2"), mode=0o6755)
    os.chmod(p("suid2"), 0o6755)
    os.chown(p("suid2"), NOBODY, NOBODY)
    check("a 6755 file after chown", "%o" % stat.S_IMODE(os.stat(p("suid2")).st_mode))
    os.chmod(p("suid2"), 0o6755)
    os.chown(p("suid2"), 0, 0)
    check("root chowns without changing anything", "%o" % stat.S_IMODE(os.stat(p("suid2")).st_mode))
    mode_of = lambda name: "%o" % stat.S_IMODE(os.stat(p(name)).st_mode)

    def setid_file(name, mode):
        write(p(name), b"0123456789", mode)
        os.chmod(p(name), mode)

    setid_file("suid3", 0o6777)
    check("nobody truncates a 6777 file", as_nobody(lambda: os.truncate(p("suid3"), 3)))
    check("a 6777 file after nobody truncated it", mode_of("suid3"))
    setid_file("suid4", 0o6777)
    check("nobody opens a 6777 file with O_TRUNC", as_nobody(lambda: os.close(os.open(p("suid4"), os.O_WRONLY | os.O_TRUNC))))
    check("a 6777 file after nobody's O_TRUNC", mode_of("suid4"))
    setid_file("suid5", 0o6777)
    check("nobody ftruncates a 6777 file", as_nobody(lambda: (lambda fd: (os.ftruncate(fd, 2), os.close(fd)))(os.open(p("suid5"), os.O_WRONLY))))
    check("a 6777 file after nobody's ftruncate", mode_of("suid5"))
    setid_file("sgid", 0o2666)
    check("nobody writes a 2666 file", as_nobody(lambda: write(p("sgid"), b"z", 0o2666)))
    check("a 2666 file after nobody wrote it", mode_of("sgid"))
    setid_file("sgid2", 0o2666)
    os.chown(p("sgid2"), 0, 4242)
    os.chmod(p("sgid2"), 0o2666)
    check("nobody, of the file's group by a supplementary group, writes a 2666 file",
          as_nobody(lambda: write(p("sgid2"), b"z", 0o2666), groups=(4242,)))
    check("a 2666 file after a member of its group wrote it", mode_of("sgid2"))
    check("nobody, of the file's group as its own, writes a 2666 file", as_nobody(lambda: write(p("sgid2"), b"z", 0o2666), gid=4242))
    check("a 2666 file after its own group wrote it", mode_of("sgid2"))
    check("nobody creates a 4755 file with O_TRUNC", as_nobody(lambda: os.close(
        os.open(p("sticky", "nobody-suid"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o4755))))
    if os.path.exists(p("sticky", "nobody-suid")):
        check("nobody's new 4755 file", "%o" % stat.S_IMODE(os.stat(p("sticky", "nobody-suid")).st_mode))
    setid_file("suid6", 0o6777)
    write(p("suid6"), b"by root", 0o6777)
    check("a 6777 file after root wrote it", mode_of("suid6"))
    setid_file("suid7", 0o4777)
    check("nobody appends to a 4777 file, twice", as_nobody(lambda: [
        (lambda fd: (os.write(fd, b"+"), os.close(fd)))(os.open(p("suid7"), os.O_WRONLY | os.O_APPEND)) for _ in range(2)]))
    check("a 4777 file after nobody appended", mode_of("suid7"))
    os.chmod(p("suid7"), 0o4777)
    check("a 4777 file set again after nobody appended", mode_of("suid7"))
    check("nobody appends to it again", as_nobody(lambda: (lambda fd: (os.write(fd, b"+"), os.close(fd)))(
        os.open(p("suid7"), os.O_WRONLY | os.O_APPEND))))
    check("a 4777 file after nobody appended again", mode_of("suid7"))

    # Which times each operation changes: on the item, and on its folder.
    os.mkdir(p("t"))
    t = lambda *parts: p("t", *parts)
    write(t("a"), b"0123456789")
    os.mkdir(t("sub"))

    def times_of(label, fn, *paths):
        """Which times `fn` changed on each path (a pair: the path before it, and after it)."""
        pairs = [x if isinstance(x, tuple) else (x, x) for x in paths]
        before = [times(b) for b, _ in pairs]
        time.sleep(0.02)
        fn()
        for which, (_, after), b in zip(("item", "folder", "other folder"), pairs, before):
            try:
                check("times of %s, %s" % (label, which), changed(b, times(after)))
            except OSError as e:
                check("times of %s, %s" % (label, which), name(e.errno))

    times_of("write", lambda: write(t("a"), b"new", 0o644), t("a"), t())
    times_of("pwrite", lambda: (lambda fd: (os.pwrite(fd, b"x", 1), os.close(fd)))(os.open(t("a"), os.O_WRONLY)), t("a"), t())
    times_of("truncate", lambda: os.truncate(t("a"), 1), t("a"), t())
    times_of("truncate to the same size", lambda: os.truncate(t("a"), 1), t("a"), t())
    times_of("chmod", lambda: os.chmod(t("a"), 0o600), t("a"), t())
    times_of("chown", lambda: os.chown(t("a"), NOBODY, NOBODY), t("a"), t())
    times_of("utimens", lambda: os.utime(t("a"), ns=(5, 7)), t("a"), t())
    times_of("setxattr", lambda: os.setxattr(t("a"), "user.t", b"1"), t("a"), t())
    times_of("removexattr", lambda: os.removexattr(t("a"), "user.t"), t("a"), t())
    times_of("link", lambda: os.link(t("a"), t("b")), t("a"), t())
    times_of("unlink of one of two names", lambda: os.unlink(t("b")), t("a"), t())
    times_of("rename within a folder", lambda: os.rename(t("a"), t("c")), (t("a"), t("c")), t())
    times_of("rename into another folder", lambda: os.rename(t("c"), t("sub", "c")), (t("c"), t("sub", "c")), t(), t("sub"))
    times_of("create", lambda: write(t("d")), t())
    times_of("mkdir", lambda: os.mkdir(t("e")), t())
    times_of("rmdir", lambda: os.rmdir(t("e")), t())
    times_of("symlink", lambda: os.symlink("d", t("s")), t())
    times_of("mkfifo", lambda: os.mkfifo(t("q")), t())
    times_of("unlink", lambda: os.unlink(t("q")), t())
    os.utime(t("d"), ns=(1, 2))
    times_of("read of a file whose atime is older than its mtime", lambda: open(t("d"), "rb").read(), t("d"))
    st = os.stat(t("sub", "c"))
    check("utimens with UTIME_OMIT and explicit ns", attempt(lambda: os.utime(t("sub", "c"), ns=(123456789, st.st_mtime_ns))))
    check("nanoseconds kept", str(os.stat(t("sub", "c")).st_atime_ns))

    for line in out:
        print(line)


if __name__ == "__main__":
    if len(sys.argv) != 2 or os.listdir(sys.argv[1]):
        sys.stderr.write(__doc__)
        sys.exit(64)
    main(sys.argv[1])
