/*
 * powercut.so: a recording layer under a process's file I/O, preloaded (LD_PRELOAD) into the
 * daemon by the power-cut tests, so that a later `powercut.py restore` can take every file under
 * one folder back to what a disk would hold after the power failed at that moment.
 *
 * Before each write, ftruncate or fallocate of a regular file under POWERCUT_ROOT it appends to
 * POWERCUT_LOG the bytes and size the write is about to replace (an undo record); an fsync or
 * fdatasync that succeeds appends a sync record for that file, a syncfs or sync one for every
 * file. A record is one append, and each file's undo record, its write and the position a sync
 * starts from are taken under one lock, so the log's order is the order of the writes.
 * An open that creates a file appends a birth record (an inode number freed and reused by a new
 * file does not take the old file's records).
 *
 * With POWERCUT_BOOT_ID set, reading /proc/sys/kernel/random/boot_id reads that file instead: a
 * test changes it to say that the machine started again.
 *
 * Record: u32 kind, u32 pad, u64 dev, u64 ino, i64 offset, i64 old size, u64 length, then
 * length old bytes (kinds: 1 undo of a write, 2 file synced, 3 everything synced, 4 born, 5 undo
 * of a truncate or fallocate). For kinds 2 and 3 `offset` is the log's length when the sync
 * began: records before it are durable.
 *
 * Not modelled (see docs/RELIABILITY.md): directory entries (creating, renaming and unlinking
 * are durable at once), writes through mmap (SQLite's -shm, which SQLite rebuilds after a crash),
 * descriptors made by dup (dup2 onto a tracked one untracks it), posix_fallocate (glibc calls the kernel directly), truncate by path,
 * and any process the library is not preloaded into.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

enum { UNDO = 1, SYNC_FILE = 2, SYNC_ALL = 3, BORN = 4, UNDO_SIZE = 5 };
enum { MAX_FD = 65536 };

struct record {
    uint32_t kind, pad;
    uint64_t dev, ino;
    int64_t offset, old_size;
    uint64_t length;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;
static char root[PATH_MAX];
static size_t root_length;
static dev_t root_dev;
static const char *boot_file;
static unsigned char tracked[MAX_FD];
static unsigned char synchronous[MAX_FD];
static dev_t fd_dev[MAX_FD];
static ino_t fd_ino[MAX_FD];

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_fallocate)(int, int, off_t, off_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

__attribute__((constructor)) static void setup(void) {
    static int done;
    if (done) return;
    done = 1;
    real_open = dlsym(RTLD_NEXT, "open");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_close = dlsym(RTLD_NEXT, "close");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_pwritev = dlsym(RTLD_NEXT, "pwritev");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_fallocate = dlsym(RTLD_NEXT, "fallocate");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_syncfs = dlsym(RTLD_NEXT, "syncfs");
    real_sync = dlsym(RTLD_NEXT, "sync");
    real_dup2 = dlsym(RTLD_NEXT, "dup2");
    real_dup3 = dlsym(RTLD_NEXT, "dup3");
    boot_file = getenv("POWERCUT_BOOT_ID");
    const char *log = getenv("POWERCUT_LOG"), *dir = getenv("POWERCUT_ROOT");
    struct stat st;
    if (!log || !dir || !realpath(dir, root) || stat(root, &st) != 0) return;
    root_length = strlen(root);
    root_dev = st.st_dev;
    log_fd = real_open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
}

/* Appends one record, whole, or ends the process: a lost record would make the restore lie. */
/* Ends the process with `message`: a record the log lacks would make the restore lie. */
static void die(const char *message) {
    syscall(SYS_write, 2, message, strlen(message));
    _exit(70);
}

static void append(struct record r, const void *bytes) {
    struct iovec v[2] = {{&r, sizeof r}, {(void *)bytes, r.length}};
    size_t want = sizeof r + r.length;
    ssize_t n;
    do n = syscall(SYS_writev, log_fd, v, r.length ? 2 : 1); while (n < 0 && errno == EINTR);
    if (n != (ssize_t)want) die("powercut: cannot append to the log\n");
}

static int is_tracked(int fd) {
    if (!real_close) setup();
    return log_fd >= 0 && fd >= 0 && fd < MAX_FD && tracked[fd];
}

/* A descriptor just opened: tracked if it is a regular file under the root. */
static void opened(int fd, int flags, int created) {
    if (log_fd < 0 || fd < 0) return;
    if (fd < MAX_FD) tracked[fd] = 0;
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return;
    target[n] = 0;
    if (strncmp(target, root, root_length) != 0 || (target[root_length] != '/' && target[root_length] != 0)) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
    if (fd >= MAX_FD) die("powercut: a store file got a descriptor past the table\n");
    fd_dev[fd] = st.st_dev;
    fd_ino[fd] = st.st_ino;
    tracked[fd] = 1;
    synchronous[fd] = (flags & (O_SYNC | O_DSYNC)) != 0;
    if (created) {
        pthread_mutex_lock(&lock);
        append((struct record){.kind = BORN, .dev = st.st_dev, .ino = st.st_ino}, NULL);
        pthread_mutex_unlock(&lock);
    }
}

