/* A hostile virtio driver: it brings up lwpvmm's first device (a disk) and
 * posts malformed descriptor chains (out of RAM, looping, zero-length,
 * oversized, device-writes aimed at a device-readable buffer, an available
 * index past the queue), checking after each that the device answered as
 * documented (a status, or a chain returned with nothing written, or
 * DEVICE_NEEDS_RESET) and that memory it must not write is untouched; then
 * it resets the device and a well-formed request works again. With a second
 * device (a network device) it brings that up with no receive buffers and
 * spins `spin` TSC cycles while the host floods the tap. With `storm=1` it
 * does none of that: it lists one maximal read (32.5 MB) in every slot of a
 * 256-entry ring and posts the ring again whenever the device is through,
 * until the host stops it (the devices benchmark pauses it meanwhile). */
#include "lib.h"

#define MMIO 0xd0000000ull
#define R(dev, off) (*(volatile u32 *)(MMIO + (dev) * 0x1000ull + (off)))
#define QSIZE 16
/* Rings and buffers, in the identity-mapped first GiB. */
#define DESC 0x600000ull
#define AVAIL 0x601000ull
#define USED 0x602000ull
#define HDR 0x603000ull
#define DATA 0x604000ull
#define STATUS 0x606000ull
#define NET_DESC 0x610000ull
/* The storm's data buffer: one 128 KiB segment every data descriptor of
 * its chain points at. */
#define STORM_DATA 0x1000000ull
#define STORM_QSIZE 256

struct desc { u64 addr; u32 len; u16 flags, next; };
#define F_NEXT 1
#define F_WRITE 2

static volatile struct desc *const desc = (volatile struct desc *)DESC;
static volatile u16 *const avail = (volatile u16 *)AVAIL;
static volatile u16 *const used = (volatile u16 *)USED;
static u16 avail_idx;

static void bring_up_sized(u32 dev, u64 base, u32 queues, u32 qsize)
{
    R(dev, 0x70) = 0;
    R(dev, 0x70) = 1;
    R(dev, 0x70) = 3;
    R(dev, 0x24) = 1;
    R(dev, 0x20) = 1; /* VIRTIO_F_VERSION_1 */
    R(dev, 0x24) = 0;
    R(dev, 0x20) = 0;
    R(dev, 0x70) = 0xb;
    for (u32 q = 0; q < queues; q++) {
        u64 at = base + q * 0x4000ull;
        memset((void *)at, 0, 0x3000);
        R(dev, 0x30) = q;
        R(dev, 0x38) = qsize;
        R(dev, 0x80) = (u32)at;
        R(dev, 0x84) = 0;
        R(dev, 0x90) = (u32)(at + 0x1000);
        R(dev, 0x94) = 0;
        R(dev, 0xa0) = (u32)(at + 0x2000);
        R(dev, 0xa4) = 0;
        R(dev, 0x44) = 1;
    }
    R(dev, 0x70) = 0xf;
}

static void bring_up(u32 dev, u64 base, u32 queues)
{
    bring_up_sized(dev, base, queues, QSIZE);
}

static void set(int i, u64 addr, u32 len, u16 flags, u16 next)
{
    desc[i].addr = addr;
    desc[i].len = len;
    desc[i].flags = flags;
    desc[i].next = next;
}

/* Makes chain `head` available, notifies, and waits for the used ring to
 * move; the used entry's length, or ~0 when the device never answered. */
static u32 submit(u16 head)
{
    u16 before = used[1];
    avail[2 + avail_idx % QSIZE] = head;
    __asm__ volatile("" ::: "memory");
    avail[1] = ++avail_idx;
    R(0, 0x50) = 0;
    for (u64 spin = 0; spin < 2000000000ull; spin++) {
        if (used[1] != before) {
            volatile u32 *elem = (volatile u32 *)(USED + 4 + 8 * (before % QSIZE));
            return elem[1];
        }
    }
    return ~0u;
}

static void header(u32 type, u64 sector)
{
    volatile u32 *h = (volatile u32 *)HDR;
    h[0] = type;
    h[1] = 0;
    *(volatile u64 *)(HDR + 8) = sector;
    *(volatile u8 *)STATUS = 0xee;
}

