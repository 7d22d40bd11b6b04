/*
 * /lwp-vsock PORT [quiet]: the vsock test's and benchmark's guest side,
 * which /init starts in the background when the command line says
 * `lwpvsock=PORT`, and leaves running beside the self-test (quiet: its
 * lines would land inside the self-test's, whose printf writes a line in
 * pieces), or runs alone for `lwpvsockonly=PORT`. First it connects to the host (CID
 * 2) on port PORT+1 and says hello: with Firecracker's hybrid vsock, a
 * guest connection to host port P reaches the host's Unix socket
 * `uds_path_P`. Then it listens on PORT and serves the host's connections
 * one at a time: a connection's first byte chooses `e` (echo every byte
 * back until the host shuts its side down) or `s` (sink: read to the end,
 * then answer "lwp-vsock: received N bytes"). nolibc has no socket calls:
 * they are raw system calls here.
 */
/*
 * From <linux/vm_sockets.h> and the C library's headers, which nolibc does
 * not have (that header pulls in the C library's).
 */
#define AF_VSOCK 40
#define SOCK_STREAM 1
#define VMADDR_CID_ANY 0xffffffffu
#define VMADDR_CID_HOST 2u

struct sockaddr_vm {
	unsigned short svm_family;
	unsigned short svm_reserved1;
	unsigned int svm_port;
	unsigned int svm_cid;
	unsigned char svm_flags;
	unsigned char svm_zero[3];
};

static unsigned char buf[65536];
static int quiet;

static long sys(long nr, long a, long b, long c)
{
	return my_syscall3(nr, a, b, c);
}

static int write_all(long fd, const unsigned char *p, long n)
{
	while (n > 0) {
		long w = sys(__NR_write, fd, (long)p, n);

		if (w <= 0)
			return 0;
		p += w;
		n -= w;
	}
	return 1;
}

static void address(struct sockaddr_vm *addr, unsigned int cid, unsigned int port)
{
	memset(addr, 0, sizeof(*addr));
	addr->svm_family = AF_VSOCK;
	addr->svm_cid = cid;
	addr->svm_port = port;
}

static void hello(unsigned int port)
{
	static const char line[] = "lwp-vsock: hello from the guest\n";
	struct sockaddr_vm addr;
	long fd = sys(__NR_socket, AF_VSOCK, SOCK_STREAM, 0), r;

	address(&addr, VMADDR_CID_HOST, port);
	r = fd < 0 ? fd : sys(__NR_connect, fd, (long)&addr, sizeof(addr));
	if (quiet) {
		if (r >= 0)
			write_all(fd, (const unsigned char *)line, sizeof(line) - 1);
	} else if (r < 0 || !write_all(fd, (const unsigned char *)line, sizeof(line) - 1)) {
		printf("lwp-vsock: no host listener on port %u (%ld)\n", port, r);
	} else {
		printf("lwp-vsock: said hello to the host on port %u\n", port);
	}
	if (fd >= 0)
		sys(__NR_close, fd, 0, 0);
}

static void serve(long conn)
{
	unsigned long long received = 0;
	unsigned char mode = 0;
	char reply[64];
	long n;

	if (sys(__NR_read, conn, (long)&mode, 1) != 1)
		return;
	while ((n = sys(__NR_read, conn, (long)buf, sizeof(buf))) > 0) {
		received += n;
		if (mode == 'e' && !write_all(conn, buf, n))
			return;
	}
	if (mode == 's') {
		strcpy(reply, "lwp-vsock: received ");
		strncat(reply, utoa(received), 32);
		strncat(reply, " bytes\n", 32);
		write_all(conn, (const unsigned char *)reply, strlen(reply));
	}
}

int main(int argc, char **argv)
{
	unsigned int port = 0;
	const char *p = argc > 1 ? argv[1] : "";
	struct sockaddr_vm addr;
	long fd, conn;

	while (*p >= '0' && *p <= '9')
		port = port * 10 + (unsigned int)(*p++ - '0');
	quiet = argc > 2;
	hello(port + 1);
	fd = sys(__NR_socket, AF_VSOCK, SOCK_STREAM, 0);
	address(&addr, VMADDR_CID_ANY, port);
	if (fd < 0 || sys(__NR_bind, fd, (long)&addr, sizeof(addr)) < 0 ||
	    sys(__NR_listen, fd, 4, 0) < 0) {
		printf("lwp-vsock: cannot listen on port %u\n", port);
		return 1;
	}
	if (!quiet)
		printf("lwp-vsock: listening on port %u\n", port);
	for (;;) {
		conn = sys(__NR_accept, fd, 0, 0);
		if (conn < 0)
			continue;
		serve(conn);
		sys(__NR_close, conn, 0, 0);
	}
}
