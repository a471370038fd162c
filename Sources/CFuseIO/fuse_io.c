// The daemon's device I/O under libfuse 3.14's session (fuse_session_custom_io).
//
// 1. Flags libfuse does not pass on. The kernel offers FUSE_HANDLE_KILLPRIV_V2 in INIT: with it
//    the file system drops set-user-ID and set-group-ID itself, and the kernel stops asking for
//    security.capability before every write (a round trip per write). libfuse 3.14 neither takes
//    that offer nor hands the file system the flags that say when to drop the bits (on WRITE, an
//    O_TRUNC OPEN, a SETATTR that truncates or changes the owner): each request's flags are moved
//    into fields libfuse does pass on, where the bridge takes them out again. (CREATE's flag is
//    left: a create makes a new file, whose bits stay, as on ext4.)
//
// 2. FUSE over io_uring. Through /dev/fuse a request wakes a daemon thread and its answer wakes
//    the caller, often each on the other CPU, which on a virtual machine's halted CPUs costs
//    more than a small request. With the fuse module's `enable_uring` the kernel offers a queue
//    per CPU instead: a request goes to the queue of the CPU it was made on, where a thread
//    pinned to that CPU takes it from its ring and answers into the same ring entry, which also
//    fetches the next request (one system call). libfuse 3.14 does not speak this, so each
//    request is laid out as /dev/fuse would have delivered it and handed to
//    fuse_session_process_buf; its answer, which libfuse writes through the hooks below, is
//    caught there by its `unique` and put in its entry. FORGET, INTERRUPT and notifications stay
//    on /dev/fuse.
//
//    Only a ring's own thread submits to it: the kernel copies the next request into an entry
//    from the thread that committed the entry's answer, and cancels what a thread submitted
//    when it exits. So an answer given later from another thread (a lock that waited) is handed
//    to the ring's thread, woken through an eventfd it polls in its ring.
//
// Layouts are the kernel's FUSE ABI (7.42 for the rings; Debian 12's headers predate them),
// whose structures only ever grow at the end.
#define _GNU_SOURCE
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>

#include "fuse_io.h"
#include "uring_abi.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define OP_SETATTR 4
#define OP_OPEN 14
#define OP_WRITE 16
#define OP_INIT 26
#define IN_HEADER 40
#define OUT_HEADER 16
#define KILLPRIV_V2 (1u << 28)
#define MAX_PAGES_FLAG (1u << 22)
#define WRITE_KILL_SUIDGID (1u << 2)
#define OPEN_KILL_SUIDGID (1u << 0)
#define FATTR_MODE (1u << 0)
#define FATTR_KILL_SUIDGID (1u << 11)

static uint32_t load32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static void store32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint64_t load64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

// ---- state ---------------------------------------------------------------------------------------

#define RING_SQES 64

/// `unique` of an entry the kernel has dropped (its ring's thread ended, or it refused it).
#define DEAD UINT64_MAX
/// The name of a nudge's thread (see nudge), which the keeper leaves pinned.
#define NUDGER "ubiquityfs-nudge"

struct ring;

/// A ring entry: the buffers the kernel fills with a request and takes the answer from.
struct ent {
    struct ring *ring;
    struct ent *next;            // every entry ever made, newest first (never freed)
    struct ent *handed;          // on its ring's list of answers from other threads
    struct ent *queued;          // on the workers' list (see offload)
    struct uring_req_header *header;
    /// A page, then the payload buffer: a request's header and op struct are copied in just
    /// before the payload, so that it lies in memory as read from /dev/fuse.
    char *base;
    struct iovec iov[2];
    /// The request the entry holds; 0 while the kernel has it or it waits to be committed;
    /// DEAD. Atomic.
    uint64_t unique;
    /// Answered on the serving thread while being served: committed when serving returns.
    int answered;
};

/// One thread's io_uring, serving one CPU's queue.
struct ring {
    int qid, fd, wake;           // wake: the eventfd other threads write to
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    char *sqes;
    struct uring_cqe *cqes;
    unsigned sq_entries, unsubmitted;
    pthread_t thread;
    pid_t tid;
    /// Answers from other threads, for this ring's thread to commit; `ended` once it has
    /// stopped, after which whoever answers commits.
    pthread_mutex_t lock;
    struct ent *handed;
    int ended;
    /// Where a nudge's statx writes (its result is not read).
    char nudged[256] __attribute__((aligned(8)));
};

