/* While the second CPU flips the ring page's present bit, every LWPINS
 * either stores its record into the ring (CF=0) or is counted as missed
 * (CF=1); nothing lands anywhere else. */
#include <x86intrin.h>
#include "lib.h"
#include "lwp.h"

#define W(i) (0x400000ull + (u64)(i) * 0x1000)
#define N 400

extern volatile u64 toggles_done, toggles_go;

int main(void)
{
    memset((void *)W(10), 0xa5, 0x1000);
    memset((void *)W(20), 0xa5, 0x1000);
    struct lwpcb *cb = (struct lwpcb *)W(8);
    memset(cb, 0, sizeof(*cb));
    cb->flags = LWP_CONT;
    cb->buffer_size = 4096;
    cb->buffer_base = W(9);
    __llwpcb(cb);
    toggles_go = 1;
    u32 stored = 0, missed = 0;
    for (u32 i = 0; i < N; i++) {
        if (__lwpins32(i, 0x5eed0000 | i, 0))
            missed++;
        else
            stored++;
    }
    for (u64 spins = 0; !toggles_done && spins < 4000000000ull; spins++)
        ;
    check(toggles_done, "the second CPU finished its toggles");
    __slwpcb();
    puts("pt_race: ");
    put_dec(stored);
    puts(" stored, ");
    put_dec(missed);
    puts(" missed\n");
    check_eq(stored + missed, N, "every record stored or missed");
    check_eq(cb->missed, missed, "MissedEvents counts exactly the dropped ones");
    const u8 *a = (const u8 *)W(10), *b = (const u8 *)W(20);
    int intact = 1;
    for (u32 i = 0; i < 0x1000; i++)
        intact &= a[i] == 0xa5 && b[i] == 0xa5;
    check(intact, "the pages next to the ring are untouched");
    const struct lwp_record *r = (const struct lwp_record *)W(9);
    int own = 1;
    for (u32 i = 0; i < 4096 / sizeof(*r); i++)
        own &= r[i].event_id == 0 || (r[i].event_id == 255 && (r[i].data1 >> 16) == 0x5eed);
    check(own, "the ring holds only this program's records");
    return done();
}
