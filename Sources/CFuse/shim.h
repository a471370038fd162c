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

// The device I/O hooks and FUSE over io_uring are C of their own: the CFuseIO target.
#endif