static struct {
    struct fuse_session *se;
    int fd;
    char *mountpoint;
    int threads_per_cpu;
    ubiquityfs_log_fn log;
    void *context;
    /// INIT's unique (0 once answered) and the flags the kernel offered in it. Atomic.
    uint64_t init_unique;
    uint32_t offered, offered2;
    size_t page;
    /// Each entry's payload buffer (from INIT's answer).
    size_t payload;
    struct ring **rings;
    int nrings;
    struct ent *entries;         // atomic head
    uint64_t served;
    int stopping;
    /// Large reads and writes, laid out, for the workers (see offload).
    pthread_mutex_t work_lock;
    pthread_cond_t work_ready;
    struct ent *work, *work_last;   // first in, first out
    pthread_t *workers;
    int nworkers;
    /// The daemon's CPU set before any ring thread was pinned (see keep_affinity).
    cpu_set_t cpus;
    pthread_t keeper;
    int keeping;
} state = { .work_lock = PTHREAD_MUTEX_INITIALIZER, .work_ready = PTHREAD_COND_INITIALIZER };

#define OP_READ 15
/// Reads and writes of at least this many bytes are served by a worker (see offload).
#define LARGE (128 * 1024)

/// The entry whose request this thread is serving.
static __thread struct ent *serving;

static void report(const char *format, ...) {
    if (!state.log) return;
    char line[512];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof line, format, args);
    va_end(args);
    state.log(line, state.context);
}

uint64_t ubiquityfs_ring_served(void) { return __atomic_load_n(&state.served, __ATOMIC_RELAXED); }

// ---- requests: the kill flags -----------------------------------------------------------------

/// Moves the kill flag at `from` (if `bit` is set there) into `to` as `mark`.
static void move_flag(char *arg, int from, uint32_t bit, int to, uint32_t mark) {
    if (load32(arg + from) & bit) store32(arg + to, load32(arg + to) | mark);
}

/// A request of `n` bytes as read from /dev/fuse: notes INIT's offer, moves the kill flags.
static void take_request(char *b, size_t n) {
    if (n < IN_HEADER) return;
    char *arg = b + IN_HEADER;
    size_t size = n - IN_HEADER;
    switch (load32(b + 4)) {
    case OP_INIT:     // fuse_init_in: flags at 12, flags2 at 16 (with URING_INIT_EXT)
        if (size >= 16) {
            uint32_t flags = load32(arg + 12);
            __atomic_store_n(&state.offered, flags, __ATOMIC_RELAXED);
            __atomic_store_n(&state.offered2, (flags & URING_INIT_EXT) && size >= 20 ? load32(arg + 16) : 0, __ATOMIC_RELAXED);
            __atomic_store_n(&state.init_unique, load64(b + 8), __ATOMIC_RELEASE);
        }
        break;
    case OP_WRITE:    // fuse_write_in: write_flags at 20, flags at 32
        if (size >= 40) move_flag(arg, 20, WRITE_KILL_SUIDGID, 32, UBIQUITYFS_FLAG_KILL_SUIDGID);
        break;
    case OP_OPEN:     // fuse_open_in: flags at 0, open_flags at 4
        if (size >= 8) move_flag(arg, 4, OPEN_KILL_SUIDGID, 0, UBIQUITYFS_FLAG_KILL_SUIDGID);
        break;
    case OP_SETATTR:  // fuse_setattr_in: valid at 0, mode at 68
        if (size >= 88 && !(load32(arg) & FATTR_MODE))
            move_flag(arg, 0, FATTR_KILL_SUIDGID, 68, UBIQUITYFS_MODE_KILL_SUIDGID);
        break;
    }
}

// ---- the rings ----------------------------------------------------------------------------------

static int submit(struct ring *r, int wait);

/// The next submission entry of ring `r`, cleared, with `opcode`, `fd` and `user_data` set
/// (queued by `queue`). A full queue (many answers handed over at once) is submitted first.
static char *next_sqe(struct ring *r, uint8_t opcode, int32_t fd, uint64_t data) {
    while (*r->sq_tail - __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE) >= r->sq_entries)
        if (submit(r, 0) <= 0) sched_yield();
    char *s = r->sqes + URING_SQE_SIZE * (*r->sq_tail & *r->sq_mask);
    memset(s, 0, URING_SQE_SIZE);
    s[0] = (char)opcode;
    memcpy(s + URING_SQE_FD, &fd, 4);
    memcpy(s + URING_SQE_USER_DATA, &data, 8);
    return s;
}

static void queue(struct ring *r) {
    unsigned tail = *r->sq_tail, slot = tail & *r->sq_mask;
    r->sq_array[slot] = slot;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    r->unsubmitted++;
}

