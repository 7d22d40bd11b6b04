/*
 * /lwp-net PORT: the network test's and benchmark's guest side, run by /init
 * when the command line says `lwpnet=PORT`. A TCP server on PORT (the
 * address comes from `ip=` on the command line): it accepts one
 * connection, reads until the host shuts its side down, answers
 * "lwp-net: received N bytes", waits for the host to close, and exits.
 * nolibc has no socket calls: they are raw system calls here.
 */
#include <linux/in.h>
#include <asm/socket.h>

/* From the C library's headers, which nolibc does not have. */
#define AF_INET 2
#define SOCK_STREAM 1

static unsigned char buf[65536];

static long sys(long nr, long a, long b, long c)
{
	return my_syscall3(nr, a, b, c);
}

int main(int argc, char **argv)
{
	unsigned int port = 0;
	const char *p = argc > 1 ? argv[1] : "";
	struct sockaddr_in addr;
	unsigned long long received = 0;
	char reply[64];
	long fd, conn, n;
	int one = 1;

	while (*p >= '0' && *p <= '9')
		port = port * 10 + (unsigned int)(*p++ - '0');
	fd = sys(__NR_socket, AF_INET, SOCK_STREAM, 0);
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_port = (unsigned short)(port >> 8 | (port & 0xff) << 8);
	my_syscall5(__NR_setsockopt, fd, SOL_SOCKET, SO_REUSEADDR, (long)&one, sizeof(one));
	if (fd < 0 || sys(__NR_bind, fd, (long)&addr, sizeof(addr)) < 0 ||
	    sys(__NR_listen, fd, 1, 0) < 0) {
		printf("lwp-net: cannot listen on port %u\n", port);
		return 1;
	}
	printf("lwp-net: listening on port %u\n", port);
	conn = sys(__NR_accept, fd, 0, 0);
	if (conn < 0) {
		printf("lwp-net: accept failed: %ld\n", conn);
		return 1;
	}
	while ((n = sys(__NR_read, conn, (long)buf, sizeof(buf))) > 0)
		received += n;
	strcpy(reply, "lwp-net: received ");
	strncat(reply, utoa(received), 32);
	strncat(reply, " bytes\n", 32);
	sys(__NR_write, conn, (long)reply, strlen(reply));
	/*
	 * The VM powers off when this returns: wait until the host has read
	 * the answer and closed (a read of 0), else the power-off can beat the
	 * answer's segment out of the guest and the host waits for nothing.
	 */
	sys(__NR_shutdown, conn, 1 /* SHUT_WR */, 0);
	while (sys(__NR_read, conn, (long)buf, sizeof(buf)) > 0)
		;
	sys(__NR_close, conn, 0, 0);
	printf("%s", reply);
	return 0;
}
