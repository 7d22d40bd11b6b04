/* The smallest guest: prints one line and exits through port 0xf4 with the
 * value of `exit=` on the command line (0 by default). Used for start-up
 * benchmarks against QEMU and for the exit-status tests. */
#include "lib.h"

int main(void)
{
    puts("minimal guest: hello\n");
    return (int)cmdline_number("exit", 0);
}
