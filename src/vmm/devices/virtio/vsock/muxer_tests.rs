//! The muxer on real Unix sockets in a scratch directory: the guest's
//! packets go in as headers and payloads, what it would receive comes out
//! of `to_guest`, and host processes are this test's sockets.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use super::*;

const GUEST: u64 = 3;
const GUEST_PORT: u32 = 49152;

struct Rig {
    dir: PathBuf,
    muxer: Muxer,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rig(name: &str) -> Rig {
    let dir = std::env::temp_dir().join(format!("lwpvmm-vsock-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let muxer = Muxer::new(GUEST, &dir.join("v.sock")).unwrap();
    Rig { dir, muxer }
}

/// A packet from the guest's `GUEST_PORT` to host port `port`.
fn from_guest(op: Op, port: u32, len: u32, flags: u32) -> Header {
    Header {
        src_cid: GUEST,
        dst_cid: HOST_CID,
        src_port: GUEST_PORT,
        dst_port: port,
        len,
        kind: TYPE_STREAM,
        op,
        flags,
        buf_alloc: 64 * 1024,
        fwd_cnt: 0,
    }
}

/// What the guest receives now: (op, ports, payload).
fn received(m: &mut Muxer) -> Vec<(Op, u32, u32, Vec<u8>)> {
    m.poll_host();
    let mut out = Vec::new();
    while let Some((h, n)) = m.to_guest(4096) {
        assert_eq!((h.src_cid, h.dst_cid, h.len as usize), (HOST_CID, GUEST, n));
        out.push((h.op, h.src_port, h.dst_port, m.payload(n).to_vec()));
    }
    out
}

fn ops(packets: &[(Op, u32, u32, Vec<u8>)]) -> Vec<Op> {
    packets.iter().map(|p| p.0).collect()
}

/// Polls until the muxer has something for the guest (a socket event may
/// take a moment to show).
fn wait_received(m: &mut Muxer) -> Vec<(Op, u32, u32, Vec<u8>)> {
    for _ in 0..200 {
        let got = received(m);
        if !got.is_empty() {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Vec::new()
}

#[test]
fn packets_that_name_no_connection_are_reset() {
    let mut r = rig("refused");
    // (the packet, what comes back)
    let other_cid = Header {
        src_cid: 7,
        ..from_guest(Op::Rw, 52, 0, 0)
    };
    let table: Vec<(Header, Vec<Op>)> = vec![
        // No host process listens on v.sock_52.
        (from_guest(Op::Request, 52, 0, 0), vec![Op::Rst]),
        (from_guest(Op::Rw, 52, 0, 0), vec![Op::Rst]),
        (from_guest(Op::Response, 52, 0, 0), vec![Op::Rst]),
        (from_guest(Op::CreditRequest, 52, 0, 0), vec![Op::Rst]),
        (from_guest(Op::Shutdown, 52, 0, 3), vec![Op::Rst]),
        (from_guest(Op::Rst, 52, 0, 0), vec![]),
        // Not this guest's CID.
        (other_cid, vec![Op::Rst]),
    ];
    for (h, want) in table {
        r.muxer.from_guest(&h, &[]);
        assert_eq!(ops(&received(&mut r.muxer)), want, "{h:?}");
    }
    assert!(r.muxer.counts.refused >= 5);
}

#[test]
fn a_guest_connection_reaches_the_hosts_socket_of_its_port() {
    let mut r = rig("guest");
    let host = UnixListener::bind(r.dir.join("v.sock_52")).unwrap();
    let m = &mut r.muxer;
    m.from_guest(&from_guest(Op::Request, 52, 0, 0), &[]);
    assert_eq!(ops(&received(m)), vec![Op::Response]);
    let (mut peer, _) = host.accept().unwrap();
    m.from_guest(&from_guest(Op::Rw, 52, 5, 0), b"hello");
    let mut got = [0u8; 5];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");
    peer.write_all(b"back").unwrap();
    let answer = wait_received(m);
    assert_eq!(answer, vec![(Op::Rw, 52, GUEST_PORT, b"back".to_vec())]);
    // The host process ends its side: the guest hears it will send no more.
    peer.shutdown(std::net::Shutdown::Write).unwrap();
    let end = wait_received(m);
    assert_eq!(end.first().map(|p| p.0), Some(Op::Shutdown));
    // A credit request is answered; the guest's full shutdown is reset.
    m.from_guest(&from_guest(Op::CreditRequest, 52, 0, 0), &[]);
    assert_eq!(ops(&received(m)), vec![Op::CreditUpdate]);
    m.from_guest(
        &from_guest(Op::Shutdown, 52, 0, SHUTDOWN_RCV | SHUTDOWN_SEND),
        &[],
    );
    assert_eq!(ops(&received(m)), vec![Op::Rst]);
    let mut rest = Vec::new();
    peer.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

#[test]
fn a_host_process_connects_with_a_connect_line() {
    let mut r = rig("host");
    let sock = r.dir.join("v.sock");
    let mut client = UnixStream::connect(&sock).unwrap();
    client.write_all(b"CONNECT 5000\n").unwrap();
    let request = wait_received(&mut r.muxer);
    assert_eq!(ops(&request), vec![Op::Request]);
    let (local, port) = (request[0].1, request[0].2);
    assert_eq!((local, port), (FIRST_LOCAL_PORT, 5000));
    let response = Header {
        src_port: 5000,
        dst_port: local,
        ..from_guest(Op::Response, 0, 0, 0)
    };
    r.muxer.from_guest(&response, &[]);
    let mut line = [0u8; 14];
    client.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"OK 1073741824\n");
    client.write_all(b"x").unwrap();
    let data = wait_received(&mut r.muxer);
    assert_eq!(data, vec![(Op::Rw, local, 5000, b"x".to_vec())]);

    // (what a client sends, whether the muxer asks the guest)
    let lines: [(&[u8], bool); 4] = [
        (b"CONNECT 52\n", true),
        (b"CONNECT\n", false),
        (b"connect 52\n", false),
        (b"CONNECT 99999999999999999999999999999999\n", false),
    ];
    for (text, asks) in lines {
        let mut c = UnixStream::connect(&sock).unwrap();
        c.write_all(text).unwrap();
        let got = wait_received(&mut r.muxer);
        assert_eq!(ops(&got) == vec![Op::Request], asks, "{text:?}: {got:?}");
        if !asks {
            // Refused: the client is closed (a reset, when the muxer left
            // bytes of its line unread).
            let mut rest = Vec::new();
            match c.read_to_end(&mut rest) {
                Ok(_) => assert!(rest.is_empty(), "{text:?}: {rest:?}"),
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{text:?}"),
            }
        }
    }
}

#[test]
fn a_guest_past_its_credit_is_reset_and_the_host_is_read_only_within_the_guests() {
    let mut r = rig("credit");
    let host = UnixListener::bind(r.dir.join("v.sock_52")).unwrap();
    let m = &mut r.muxer;
    // The guest offers 3 bytes of buffer.
    let tiny = Header {
        buf_alloc: 3,
        ..from_guest(Op::Request, 52, 0, 0)
    };
    m.from_guest(&tiny, &[]);
    assert_eq!(ops(&received(m)), vec![Op::Response]);
    let (mut peer, _) = host.accept().unwrap();
    peer.write_all(b"abcdef").unwrap();
    assert_eq!(
        wait_received(m),
        vec![(Op::Rw, 52, GUEST_PORT, b"abc".to_vec())]
    );
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(received(m).is_empty(), "past the guest's credit");
    let more = Header {
        buf_alloc: 3,
        fwd_cnt: 3,
        ..from_guest(Op::CreditUpdate, 52, 0, 0)
    };
    m.from_guest(&more, &[]);
    assert_eq!(
        wait_received(m),
        vec![(Op::Rw, 52, GUEST_PORT, b"def".to_vec())]
    );

    // The host process reads nothing; the guest sends past what the
    // muxer advertised.
    let chunk = vec![7u8; MAX_PAYLOAD];
    let mut reset = false;
    for _ in 0..=(BUF_ALLOC as usize / MAX_PAYLOAD) + 64 {
        m.from_guest(&from_guest(Op::Rw, 52, chunk.len() as u32, 0), &chunk);
        if ops(&received(m)).contains(&Op::Rst) {
            reset = true;
            break;
        }
    }
    assert!(reset, "a guest past its credit is reset");
    assert!(m.counts.refused >= 1);
}
