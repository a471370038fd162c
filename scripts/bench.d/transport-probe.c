// A FUSE server of one file, for `scripts/bench transport`: it answers LOOKUP, GETATTR and
// GETXATTR (ENODATA) and little else, over /dev/fuse or over FUSE-over-io_uring, so that the
// suite can time a bare round trip through each transport on this machine. Not UbiquityFS code.
//
//   transport-probe dev|uring [--idle] MOUNTPOINT
//
// uring: one queue per CPU, each served by a thread pinned to its CPU (the kernel hands a
// request to the queue of the CPU it was made on). --idle runs those threads SCHED_IDLE: the
// CPU then counts as idle when the thread wakes the requester, which the scheduler then wakes
// where it slept instead of on the other CPU. Stays in the foreground; ends at unmount.
// The kernel's io_uring layouts (ABI 7.42) are the daemon's (Debian 12's headers predate them).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "../../Sources/CFuseIO/uring_abi.h"

#define MAX_WRITE (128 * 1024)
#define PAYLOAD (MAX_WRITE + 4096)
#define DEPTH 4

static int fuse_fd;
static int use_uring, idle_threads;

// Requests answered through the rings: the size of "served" (3), so the suite can tell that
// the rings, not /dev/fuse, carried its calls.
static unsigned long ring_served;

// ---- the file system: the root (1) holds "x" (2) and "served" (3) -------------------------------

static void fill_attr(uint64_t ino, struct fuse_attr *a) {
    memset(a, 0, sizeof *a);
    a->ino = ino;
    a->mode = ino == 1 ? (S_IFDIR | 0755) : (S_IFREG | 0644);
    a->nlink = ino == 1 ? 2 : 1;
    a->size = ino == 1 ? 0 : ino == 3 ? __atomic_load_n(&ring_served, __ATOMIC_RELAXED) : 5;
    a->blksize = 4096;
}

/// The reply to request `in` into `out`: its length, and the error in *err. `name` is a
/// LOOKUP's name.
static size_t serve(const struct fuse_in_header *in, const char *name, char *out, int *err) {
    *err = 0;
    switch (in->opcode) {
    case FUSE_LOOKUP: {
        uint64_t ino = strcmp(name, "x") == 0 ? 2 : strcmp(name, "served") == 0 ? 3 : 0;
        if (in->nodeid != 1 || ino == 0) { *err = -ENOENT; return 0; }
        struct fuse_entry_out *e = (struct fuse_entry_out *)out;
        memset(e, 0, sizeof *e);
        e->nodeid = ino;
        e->generation = 1;
        e->entry_valid = e->attr_valid = ino == 2 ? 10 : 0;
        fill_attr(ino, &e->attr);
        return sizeof *e;
    }
    case FUSE_GETATTR: {
        struct fuse_attr_out *a = (struct fuse_attr_out *)out;
        memset(a, 0, sizeof *a);
        a->attr_valid = in->nodeid == 3 ? 0 : 10;
        fill_attr(in->nodeid, &a->attr);
        return sizeof *a;
    }
    case FUSE_GETXATTR: *err = -ENODATA; return 0;
    case FUSE_OPENDIR: case FUSE_OPEN:
        memset(out, 0, sizeof(struct fuse_open_out));
        return sizeof(struct fuse_open_out);
    case FUSE_RELEASEDIR: case FUSE_RELEASE: case FUSE_FLUSH: return 0;
    case FUSE_STATFS: {
        struct fuse_statfs_out *s = (struct fuse_statfs_out *)out;
        memset(s, 0, sizeof *s);
        s->st.bsize = 4096;
        s->st.namelen = 255;
        return sizeof *s;
    }
    default: *err = -ENOSYS; return 0;
    }
}

static void be_idle(void) {
    struct sched_param none = { .sched_priority = 0 };
    if (idle_threads && sched_setscheduler(0, SCHED_IDLE, &none) != 0) perror("transport-probe: SCHED_IDLE");
}

// ---- /dev/fuse ----------------------------------------------------------------------------------

static void reply_dev(uint64_t unique, int err, const void *body, size_t len) {
    struct fuse_out_header h = { .len = (uint32_t)(sizeof h + len), .error = err, .unique = unique };
    struct iovec iov[2] = { { &h, sizeof h }, { (void *)body, len } };
    if (writev(fuse_fd, iov, len ? 2 : 1) < 0 && errno != ENOENT) perror("transport-probe: writev");
}