/// Queues a command for entry `e` (REGISTER or COMMIT_AND_FETCH), or with `e` NULL a poll of
/// the ring's eventfd. Only the ring's thread pushes (before it starts, start_rings; once it has
/// ended, whoever answers).
static void push(struct ring *r, uint32_t cmd, struct ent *e) {
    uint64_t data = (uint64_t)(uintptr_t)e;
    if (!e) {
        uint32_t events = POLLIN;
        char *s = next_sqe(r, URING_OP_POLL_ADD, r->wake, data);
        memcpy(s + URING_SQE_OP_FLAGS, &events, 4);
        queue(r);
        return;
    }
    char *s = next_sqe(r, URING_OP_URING_CMD, state.fd, data);
    memcpy(s + URING_SQE_CMD_OP, &cmd, 4);
    if (cmd == URING_CMD_REGISTER) {
        uint64_t buffers = (uint64_t)(uintptr_t)e->iov;   // the header and payload buffers
        uint32_t count = 2;
        memcpy(s + URING_SQE_ADDR, &buffers, 8);
        memcpy(s + URING_SQE_LEN, &count, 4);
    }
    struct uring_cmd_req c = { .qid = (uint16_t)r->qid };
    if (cmd == URING_CMD_COMMIT_AND_FETCH) c.commit_id = e->header->ent.commit_id;
    memcpy(s + URING_SQE_CMD, &c, sizeof c);
    queue(r);
}

/// Submits what is queued, then (with `wait`) waits for a completion. What the kernel did not
/// take stays counted, for the next call.
static int submit(struct ring *r, int wait) {
    unsigned n = r->unsubmitted;
    if (n == 0 && !wait) return 0;
    int done = (int)syscall(__NR_io_uring_enter, r->fd, n, wait, wait ? URING_ENTER_GETEVENTS : 0, NULL, 0);
    if (done >= 0 && (unsigned)done <= n) r->unsubmitted = n - (unsigned)done;
    return done;
}

