#ifndef UBIQUITYFS_CFUSE_SHIM_H
#define UBIQUITYFS_CFUSE_SHIM_H
// System-library targets take no C settings, so the API version is chosen here.
// 3.12 or later makes fuse_session_loop_mt a real function Swift can call.
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>

// For the replays of other writers' changes (UbiquityFuse/Replay.swift). Swift sees neither
// glibc's gettid nor the variadic syscall(2), and glibc 2.36 has no openat2 wrapper.
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

// The calling thread's id, as the kernel names it in FUSE requests.
static inline int ubiquityfs_gettid(void) { return (int)syscall(SYS_gettid); }

static inline int ubiquityfs_openat2(int dirfd, const char *path, unsigned long long flags,
                                     unsigned long long resolve) {
    struct open_how how = {0};
    how.flags = flags;
    how.resolve = resolve;
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

// Device I/O goes through the hooks below (fuse_session_custom_io) for what libfuse 3.14 does
// not pass on. The kernel offers FUSE_HANDLE_KILLPRIV_V2 in INIT: with it the file system
// drops set-user-ID and set-group-ID itself, and the kernel stops asking for
// security.capability before every write (a round trip per write). libfuse 3.14 neither takes
// that offer nor hands the file system the flags that say when to drop the bits (on WRITE, an
// O_TRUNC OPEN, a SETATTR that truncates or changes the owner): the read hook moves them into
// fields libfuse does pass on, where the bridge takes them out again. (CREATE's flag is left:
// a create makes a new file, whose bits stay, as on ext4.) Layouts are the kernel's FUSE ABI
// (linux/fuse.h), whose structures only ever grow at the end.
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#define UBIQUITYFS_OP_SETATTR 4
#define UBIQUITYFS_OP_OPEN 14
#define UBIQUITYFS_OP_WRITE 16
#define UBIQUITYFS_OP_INIT 26
#define UBIQUITYFS_IN_HEADER 40
#define UBIQUITYFS_KILLPRIV_V2 (1u << 28)
#define UBIQUITYFS_WRITE_KILL_SUIDGID (1u << 2)
#define UBIQUITYFS_OPEN_KILL_SUIDGID (1u << 0)
#define UBIQUITYFS_FATTR_MODE (1u << 0)
#define UBIQUITYFS_FATTR_KILL_SUIDGID (1u << 11)
/// In a request's open flags (`fuse_file_info.flags` of open and write): the kernel
/// asked to drop set-user-ID and set-group-ID. No open(2) flag uses this bit.
#define UBIQUITYFS_FLAG_KILL_SUIDGID 0x40000000u
/// In a SETATTR's mode when it sets no mode (`st_mode` without FUSE_SET_ATTR_MODE): the same.
#define UBIQUITYFS_MODE_KILL_SUIDGID 0x40000000u

// The INIT request's unique id (0 once answered) and the flags the kernel offered in it. A
// static inside a function: Swift's importer emits no definition for a header's static variable.
struct ubiquityfs_init_state { uint64_t unique; uint32_t offered; };
static inline struct ubiquityfs_init_state *ubiquityfs_init(void) {
    static struct ubiquityfs_init_state state;
    return &state;
}

static inline uint32_t ubiquityfs_load32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline void ubiquityfs_store32(char *p, uint32_t v) { memcpy(p, &v, 4); }

/// Moves the kill flag at `from` (if `bit` is set there) into `to` as `mark`.
static inline void ubiquityfs_move_flag(char *arg, int from, uint32_t bit, int to, uint32_t mark) {
    if (ubiquityfs_load32(arg + from) & bit) ubiquityfs_store32(arg + to, ubiquityfs_load32(arg + to) | mark);
}

static ssize_t ubiquityfs_io_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n < UBIQUITYFS_IN_HEADER) return n;
    char *b = (char *)buf, *arg = b + UBIQUITYFS_IN_HEADER;
    ssize_t size = n - UBIQUITYFS_IN_HEADER;
    switch (ubiquityfs_load32(b + 4)) {
    case UBIQUITYFS_OP_INIT:   // fuse_init_in: flags at 12
        if (size >= 16) {
            uint64_t unique;
            memcpy(&unique, b + 8, 8);
            __atomic_store_n(&ubiquityfs_init()->offered, ubiquityfs_load32(arg + 12), __ATOMIC_RELAXED);
            __atomic_store_n(&ubiquityfs_init()->unique, unique, __ATOMIC_RELEASE);
        }
        break;
    case UBIQUITYFS_OP_WRITE:  // fuse_write_in: write_flags at 20, flags at 32
        if (size >= 40) ubiquityfs_move_flag(arg, 20, UBIQUITYFS_WRITE_KILL_SUIDGID, 32, UBIQUITYFS_FLAG_KILL_SUIDGID);
        break;
    case UBIQUITYFS_OP_OPEN:   // fuse_open_in: flags at 0, open_flags at 4
        if (size >= 8) ubiquityfs_move_flag(arg, 4, UBIQUITYFS_OPEN_KILL_SUIDGID, 0, UBIQUITYFS_FLAG_KILL_SUIDGID);
        break;
    case UBIQUITYFS_OP_SETATTR: // fuse_setattr_in: valid at 0, mode at 68
        if (size >= 88 && !(ubiquityfs_load32(arg) & UBIQUITYFS_FATTR_MODE))
            ubiquityfs_move_flag(arg, 0, UBIQUITYFS_FATTR_KILL_SUIDGID, 68, UBIQUITYFS_MODE_KILL_SUIDGID);
        break;
    }
    return n;
}

