/* Never reached: the CPL0 hook ends the VM first. */
#include "lib.h"

int main(void)
{
    puts("unhandled: the MMIO write did not stop the VM\n");
    return 1;
}