static void answer_init(const struct fuse_in_header *in, const struct fuse_init_in *init) {
    struct fuse_init_out o;
    memset(&o, 0, sizeof o);
    o.major = FUSE_KERNEL_VERSION;
    o.minor = FUSE_KERNEL_MINOR_VERSION;
    o.max_readahead = init->max_readahead;
    o.flags = FUSE_ASYNC_READ | FUSE_BIG_WRITES | FUSE_MAX_PAGES | URING_INIT_EXT;
    o.flags2 = use_uring ? URING_OVER_IO_URING : 0;
    o.max_background = 16;
    o.congestion_threshold = 12;
    o.max_write = MAX_WRITE;
    o.max_pages = MAX_WRITE / 4096;
    reply_dev(in->unique, 0, &o, sizeof o);
}

/// Serves /dev/fuse until unmounted: every request without io_uring; with it, forgets and
/// interrupts (which never go through the rings) and whatever comes before the rings are ready.
static void *dev_loop(void *unused) {
    (void)unused;
    be_idle();
    char *buf = malloc(PAYLOAD + 4096), out[4096];
    for (;;) {
        ssize_t n = read(fuse_fd, buf, PAYLOAD + 4096);
        if (n < 0) {
            if (errno == EINTR || errno == ENOENT || errno == EAGAIN) continue;
            exit(errno == ENODEV ? 0 : 1);   // ENODEV: unmounted
        }
        struct fuse_in_header *in = (struct fuse_in_header *)buf;
        switch (in->opcode) {
        case FUSE_INIT: answer_init(in, (struct fuse_init_in *)(in + 1)); continue;
        case FUSE_FORGET: case FUSE_BATCH_FORGET: case FUSE_INTERRUPT: continue;
        case FUSE_DESTROY: reply_dev(in->unique, 0, NULL, 0); exit(0);
        }
        int err;
        size_t len = serve(in, (const char *)(in + 1), out, &err);
        reply_dev(in->unique, err, out, len);
    }
    return NULL;
}

// ---- FUSE over io_uring -------------------------------------------------------------------------

struct queue {
    int qid, ring_fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    char *sqes;
    struct uring_cqe *cqes;
    struct uring_req_header *header[DEPTH];
    char *payload[DEPTH];
    struct iovec iov[DEPTH][2];
    unsigned pending;
};

/// Queues a REGISTER (entry `e`'s buffers, to be filled with a request) or a COMMIT_AND_FETCH
/// (entry `e`'s reply, then the next request).
static void push(struct queue *q, int e, uint32_t op, uint64_t commit_id) {
    unsigned tail = *q->sq_tail, slot = tail & *q->sq_mask;
    char *s = q->sqes + URING_SQE_SIZE * slot;
    memset(s, 0, URING_SQE_SIZE);
    s[0] = URING_OP_URING_CMD;
    memcpy(s + 4, &fuse_fd, 4);                      // fd
    memcpy(s + 8, &op, 4);                           // cmd_op
    if (op == URING_CMD_REGISTER) {
        uint64_t addr = (uint64_t)(uintptr_t)q->iov[e];
        uint32_t count = 2;
        memcpy(s + 16, &addr, 8);                    // addr: the header and payload iovecs
        memcpy(s + 24, &count, 4);
    }
    uint64_t data = (uint64_t)e;
    memcpy(s + 32, &data, 8);                        // user_data
    struct uring_cmd_req c = { .commit_id = commit_id, .qid = (uint16_t)q->qid };
    memcpy(s + 48, &c, sizeof c);                    // the command area of a 128-byte SQE
    q->sq_array[slot] = slot;
    __atomic_store_n(q->sq_tail, tail + 1, __ATOMIC_RELEASE);
    q->pending++;
}

static int setup_queue(struct queue *q) {
    struct uring_params p;
    memset(&p, 0, sizeof p);
    p.flags = URING_SETUP_SQE128;
    q->ring_fd = (int)syscall(__NR_io_uring_setup, DEPTH * 2, &p);
    if (q->ring_fd < 0) { perror("transport-probe: io_uring_setup"); return -1; }
    size_t sq_len = p.sq.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq.cqes + p.cq_entries * sizeof(struct uring_cqe);
    char *sq = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, q->ring_fd, 0);
    char *cq = mmap(NULL, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, q->ring_fd, URING_OFF_CQ_RING);
    q->sqes = mmap(NULL, p.sq_entries * URING_SQE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                   q->ring_fd, URING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || q->sqes == MAP_FAILED) { perror("transport-probe: mmap"); return -1; }
    q->sq_tail = (unsigned *)(sq + p.sq.tail);
    q->sq_mask = (unsigned *)(sq + p.sq.ring_mask);
    q->sq_array = (unsigned *)(sq + p.sq.array);
    q->cq_head = (unsigned *)(cq + p.cq.head);
    q->cq_tail = (unsigned *)(cq + p.cq.tail);
    q->cq_mask = (unsigned *)(cq + p.cq.ring_mask);
    q->cqes = (struct uring_cqe *)(cq + p.cq.cqes);
    for (int e = 0; e < DEPTH; e++) {
        q->header[e] = aligned_alloc(4096, 4096);
        q->payload[e] = aligned_alloc(4096, PAYLOAD);
        if (!q->header[e] || !q->payload[e]) return -1;
        memset(q->header[e], 0, 4096);
        q->iov[e][0] = (struct iovec){ q->header[e], sizeof(struct uring_req_header) };
        q->iov[e][1] = (struct iovec){ q->payload[e], PAYLOAD };
        push(q, e, URING_CMD_REGISTER, 0);
    }
    return 0;
}

