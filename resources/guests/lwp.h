/* The LWP control block and event record as LWP software declares them
 * (the emulated and precise profiles: EventOffset 128, six events). */
#ifndef LWPVMM_GUEST_LWP_H
#define LWPVMM_GUEST_LWP_H
#include "lib.h"

#define LWP_VAL  (1u << 1)
#define LWP_IRE  (1u << 2)
#define LWP_BRE  (1u << 3)
#define LWP_CNH  (1u << 5)
#define LWP_RNH  (1u << 6)
#define LWP_CONT (1u << 29)
#define LWP_PTSC (1u << 30)
#define LWP_INT  (1u << 31)

struct lwp_event { u32 interval, counter; };

struct lwpcb {
    u32 flags;
    u32 buffer_size;
    u64 buffer_base;
    u32 head;
    u32 reserved0;
    u64 missed;
    u32 threshold;
    u32 filters;
    u64 base_ip;
    u64 limit_ip;
    u64 reserved1;
    u32 tail;
    u32 reserved2;
    u64 software[2];
    u8 reserved3[40];
    struct lwp_event events[6];
};

struct lwp_record {
    u8 event_id;
    u8 core_id;
    u16 flags;
    u32 data1;
    u64 ip;
    u64 data2;
    u64 timestamp;
};

#endif