/// A new entry of ring `r`, registered with the kernel at the ring's next submission.
static struct ent *add_entry(struct ring *r) {
    struct ent *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->header = aligned_alloc(64, sizeof *e->header);
    e->base = mmap(NULL, state.page + state.payload, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!e->header || e->base == MAP_FAILED) {
        free(e->header);
        if (e->base != MAP_FAILED) munmap(e->base, state.page + state.payload);
        free(e);
        return NULL;
    }
    memset(e->header, 0, sizeof *e->header);
    e->ring = r;
    e->iov[0] = (struct iovec){ e->header, sizeof *e->header };
    e->iov[1] = (struct iovec){ e->base + state.page, state.payload };
    e->next = __atomic_load_n(&state.entries, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&state.entries, &e->next, e, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {}
    push(r, URING_CMD_REGISTER, e);
    return e;
}

static void *nudge_main(void *queue) {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    // Named first, so that the keeper leaves it pinned (it starts on the queue's CPU already).
    pthread_setname_np(pthread_self(), NUDGER);
    cpu_set_t cpu;
    CPU_ZERO(&cpu);
    CPU_SET((int)(intptr_t)queue, &cpu);
    (void)sched_setaffinity(0, sizeof cpu, &cpu);
    struct statx into;
    if (statx(AT_FDCWD, state.mountpoint, AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &into) != 0)
        report("a nudge (statx of %s) failed: %s", state.mountpoint, strerror(errno));
    return NULL;
}

/// Makes a request on the CPU of ring `r`'s queue, from a short-lived thread pinned to it: a
/// statx of the mount's root that reaches the daemon (a GETATTR). A registration only makes an
/// entry available: requests the kernel queued while the queue had none wait for the next
/// answer committed on that queue, and when every other entry holds a lock that waits, none may
/// come. The nudge takes the new entry (submitted first) and its answer is that commit.
static void nudge(struct ring *r) {
    if (!state.mountpoint) return;
    submit(r, 0);
    pthread_attr_t attr;
    cpu_set_t cpu;
    CPU_ZERO(&cpu);
    CPU_SET(r->qid, &cpu);
    pthread_t thread;
    if (pthread_attr_init(&attr) != 0) return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setaffinity_np(&attr, sizeof cpu, &cpu);
    if (pthread_create(&thread, &attr, nudge_main, (void *)(intptr_t)r->qid) != 0)
        report("io_uring queue %d: cannot start a nudge", r->qid);
    pthread_attr_destroy(&attr);
}

/// Whether the queue of ring `r` has an entry the kernel can fill (or one of its threads is
/// about to commit).
static int has_free_entry(struct ring *r) {
    for (struct ent *e = __atomic_load_n(&state.entries, __ATOMIC_ACQUIRE); e; e = e->next)
        if (e->ring->qid == r->qid && __atomic_load_n(&e->unique, __ATOMIC_ACQUIRE) == 0) return 1;
    return 0;
}

/// The entry holding request `unique`, if a ring carried it, and whether it is the one being
/// served on this thread (*here: committed when serving returns). Anywhere else the entry is
/// taken (its `unique` cleared), and the caller hands it over with `hand`.
static struct ent *entry_for(uint64_t unique, int *here) {
    *here = 0;
    struct ent *e = serving;
    if (e && __atomic_load_n(&e->unique, __ATOMIC_RELAXED) == unique && !e->answered) {
        *here = 1;
        return e;
    }
    if (unique == 0 || unique == DEAD) return NULL;
    for (e = __atomic_load_n(&state.entries, __ATOMIC_ACQUIRE); e; e = e->next) {
        uint64_t expected = unique;
        if (__atomic_compare_exchange_n(&e->unique, &expected, 0, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) return e;
    }
    return NULL;
}

/// An answer put in entry `e` by a thread other than its ring's: its ring's thread commits it
/// (or, once that thread has ended, this one does).
static void hand(struct ent *e) {
    struct ring *r = e->ring;
    pthread_mutex_lock(&r->lock);
    if (!r->ended) {
        e->handed = r->handed;
        r->handed = e;
        pthread_mutex_unlock(&r->lock);
        uint64_t one = 1;
        (void)!write(r->wake, &one, sizeof one);
        return;
    }
    push(r, URING_CMD_COMMIT_AND_FETCH, e);
    submit(r, 0);
    pthread_mutex_unlock(&r->lock);
}

/// Writes an answer (out header, then its body) into entry `e`. An answer larger than the
/// payload buffer (none should be: the kernel asks for at most max_pages) becomes EIO. It may
/// overwrite the request's own payload: the bridge copies what it needs before answering.
static void fill(struct ent *e, const struct iovec *iov, int count) {
    char header[OUT_HEADER];
    size_t have = 0, body = 0;
    char *payload = e->base + state.page;
    int too_big = 0;
    for (int i = 0; i < count; i++) {
        const char *p = iov[i].iov_base;
        size_t len = iov[i].iov_len;
        if (have < OUT_HEADER) {
            size_t take = len < OUT_HEADER - have ? len : OUT_HEADER - have;
            memcpy(header + have, p, take);
            have += take;
            p += take;
            len -= take;
        }
        if (len == 0) continue;
        if (body + len > state.payload) too_big = 1;
        else memmove(payload + body, p, len);
        body += len;
    }
    if (too_big) {
        int32_t eio = -EIO;
        memcpy(header + 4, &eio, 4);
        body = 0;
    }
    store32(header, (uint32_t)(OUT_HEADER + body));
    memcpy(e->header->in_out, header, OUT_HEADER);
    e->header->ent.payload_sz = (uint32_t)body;
}

/// Lays the request the kernel put in entry `e` out as /dev/fuse would have delivered it: its
/// start and length, or NULL when it does not add up (then answered EIO).
static char *lay_out(struct ring *r, struct ent *e, uint32_t *length) {
    struct uring_req_header *h = e->header;
    uint32_t len = load32(h->in_out);
    uint64_t unique = load64(h->in_out + 8);
    size_t payload = h->ent.payload_sz;
    // The request's own struct went to op_in, the rest (names, data) to the payload.
    if (len < IN_HEADER + payload || len - IN_HEADER - payload > sizeof h->op_in || payload > state.payload) {
        report("io_uring queue %d: a request of %u bytes with %zu in its payload does not add up: refused (EIO)",
               r->qid, len, payload);
        struct { uint32_t len; int32_t error; uint64_t unique; } out = { OUT_HEADER, -EIO, unique };
        struct iovec iov = { &out, sizeof out };
        fill(e, &iov, 1);
        return NULL;
    }
    size_t op = len - IN_HEADER - payload;
    char *start = e->base + state.page - IN_HEADER - op;
    memcpy(start, h->in_out, IN_HEADER);
    memcpy(start + IN_HEADER, h->op_in, op);
    take_request(start, len);
    e->answered = 0;
    __atomic_store_n(&e->unique, unique, __ATOMIC_RELEASE);
    *length = len;
    return start;
}

/// Whether entry `e`'s request (laid out at `start`) reads or writes LARGE bytes or more.
static int is_large(const char *start, uint32_t len) {
    uint32_t opcode = load32(start + 4);
    // fuse_read_in: size at 16; a write's data follows its 40-byte fuse_write_in.
    if (opcode == OP_READ) return len >= IN_HEADER + 20 && load32(start + IN_HEADER + 16) >= LARGE;
    return opcode == OP_WRITE && len >= IN_HEADER + 40 + LARGE;
}

/// A large read or write goes to a worker, not pinned to this CPU, and its answer comes back
/// through `hand`: a sequential read or write then has the daemon's work on one CPU beside
/// the program's copying on the other, where a ring thread would take turns with it.
static void offload(struct ent *e) {
    pthread_mutex_lock(&state.work_lock);
    e->queued = NULL;
    if (state.work_last) state.work_last->queued = e;
    else state.work = e;
    state.work_last = e;
    pthread_cond_signal(&state.work_ready);
    pthread_mutex_unlock(&state.work_lock);
}

static void *work_main(void *unused) {
    (void)unused;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        pthread_mutex_lock(&state.work_lock);
        while (!state.work && !__atomic_load_n(&state.stopping, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&state.work_ready, &state.work_lock);
        struct ent *e = state.work;
        if (e && !(state.work = e->queued)) state.work_last = NULL;
        pthread_mutex_unlock(&state.work_lock);
        if (!e) return NULL;
        uint32_t len = load32(e->header->in_out);
        struct fuse_buf buf = { .size = len, .mem = e->base + state.page - (len - e->header->ent.payload_sz) };
        fuse_session_process_buf(state.se, &buf);
        __atomic_add_fetch(&state.served, 1, __ATOMIC_RELAXED);
    }
}

/// Serves the request the kernel put in entry `e`.
static void serve(struct ring *r, struct ent *e) {
    uint32_t len;
    char *start = lay_out(r, e, &len);
    if (!start) {
        push(r, URING_CMD_COMMIT_AND_FETCH, e);
        return;
    }
    // (Its entry stays busy meanwhile: requests the kernel queues behind it are fetched by
    // the commit of its answer, which a read or write always gets.)
    if (state.nworkers > 0 && is_large(start, len)) {
        offload(e);
        return;
    }
    serving = e;
    struct fuse_buf buf = { .size = len, .mem = start };
    fuse_session_process_buf(state.se, &buf);
    serving = NULL;
    __atomic_add_fetch(&state.served, 1, __ATOMIC_RELAXED);
    if (e->answered) {
        __atomic_store_n(&e->unique, 0, __ATOMIC_RELEASE);
        push(r, URING_CMD_COMMIT_AND_FETCH, e);
    } else if (__atomic_load_n(&e->unique, __ATOMIC_ACQUIRE) != 0 && !has_free_entry(r)) {
        // Answered later (a lock that waits): this thread takes another entry.
        if (add_entry(r)) nudge(r);
        else report("io_uring queue %d: no memory for another ring entry; this CPU's requests wait on the others", r->qid);
    }
}

/// Whether this thread may leave SCHED_IDLE again once in it: a policy above idle needs
/// CAP_SYS_NICE or a RLIMIT_NICE that allows the thread's nice value.
static int may_leave_idle(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long effective = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &effective) == 1) break;
    if (f) fclose(f);
    if (effective & (1ull << 23)) return 1;   // CAP_SYS_NICE
    struct rlimit limit;
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);
    return errno == 0 && getrlimit(RLIMIT_NICE, &limit) == 0
        && (limit.rlim_cur == RLIM_INFINITY || (long long)limit.rlim_cur >= 20 - nice);
}