/* The storm: every ring slot names the same maximal read, posted again as
 * soon as the device used them all. Never returns. */
static void storm(void)
{
    bring_up_sized(0, DESC, 1, STORM_QSIZE);
    header(0, 0);
    set(0, HDR, 16, F_NEXT, 1);
    for (int i = 1; i < STORM_QSIZE - 1; i++)
        set(i, STORM_DATA, 128 << 10, F_NEXT | F_WRITE, i + 1);
    set(STORM_QSIZE - 1, STATUS, 1, F_WRITE, 0);
    puts("# storm\n");
    for (;;) {
        u16 target = avail_idx + STORM_QSIZE;
        for (int i = 0; i < STORM_QSIZE; i++)
            avail[2 + i] = 0;
        __asm__ volatile("" ::: "memory");
        avail_idx = target;
        avail[1] = avail_idx;
        R(0, 0x50) = 0;
        while (used[1] != target)
            ;
    }
}

int main(void)
{
    u64 spin = cmdline_number("spin", 0);

    if (cmdline_number("storm", 0))
        storm();

    check_eq(R(0, 0), 0x74726976, "device 0: virtio-mmio magic");
    check_eq(R(0, 8), 2, "device 0: a block device");
    bring_up(0, DESC, 1);
    check_eq(R(0, 0x70), 0xf, "the block device runs");

    puts("# a header out of guest RAM\n");
    set(0, 0x300000000ull, 16, F_NEXT, 1);
    set(1, STATUS, 1, F_WRITE, 0);
    header(0, 0);
    check_eq(submit(0), 0, "returned with nothing written");

    puts("# a looping chain\n");
    set(0, HDR, 16, F_NEXT, 1);
    set(1, DATA, 512, F_NEXT, 0);
    check_eq(submit(0), 0, "returned with nothing written");

    puts("# a zero-length header\n");
    set(0, HDR, 0, F_NEXT, 1);
    set(1, STATUS, 1, F_WRITE, 0);
    check(submit(0) == 1 && *(volatile u8 *)STATUS == 1, "VIRTIO_BLK_S_IOERR");

    puts("# an oversized read\n");
    header(0, 0);
    set(0, HDR, 16, F_NEXT, 1);
    set(1, DATA, 0xfffff000u, F_NEXT | F_WRITE, 2);
    set(2, STATUS, 1, F_WRITE, 0);
    check_eq(submit(0), 0, "returned with nothing written");

    puts("# a read into a device-readable buffer\n");
    header(0, 0);
    memset((void *)DATA, 0x5a, 4096);
    set(0, HDR, 16, F_NEXT, 1);
    set(1, DATA, 4096, F_NEXT, 2);
    set(2, STATUS, 1, F_WRITE, 0);
    u32 len = submit(0);
    int intact = 1;
    for (u32 i = 0; i < 4096; i++)
        intact &= ((volatile u8 *)DATA)[i] == 0x5a;
    check(len == 1 && intact, "only the status is written; the buffer is untouched");

    puts("# an available index past the queue\n");
    avail_idx += 3 * QSIZE;
    avail[1] = avail_idx;
    R(0, 0x50) = 0;
    u64 t;
    for (t = 0; t < 2000000000ull && !(R(0, 0x70) & 0x40); t++)
        ;
    check(R(0, 0x70) & 0x40, "DEVICE_NEEDS_RESET");

    puts("# reset, and a well-formed request\n");
    avail_idx = 0;
    bring_up(0, DESC, 1);
    header(8, 0); /* VIRTIO_BLK_T_GET_ID */
    set(0, HDR, 16, F_NEXT, 1);
    set(1, DATA, 20, F_NEXT | F_WRITE, 2);
    set(2, STATUS, 1, F_WRITE, 0);
    check(submit(0) == 21 && *(volatile u8 *)STATUS == 0, "GET_ID answers");

    if (R(1, 0) == 0x74726976 && R(1, 8) == 1) {
        bring_up(1, NET_DESC, 2);
        check_eq(R(1, 0x70), 0xf, "the network device runs, with no receive buffers");
        puts("# flooding\n");
        u64 end = __builtin_ia32_rdtsc() + spin;
        while (__builtin_ia32_rdtsc() < end)
            ;
    }
    return done();
}
