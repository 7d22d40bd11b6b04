//! The vsock device's host side on the guest's packets: the input is a
//! sequence of packets (a 44-byte header, then as much payload as its
//! `len` says and the input has), each handed to the muxer, and after each
//! the receive path drained into buffers whose size the next input byte
//! picks. A host process listens on port 52, so connections get made;
//! nothing may panic or hang, and what the muxer hands the guest is always
//! a whole packet that fits its buffer.
#![no_main]

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use lwpvmm::vmm::devices::virtio::vsock::muxer::Muxer;
use lwpvmm::vmm::devices::virtio::vsock::packet::{HDR_LEN, Header};

/// The scratch directory, and the host process's listener on port 52.
fn dir() -> &'static (PathBuf, UnixListener) {
    static DIR: OnceLock<(PathBuf, UnixListener)> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("lwpvmm-fuzz-vsock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let listener = UnixListener::bind(dir.join("v.sock_52")).expect("port 52");
        listener.set_nonblocking(true).expect("non-blocking");
        (dir, listener)
    })
}

fuzz_target!(|data: &[u8]| {
    let (dir, listener) = dir();
    let path = dir.join("v.sock");
    let _ = std::fs::remove_file(&path);
    let mut muxer = Muxer::new(3, &path).expect("the muxer");
    let mut rest = data;
    while rest.len() >= HDR_LEN + 1 {
        let room = 64 + usize::from(rest[0]) * 64;
        let Ok(h) = Header::parse(&rest[1..]) else {
            rest = &rest[HDR_LEN + 1..];
            continue;
        };
        let body = &rest[HDR_LEN + 1..];
        let len = (h.len as usize).min(body.len());
        muxer.from_guest(&h, &body[..len]);
        rest = &body[len..];
        muxer.poll_host();
        for _ in 0..64 {
            let Some((out, n)) = muxer.to_guest(room) else {
                break;
            };
            assert_eq!(out.len as usize, n);
            assert!(n == 0 || HDR_LEN + n <= room, "a packet larger than its buffer");
            assert_eq!(muxer.payload(n).len(), n);
        }
        // Take the host side's connections, so the backlog stays open.
        while let Ok((mut s, _)) = listener.accept() {
            use std::io::Write;
            let _ = s.write_all(b"from the host");
        }
    }
});