static void *ring_main(void *arg) {
    struct ring *r = arg;
    __atomic_store_n(&r->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_RELEASE);
    // Signals go to the thread waiting in libfuse's loop, which ends it (as libfuse's own
    // workers do).
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    cpu_set_t cpu;
    CPU_ZERO(&cpu);
    CPU_SET(r->qid, &cpu);
    // Best effort: a CPU outside the daemon's set serves unpinned.
    (void)sched_setaffinity(0, sizeof cpu, &cpu);
    // SCHED_IDLE while committing and waiting: a CPU running only such threads counts as idle,
    // so an answer wakes its caller here, not on another (halted) CPU. Serving is at the
    // daemon's own policy, which the threads it starts inherit. Only from the usual policies,
    // and where it may come back.
    struct sched_param none = { 0 }, own;
    int policy = sched_getscheduler(0);
    int idle = (policy == SCHED_OTHER || policy == SCHED_BATCH) && sched_getparam(0, &own) == 0 && may_leave_idle();
    int ended = 0, refused = 0, failed = 0;
    while (!ended) {
        if (idle && sched_setscheduler(0, SCHED_IDLE, &none) != 0) idle = 0;
        int done = submit(r, 1);
        if (idle && sched_setscheduler(0, policy, &own) != 0) {
            report("io_uring queue %d: cannot leave SCHED_IDLE (%s): this thread stays at idle priority", r->qid, strerror(errno));
            idle = 0;
        }
        if (done < 0 && errno != EINTR) {
            // Nothing else serves this CPU's queue: try again, and say so once.
            if (!failed++) report("io_uring queue %d: io_uring_enter: %s; retrying", r->qid, strerror(errno));
            usleep(1000);
            continue;
        }
        unsigned head = *r->cq_head, tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        while (head != tail) {
            struct uring_cqe c = r->cqes[head & *r->cq_mask];
            head++;
            __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
            struct ent *e = (struct ent *)(uintptr_t)c.user_data;
            if (!e) {   // the eventfd: answers from other threads, or the stop
                uint64_t count;
                (void)!read(r->wake, &count, sizeof count);
                pthread_mutex_lock(&r->lock);
                struct ent *list = r->handed;
                r->handed = NULL;
                pthread_mutex_unlock(&r->lock);
                for (; list; list = list->handed) push(r, URING_CMD_COMMIT_AND_FETCH, list);
                if (__atomic_load_n(&state.stopping, __ATOMIC_ACQUIRE)) ended = 1;
                else push(r, 0, NULL);
            } else if (c.res == 0) {
                serve(r, e);
            } else {
                // The kernel has dropped the entry: the connection ended (unmount, abort), or
                // it refused it, and then another takes its place.
                __atomic_store_n(&e->unique, DEAD, __ATOMIC_RELEASE);
                if (c.res != -ENOTCONN && c.res != -ENODEV && c.res != -ECANCELED) {
                    if (!refused++) report("io_uring queue %d: the kernel refused a ring entry: %s", r->qid, strerror(-c.res));
                    if (refused < 64 && add_entry(r)) nudge(r);
                }
            }
            // Answers go out before the next request in this batch is served.
            if (r->unsubmitted && head != tail) submit(r, 0);
        }
    }
    // Answers still queued go out; later ones are committed by whoever gives them.
    pthread_mutex_lock(&r->lock);
    r->ended = 1;
    for (struct ent *list = r->handed; list; list = list->handed) push(r, URING_CMD_COMMIT_AND_FETCH, list);
    r->handed = NULL;
    submit(r, 0);
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/// A thread started while a ring thread serves inherits its CPU (libdispatch starts its
/// workers from whichever thread queues work): once a second this puts every other thread
/// found pinned to exactly one ring's CPU back on the daemon's CPUs.
static void *keep_affinity(void *unused) {
    (void)unused;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    uint64_t seen = UINT64_MAX;
    for (int i = 0; i < state.nrings; i++)   // each ring thread names itself first
        while (__atomic_load_n(&state.rings[i]->tid, __ATOMIC_ACQUIRE) == 0) sched_yield();
    while (__atomic_load_n(&state.keeping, __ATOMIC_ACQUIRE)) {
        struct timespec second = { 1, 0 };
        nanosleep(&second, NULL);
        uint64_t served = ubiquityfs_ring_served();
        if (served == seen) continue;   // nothing served, nothing started
        seen = served;
        DIR *tasks = opendir("/proc/self/task");
        if (!tasks) continue;
        struct dirent *d;
        while ((d = readdir(tasks))) {
            pid_t tid = (pid_t)atoi(d->d_name);
            int ring = 0;
            for (int i = 0; i < state.nrings && !ring; i++) ring = __atomic_load_n(&state.rings[i]->tid, __ATOMIC_RELAXED) == tid;
            cpu_set_t set;
            if (tid <= 0 || ring || sched_getaffinity(tid, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1) continue;
            char path[64], name[32] = "";
            snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
            FILE *comm = fopen(path, "r");
            if (comm) {
                if (!fgets(name, sizeof name, comm)) name[0] = 0;
                fclose(comm);
            }
            if (strncmp(name, NUDGER, 15) == 0) continue;   // comm keeps 15 characters
            for (int i = 0; i < state.nrings; i++)
                if (CPU_ISSET(state.rings[i]->qid, &set)) {
                    (void)sched_setaffinity(tid, sizeof state.cpus, &state.cpus);
                    break;
                }
        }
        closedir(tasks);
    }
    return NULL;
}

static int possible_cpus(void) {
    int cpus = 0;
    FILE *f = fopen("/sys/devices/system/cpu/possible", "r");
    char range[64] = "";
    if (f && fgets(range, sizeof range, f)) {
        char *dash = strrchr(range, '-'), *comma = strrchr(range, ',');
        char *last = dash && (!comma || dash > comma) ? dash + 1 : comma ? comma + 1 : range;
        cpus = (int)strtol(last, NULL, 10) + 1;
    }
    if (f) fclose(f);
    return cpus > 0 ? cpus : (int)sysconf(_SC_NPROCESSORS_CONF);
}

static struct ring *open_ring(int qid) {
    struct ring *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    struct uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = URING_SETUP_SQE128;
    r->qid = qid;
    r->fd = (int)syscall(__NR_io_uring_setup, RING_SQES, &p);
    r->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->fd < 0 || r->wake < 0) {
        report("requests go through /dev/fuse: %s: %s", r->fd < 0 ? "io_uring_setup" : "eventfd", strerror(errno));
        if (r->fd >= 0) close(r->fd);
        free(r);
        return NULL;
    }
    size_t sq_len = p.sq.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq.cqes + p.cq_entries * sizeof(struct uring_cqe);
    char *sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, URING_OFF_SQ_RING);
    char *cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, URING_OFF_CQ_RING);
    r->sqes = mmap(NULL, p.sq_entries * URING_SQE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, URING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED) {
        report("requests go through /dev/fuse: mapping an io_uring: %s", strerror(errno));
        close(r->fd);
        close(r->wake);
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->lock, NULL);
    r->sq_head = (unsigned *)(sq + p.sq.head);
    r->sq_tail = (unsigned *)(sq + p.sq.tail);
    r->sq_entries = p.sq_entries;
    r->sq_mask = (unsigned *)(sq + p.sq.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq.array);
    r->cq_head = (unsigned *)(cq + p.cq.head);
    r->cq_tail = (unsigned *)(cq + p.cq.tail);
    r->cq_mask = (unsigned *)(cq + p.cq.ring_mask);
    r->cqes = (struct uring_cqe *)(cq + p.cq.cqes);
    return r;
}