static ssize_t ubiquityfs_io_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    // The reply to INIT (fuse_init_out: flags at 12) takes the kernel's offer of KILLPRIV_V2.
    // (Other threads may send notifications meanwhile: the state is read atomically.)
    struct ubiquityfs_init_state *init = ubiquityfs_init();
    uint64_t awaited = __atomic_load_n(&init->unique, __ATOMIC_ACQUIRE);
    if (awaited != 0 && count >= 2 && iov[0].iov_len >= 16 && iov[1].iov_len >= 16) {
        const char *h = (const char *)iov[0].iov_base;
        uint64_t unique;
        int32_t error;
        memcpy(&unique, h + 8, 8);
        memcpy(&error, h + 4, 4);
        if (unique == awaited && error == 0) {
            char *out = (char *)iov[1].iov_base;
            uint32_t offered = __atomic_load_n(&init->offered, __ATOMIC_RELAXED);
            ubiquityfs_store32(out + 12, ubiquityfs_load32(out + 12) | (offered & UBIQUITYFS_KILLPRIV_V2));
            __atomic_store_n(&init->unique, 0, __ATOMIC_RELEASE);
        }
    }
    return writev(fd, iov, count);
}

// A reply spliced from a pipe (a read answered from blob files): without this hook a session
// with custom I/O never splices. splice(2) through syscall(2): its declaration wants _GNU_SOURCE.
static ssize_t ubiquityfs_io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                                         unsigned int flags, void *userdata) {
    (void)userdata;
    return (ssize_t)syscall(SYS_splice, fdin, offin, fdout, offout, len, flags);
}

/// Whether a pipe can be grown to `bytes` (F_SETPIPE_SZ, which Swift does not see).
static inline int ubiquityfs_pipe_can_hold(int bytes) {
    int fds[2];
    if (syscall(SYS_pipe2, fds, O_CLOEXEC) != 0) return 0;
    int ok = fcntl(fds[0], 1031 /* F_SETPIPE_SZ */, bytes) >= bytes;
    close(fds[0]);
    close(fds[1]);
    return ok;
}

/// After fuse_session_mount: the session's device I/O goes through the hooks above.
static inline int ubiquityfs_custom_io(struct fuse_session *se) {
    static const struct fuse_custom_io io = { ubiquityfs_io_writev, ubiquityfs_io_read, NULL, ubiquityfs_io_splice_send };
    return fuse_session_custom_io(se, &io, fuse_session_fd(se));
}
#endif