/* The undo record (of `kind`) of a change to [offset, offset + length) of `fd`, under `lock`.
   A descriptor that is no longer the file it was opened as (closed behind the library's back)
   is untracked instead. */
static void save(int fd, int64_t offset, uint64_t length, int append_mode, uint32_t kind) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != fd_dev[fd] || st.st_ino != fd_ino[fd]) {
        tracked[fd] = 0;
        return;
    }
    if (append_mode) offset = st.st_size;
    uint64_t old = 0;
    if (offset < st.st_size) old = (uint64_t)(st.st_size - offset) < length ? (uint64_t)(st.st_size - offset) : length;
    char *bytes = NULL;
    if (old > 0) {
        /* The descriptor may be write-only: read through a second one. */
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        int reader = real_open(link, O_RDONLY | O_CLOEXEC);
        bytes = malloc(old);
        if (reader < 0 || !bytes || pread(reader, bytes, old, offset) != (ssize_t)old)
            die("powercut: cannot read what a write replaces\n");
        real_close(reader);
    }
    append((struct record){.kind = kind, .dev = st.st_dev, .ino = st.st_ino, .offset = offset,
                           .old_size = st.st_size, .length = old}, bytes);
    free(bytes);
}

static void synced_file(int fd, int64_t from) {
    struct stat st;
    if (fstat(fd, &st) != 0) return;
    append((struct record){.kind = SYNC_FILE, .dev = st.st_dev, .ino = st.st_ino, .offset = from}, NULL);
}

static int64_t log_length(void) { return lseek(log_fd, 0, SEEK_END); }

static uint64_t total(const struct iovec *v, int count) {
    uint64_t sum = 0;
    for (int i = 0; i < count; i++) sum += v[i].iov_len;
    return sum;
}

/* Runs `call` with its undo record saved first, all under the lock. */
#define RECORDED(fd, offset, length, append_mode, kind, call)                    \
    do {                                                                         \
        if (!is_tracked(fd)) return call;                                        \
        pthread_mutex_lock(&lock);                                               \
        save(fd, offset, length, append_mode, kind);                             \
        __typeof__(call) result = call;                                          \
        int saved = errno;                                                       \
        if (result >= 0 && synchronous[fd]) synced_file(fd, log_length());       \
        pthread_mutex_unlock(&lock);                                             \
        errno = saved;                                                           \
        return result;                                                           \
    } while (0)

static int appending(int fd) { return (fcntl(fd, F_GETFL) & O_APPEND) != 0; }

ssize_t write(int fd, const void *buffer, size_t count) {
    RECORDED(fd, lseek(fd, 0, SEEK_CUR), count, appending(fd), UNDO, real_write(fd, buffer, count));
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    /* (On Linux a pwrite on an O_APPEND descriptor appends.) */
    RECORDED(fd, offset, count, appending(fd), UNDO, real_pwrite(fd, buffer, count, offset));
}
ssize_t pwrite64(int fd, const void *buffer, size_t count, off_t offset) __attribute__((alias("pwrite")));

ssize_t writev(int fd, const struct iovec *v, int count) {
    RECORDED(fd, lseek(fd, 0, SEEK_CUR), total(v, count), appending(fd), UNDO, real_writev(fd, v, count));
}

ssize_t pwritev(int fd, const struct iovec *v, int count, off_t offset) {
    RECORDED(fd, offset, total(v, count), appending(fd), UNDO, real_pwritev(fd, v, count, offset));
}
ssize_t pwritev64(int fd, const struct iovec *v, int count, off_t offset) __attribute__((alias("pwritev")));

int ftruncate(int fd, off_t length) {
    /* What is cut is read under the lock: from `length` to the end, whatever the end is then. */
    RECORDED(fd, length, UINT64_MAX, 0, UNDO_SIZE, real_ftruncate(fd, length));
}
int ftruncate64(int fd, off_t length) __attribute__((alias("ftruncate")));

int fallocate(int fd, int mode, off_t offset, off_t length) {
    RECORDED(fd, offset, (uint64_t)length, 0, UNDO_SIZE, real_fallocate(fd, mode, offset, length));
}
int fallocate64(int fd, int mode, off_t offset, off_t length) __attribute__((alias("fallocate")));

static int synced(int fd, int (**call_pointer)(int)) {
    if (!real_close) setup();
    int (*call)(int) = *call_pointer;
    if (!is_tracked(fd)) return call(fd);
    pthread_mutex_lock(&lock);
    int64_t from = log_length();
    pthread_mutex_unlock(&lock);
    int result = call(fd);
    int saved = errno;
    if (result == 0) {
        pthread_mutex_lock(&lock);
        synced_file(fd, from);
        pthread_mutex_unlock(&lock);
    }
    errno = saved;
    return result;
}

