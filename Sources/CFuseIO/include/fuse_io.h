#ifndef UBIQUITYFS_FUSE_IO_H
#define UBIQUITYFS_FUSE_IO_H
// The daemon's device I/O with the kernel's FUSE module, under libfuse 3.14's session:
// hooks on what libfuse reads and writes (for what it does not pass on), and requests served
// through FUSE-over-io_uring, which libfuse 3.14 does not speak. See fuse_io.c.
#include <stdint.h>

struct fuse_session;

/// In a request's open flags (`fuse_file_info.flags` of open and write): the kernel asked to
/// drop set-user-ID and set-group-ID. No open(2) flag uses this bit.
#define UBIQUITYFS_FLAG_KILL_SUIDGID 0x40000000u
/// In a SETATTR's mode when it sets no mode (`st_mode` without FUSE_SET_ATTR_MODE): the same.
#define UBIQUITYFS_MODE_KILL_SUIDGID 0x40000000u

/// Where the rings say what happened (served, refused, ended), with the caller's context.
typedef void (*ubiquityfs_log_fn)(const char *message, void *context);

/// After fuse_session_mount on `mountpoint`: the session's device I/O goes through the hooks.
/// With `threads_per_cpu` > 0, requests are served over io_uring when the kernel offers it at
/// INIT (the fuse module's `enable_uring`): a queue per CPU, that many threads each. 0 on
/// success. One session per process.
int ubiquityfs_custom_io(struct fuse_session *se, const char *mountpoint, int threads_per_cpu,
                         ubiquityfs_log_fn log, void *context);

/// Requests answered through the rings so far.
uint64_t ubiquityfs_ring_served(void);

/// Ends the rings' threads (after the session loop, before the session is destroyed).
void ubiquityfs_ring_stop(void);

/// Whether a pipe can be grown to `bytes` (F_SETPIPE_SZ).
int ubiquityfs_pipe_can_hold(int bytes);
#endif
