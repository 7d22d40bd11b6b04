/* The smallest guest: prints one line and exits through port 0xf4 with 0.
 * Used to compare VMM start-up and exit against QEMU. */
#include "lib.h"

int main(void)
{
    puts("minimal guest: hello\n");
    return 0;
}