/// After INIT's answer (which took the kernel's io_uring offer) has reached the kernel: a
/// queue per possible CPU (the kernel uses the rings once every one has an entry), served by
/// `threads_per_cpu` threads, each with an entry of its own. Runs on a libfuse worker, whose
/// signals are blocked: the threads it starts begin so.
static void start_rings(void) {
    int cpus = possible_cpus(), threads = state.threads_per_cpu;
    struct ring **rings = calloc((size_t)cpus * (size_t)threads, sizeof *rings);
    if (!rings) return;
    sched_getaffinity(0, sizeof state.cpus, &state.cpus);
    // The workers first: the ring threads read how many there are.
    state.workers = calloc((size_t)cpus, sizeof *state.workers);
    for (int i = 0; state.workers && i < cpus; i++)
        if (pthread_create(&state.workers[i], NULL, work_main, NULL) == 0) state.nworkers = i + 1;
        else break;
    int n = 0, complete = 1;
    for (int q = 0; q < cpus && complete; q++)
        for (int t = 0; t < threads && complete; t++) {
            struct ring *r = open_ring(q);
            if (!r) { complete = 0; break; }
            if (!add_entry(r)) {
                report("requests go through /dev/fuse: no memory for ring entries");
                complete = 0;
                break;
            }
            push(r, 0, NULL);
            if (pthread_create(&r->thread, NULL, ring_main, r) != 0) {
                report("requests go through /dev/fuse: cannot start a ring thread");
                complete = 0;
                break;
            }
            rings[n++] = r;
        }
    state.rings = rings;
    __atomic_store_n(&state.nrings, n, __ATOMIC_RELEASE);
    if (!complete) return;   // the kernel keeps to /dev/fuse until every queue has an entry
    __atomic_store_n(&state.keeping, 1, __ATOMIC_RELEASE);
    if (pthread_create(&state.keeper, NULL, keep_affinity, NULL) != 0) state.keeping = 0;
    report("requests are served over io_uring: %d queues, %d threads each", cpus, threads);
}