static void *queue_loop(void *arg) {
    struct queue *q = arg;
    cpu_set_t cpu;
    CPU_ZERO(&cpu);
    CPU_SET(q->qid, &cpu);
    if (sched_setaffinity(0, sizeof cpu, &cpu) != 0) perror("transport-probe: sched_setaffinity");
    be_idle();
    if (setup_queue(q) != 0) exit(1);
    for (;;) {
        unsigned submit = q->pending;
        q->pending = 0;
        if (syscall(__NR_io_uring_enter, q->ring_fd, submit, 1, URING_ENTER_GETEVENTS, NULL, 0) < 0 && errno != EINTR) {
            perror("transport-probe: io_uring_enter");
            exit(1);
        }
        unsigned head = *q->cq_head, tail = __atomic_load_n(q->cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++) {
            struct uring_cqe *c = &q->cqes[head & *q->cq_mask];
            int e = (int)c->user_data;
            if (c->res != 0) {
                if (c->res == -ENOTCONN || c->res == -ENODEV) exit(0);   // unmounted
                fprintf(stderr, "transport-probe: queue %d: %s\n", q->qid, strerror(-c->res));
                exit(1);
            }
            __atomic_add_fetch(&ring_served, 1, __ATOMIC_RELAXED);
            struct uring_req_header *h = q->header[e];
            struct fuse_in_header in;
            memcpy(&in, h->in_out, sizeof in);
            // A request's own struct is in op_in, its variable part (a name) in the payload.
            char out[4096];
            int err;
            size_t len = serve(&in, q->payload[e], out, &err);
            memcpy(q->payload[e], out, len);
            struct fuse_out_header reply = { .len = (uint32_t)(sizeof reply + len), .error = err, .unique = in.unique };
            memcpy(h->in_out, &reply, sizeof reply);
            h->ent.payload_sz = (uint32_t)len;
            push(q, e, URING_CMD_COMMIT_AND_FETCH, h->ent.commit_id);
        }
        __atomic_store_n(q->cq_head, head, __ATOMIC_RELEASE);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int a = 1;
    if (argc < 3) goto usage;
    if (strcmp(argv[a], "dev") == 0) use_uring = 0;
    else if (strcmp(argv[a], "uring") == 0) use_uring = 1;
    else goto usage;
    a++;
    if (strcmp(argv[a], "--idle") == 0) { idle_threads = 1; a++; }
    if (a != argc - 1) goto usage;
    fuse_fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fuse_fd < 0) { perror("transport-probe: /dev/fuse"); return 1; }
    char opts[128];
    snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0,default_permissions", fuse_fd);
    if (mount("transport-probe", argv[a], "fuse.transport-probe", MS_NOSUID | MS_NODEV, opts) != 0) {
        perror("transport-probe: mount");
        return 1;
    }
    // INIT first, on /dev/fuse: the kernel takes the rings' registrations only after it.
    char buf[8192];
    for (;;) {
        ssize_t n = read(fuse_fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("transport-probe: read INIT");
            return 1;
        }
        struct fuse_in_header *in = (struct fuse_in_header *)buf;
        if (in->opcode == FUSE_INIT) { answer_init(in, (struct fuse_init_in *)(in + 1)); break; }
    }
    pthread_t thread;
    if (use_uring) {
        // The kernel uses the rings once every possible CPU's queue has an entry.
        long cpus = 0;
        FILE *possible = fopen("/sys/devices/system/cpu/possible", "r");
        char range[64] = "";
        if (possible && fgets(range, sizeof range, possible)) {
            char *dash = strrchr(range, '-');
            cpus = strtol(dash ? dash + 1 : range, NULL, 10) + 1;
        }
        if (possible) fclose(possible);
        if (cpus <= 0) cpus = sysconf(_SC_NPROCESSORS_CONF);
        for (long i = 0; i < cpus; i++) {
            struct queue *q = calloc(1, sizeof *q);
            q->qid = (int)i;
            pthread_create(&thread, NULL, queue_loop, q);
        }
    } else {
        for (int i = 0; i < 3; i++) pthread_create(&thread, NULL, dev_loop, NULL);
    }
    dev_loop(NULL);
    return 0;
usage:
    fprintf(stderr, "usage: transport-probe dev|uring [--idle] MOUNTPOINT\n");
    return 64;
}