int fsync(int fd) { return synced(fd, &real_fsync); }
int fdatasync(int fd) { return synced(fd, &real_fdatasync); }

static void synced_all(int64_t from) {
    pthread_mutex_lock(&lock);
    append((struct record){.kind = SYNC_ALL, .offset = from}, NULL);
    pthread_mutex_unlock(&lock);
}

int syncfs(int fd) {
    if (!real_close) setup();
    struct stat st;
    if (log_fd < 0 || fstat(fd, &st) != 0 || st.st_dev != root_dev) return real_syncfs(fd);
    pthread_mutex_lock(&lock);
    int64_t from = log_length();
    pthread_mutex_unlock(&lock);
    int result = real_syncfs(fd);
    int saved = errno;
    if (result == 0) synced_all(from);
    errno = saved;
    return result;
}

void sync(void) {
    if (!real_close) setup();
    if (log_fd < 0) { real_sync(); return; }
    pthread_mutex_lock(&lock);
    int64_t from = log_length();
    pthread_mutex_unlock(&lock);
    real_sync();
    synced_all(from);
}

int close(int fd) {
    if (!real_close) setup();
    if (fd >= 0 && fd < MAX_FD) tracked[fd] = 0;
    return real_close(fd);
}

/* A descriptor duplicated over another: the one replaced is closed (the copy is not tracked). */
int dup2(int old, int new) {
    if (!real_dup2) setup();
    if (new >= 0 && new < MAX_FD && new != old) tracked[new] = 0;
    return real_dup2(old, new);
}

int dup3(int old, int new, int flags) {
    if (!real_dup3) setup();
    if (new >= 0 && new < MAX_FD && new != old) tracked[new] = 0;
    return real_dup3(old, new, flags);
}

/* The boot id file a test names, in place of the kernel's. */
static const char *redirected(const char *path) {
    return boot_file && strcmp(path, "/proc/sys/kernel/random/boot_id") == 0 ? boot_file : path;
}

static int exists_at(int dir, const char *path) {
    struct stat st;
    return fstatat(dir, path, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

static int opened_at(int dir, const char *path, int flags, mode_t mode) {
    if (!real_openat) setup();
    path = redirected(path);
    if (log_fd < 0) return real_openat(dir, path, flags, mode);
    int creating = (flags & O_CREAT) && ((flags & O_EXCL) || !exists_at(dir, path));
    if ((flags & O_TRUNC) && !creating) {
        /* The truncation of an existing file is a change to record: a probe descriptor says
           whether the file is tracked; if so its content is saved and the open made, both
           under the lock, so no write comes between. */
        int probe = real_openat(dir, path, O_RDONLY | O_CLOEXEC | (flags & O_NOFOLLOW));
        if (probe >= 0) {
            opened(probe, 0, 0);
            if (is_tracked(probe)) {
                pthread_mutex_lock(&lock);
                save(probe, 0, UINT64_MAX, 0, UNDO_SIZE);
                int fd = real_openat(dir, path, flags, mode);
                int saved = errno;
                tracked[probe] = 0;
                real_close(probe);
                if (fd >= 0) opened(fd, flags, 0);
                pthread_mutex_unlock(&lock);
                errno = saved;
                return fd;
            }
            close(probe);
        }
    }
    int fd = real_openat(dir, path, flags, mode);
    if (fd >= 0) {
        int saved = errno;
        opened(fd, flags, creating);
        errno = saved;
    }
    return fd;
}

static mode_t mode_argument(int flags, va_list arguments) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(arguments, mode_t) : 0;
}

int open(const char *path, int flags, ...) {
    va_list a;
    va_start(a, flags);
    mode_t mode = mode_argument(flags, a);
    va_end(a);
    return opened_at(AT_FDCWD, path, flags, mode);
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dir, const char *path, int flags, ...) {
    va_list a;
    va_start(a, flags);
    mode_t mode = mode_argument(flags, a);
    va_end(a);
    return opened_at(dir, path, flags, mode);
}
int openat64(int dir, const char *path, int flags, ...) __attribute__((alias("openat")));

int creat(const char *path, mode_t mode) { return opened_at(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) __attribute__((alias("creat")));

/* The _FORTIFY_SOURCE entry points. */
int __open_2(const char *path, int flags) { return opened_at(AT_FDCWD, path, flags, 0); }
int __open64_2(const char *path, int flags) __attribute__((alias("__open_2")));
int __openat_2(int dir, const char *path, int flags) { return opened_at(dir, path, flags, 0); }
int __openat64_2(int dir, const char *path, int flags) __attribute__((alias("__openat_2")));