void ubiquityfs_ring_stop(void) {
    __atomic_store_n(&state.stopping, 1, __ATOMIC_RELEASE);
    int n = __atomic_load_n(&state.nrings, __ATOMIC_ACQUIRE);
    uint64_t one = 1;
    for (int i = 0; i < n; i++) (void)!write(state.rings[i]->wake, &one, sizeof one);
    for (int i = 0; i < n; i++) pthread_join(state.rings[i]->thread, NULL);
    pthread_mutex_lock(&state.work_lock);
    pthread_cond_broadcast(&state.work_ready);
    pthread_mutex_unlock(&state.work_lock);
    for (int i = 0; i < state.nworkers; i++) pthread_join(state.workers[i], NULL);
    if (__atomic_exchange_n(&state.keeping, 0, __ATOMIC_ACQ_REL)) pthread_join(state.keeper, NULL);
}

// ---- the hooks ----------------------------------------------------------------------------------

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n > 0) take_request(buf, (size_t)n);
    return n;
}

/// INIT's answer (fuse_init_out: flags at 12, max_write at 20, max_pages at 28, flags2 at 32):
/// takes the kernel's offer of KILLPRIV_V2, and of io_uring when wanted. True when the rings
/// are to start once the answer is written.
static int answer_init(struct iovec *iov, int count) {
    uint64_t awaited = __atomic_load_n(&state.init_unique, __ATOMIC_ACQUIRE);
    if (awaited == 0 || count < 2 || iov[0].iov_len < OUT_HEADER || iov[1].iov_len < 16) return 0;
    const char *h = iov[0].iov_base;
    if (load64(h + 8) != awaited || (int32_t)load32(h + 4) != 0) return 0;
    __atomic_store_n(&state.init_unique, 0, __ATOMIC_RELEASE);
    char *out = iov[1].iov_base;
    uint32_t offered = __atomic_load_n(&state.offered, __ATOMIC_RELAXED);
    uint32_t flags = load32(out + 12) | (offered & KILLPRIV_V2);
    int rings = 0;
    if (state.threads_per_cpu > 0 && iov[1].iov_len >= 36 && (offered & URING_INIT_EXT)
        && (__atomic_load_n(&state.offered2, __ATOMIC_RELAXED) & URING_OVER_IO_URING)) {
        flags |= URING_INIT_EXT;
        store32(out + 32, load32(out + 32) | URING_OVER_IO_URING);
        size_t pages = (flags & MAX_PAGES_FLAG) ? (uint16_t)load32(out + 28) : 32;
        size_t payload = (size_t)load32(out + 20);
        if (payload < pages * state.page) payload = pages * state.page;
        if (payload < 8192) payload = 8192;
        state.payload = (payload + state.page - 1) / state.page * state.page;
        rings = 1;
    }
    store32(out + 12, flags);
    return rings;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    uint64_t unique = count > 0 && iov[0].iov_len >= OUT_HEADER ? load64((const char *)iov[0].iov_base + 8) : 0;
    int here;
    struct ent *e = entry_for(unique, &here);
    if (e) {
        fill(e, iov, count);
        ssize_t total = 0;
        for (int i = 0; i < count; i++) total += (ssize_t)iov[i].iov_len;
        if (here) e->answered = 1;
        else hand(e);
        return total;
    }
    int rings = answer_init(iov, count);
    ssize_t n = writev(fd, iov, count);
    if (rings && n >= 0) start_rings();
    return n;
}

