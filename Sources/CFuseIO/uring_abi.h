// The kernel's FUSE-over-io_uring and io_uring layouts (FUSE ABI 7.42), written out because
// Debian 12's headers predate them; shared by the daemon (fuse_io.c) and the bench's transport
// probe. Structures only ever grow at the end.
#ifndef UBIQUITYFS_URING_ABI_H
#define UBIQUITYFS_URING_ABI_H
#include <stdint.h>

/// FUSE_OVER_IO_URING (1 << 41): bit 9 of INIT's flags2, which needs FUSE_INIT_EXT (1 << 30).
#define URING_INIT_EXT (1u << 30)
#define URING_OVER_IO_URING (1u << 9)
#define URING_CMD_REGISTER 1u
#define URING_CMD_COMMIT_AND_FETCH 2u
#define URING_OP_POLL_ADD 6
#define URING_OP_URING_CMD 46
#define URING_SETUP_SQE128 (1u << 10)
#define URING_ENTER_GETEVENTS 1u
#define URING_OFF_SQ_RING 0L
#define URING_OFF_CQ_RING 0x8000000L
#define URING_OFF_SQES 0x10000000L
#define URING_SQE_SIZE 128
/// Offsets in a submission entry, and of the command area of a 128-byte one.
#define URING_SQE_FD 4
#define URING_SQE_CMD_OP 8
#define URING_SQE_ADDR 16
#define URING_SQE_LEN 24
#define URING_SQE_OP_FLAGS 28
#define URING_SQE_USER_DATA 32
#define URING_SQE_CMD 48

struct uring_ent_in_out { uint64_t flags, commit_id; uint32_t payload_sz, padding; uint64_t reserved; };
/// A ring entry's header buffer: the request's fuse_in_header (the answer's fuse_out_header)
/// in in_out, its op struct in op_in; names and data go to the payload buffer.
struct uring_req_header { char in_out[128]; char op_in[128]; struct uring_ent_in_out ent; };
struct uring_cmd_req { uint64_t flags, commit_id; uint16_t qid; uint8_t padding[6]; };
struct uring_sq_offsets { uint32_t head, tail, ring_mask, ring_entries, flags, dropped, array, resv1; uint64_t user_addr; };
struct uring_cq_offsets { uint32_t head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1; uint64_t user_addr; };
struct uring_params {
    uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features, wq_fd, resv[3];
    struct uring_sq_offsets sq;
    struct uring_cq_offsets cq;
};
struct uring_cqe { uint64_t user_data; int32_t res; uint32_t flags; };
#endif