static int read_all(int fd, char *to, size_t len) {
    while (len > 0) {
        ssize_t n = read(fd, to, len);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            if (n == 0) errno = EIO;
            return -1;
        }
        to += n;
        len -= (size_t)n;
    }
    return 0;
}

// A reply spliced from a pipe (a read answered from blob files): without this hook a session
// with custom I/O never splices. An answer to a ring's request is read out of the pipe into
// its entry (the kernel's copy from a pipe into the caller's pages is then a copy from there).
static ssize_t io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                              unsigned int flags, void *userdata) {
    (void)userdata;
    if (__atomic_load_n(&state.entries, __ATOMIC_ACQUIRE) == NULL || len < OUT_HEADER)
        return splice(fdin, offin, fdout, offout, len, flags);
    char header[OUT_HEADER];
    if (read_all(fdin, header, OUT_HEADER) != 0) return -1;
    int here;
    struct ent *e = entry_for(load64(header + 8), &here);
    size_t body = len - OUT_HEADER;
    char *to = e && body <= state.payload ? e->base + state.page : malloc(body ? body : 1);
    if (!to) { errno = ENOMEM; return -1; }
    int failed = read_all(fdin, to, body);
    ssize_t result = (ssize_t)len;
    if (e) {
        struct iovec iov[2] = { { header, OUT_HEADER }, { to, body } };
        if (to != e->base + state.page) {   // too big for the entry: fill makes it EIO
            fill(e, iov, 2);
            free(to);
        } else if (failed) {
            int32_t eio = -EIO;
            memcpy(header + 4, &eio, 4);
            fill(e, iov, 1);
        } else {
            fill(e, iov, 2);
        }
        if (here) e->answered = 1;
        else hand(e);
        return failed ? -1 : result;
    }
    // Not a ring's request (one the kernel sent before the rings were ready).
    if (!failed) {
        struct iovec iov[2] = { { header, OUT_HEADER }, { to, body } };
        result = writev(fdout, iov, 2);
    }
    free(to);
    return failed ? -1 : result;
}

int ubiquityfs_pipe_can_hold(int bytes) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return 0;
    int ok = fcntl(fds[0], F_SETPIPE_SZ, bytes) >= bytes;
    close(fds[0]);
    close(fds[1]);
    return ok;
}

int ubiquityfs_custom_io(struct fuse_session *se, const char *mountpoint, int threads_per_cpu,
                         ubiquityfs_log_fn log, void *context) {
    static const struct fuse_custom_io io = { io_writev, io_read, NULL, io_splice_send };
    state.se = se;
    state.mountpoint = mountpoint ? strdup(mountpoint) : NULL;
    state.page = (size_t)sysconf(_SC_PAGESIZE);
    state.fd = fuse_session_fd(se);
    state.threads_per_cpu = threads_per_cpu > 0 ? threads_per_cpu : 0;
    state.log = log;
    state.context = context;
    return fuse_session_custom_io(se, &io, state.fd);
}
