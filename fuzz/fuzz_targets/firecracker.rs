//! Firecracker's API before the start, on bodies a client sends: the first
//! byte picks an endpoint of firecracker.yaml, the rest is its body. Every
//! request gets an answer (no panic), each a success or a client error (or
//! the 503 of a launch nobody serves), never a server's fault, and the
//! configuration it builds answers `GET /vm/config` with JSON.
#![no_main]

use std::sync::mpsc::channel;

use libfuzzer_sys::fuzz_target;
use lwpvmm::firecracker::frontend::FirecrackerApi;
use lwpvmm::firecracker::setup::Setup;
use lwpvmm::vmm::api::frontend::{Before, Frontend};
use lwpvmm::vmm::api::http::Request;

/// (method, path) of each endpoint a body goes to before the start.
const ENDPOINTS: [(&str, &str); 16] = [
    ("PUT", "/boot-source"),
    ("PUT", "/machine-config"),
    ("PATCH", "/machine-config"),
    ("PUT", "/drives/rootfs"),
    ("PATCH", "/drives/rootfs"),
    ("PUT", "/network-interfaces/eth0"),
    ("PUT", "/vsock"),
    ("PUT", "/logger"),
    ("PUT", "/metrics"),
    ("PUT", "/lwp"),
    ("PUT", "/actions"),
    ("PUT", "/snapshot/load"),
    ("PUT", "/mmds"),
    ("PUT", "/balloon"),
    ("PATCH", "/vm"),
    ("PUT", "/entropy"),
];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let (method, path) = ENDPOINTS[usize::from(pick) % ENDPOINTS.len()];
    // Nobody serves the launches: InstanceStart, a load, a logger or
    // metrics file are answered 503 instead of starting anything.
    let (launcher, launches) = channel();
    drop(launches);
    let mut api = FirecrackerApi::new(Setup::default(), "fuzz".into(), launcher);
    let request = |method: &str, path: &str, body: &[u8]| Request {
        method: method.into(),
        path: path.into(),
        query: None,
        body: body.to_vec(),
    };
    let status = match api.before_start(&request(method, path, body)) {
        Before::Now(r) => r.status,
        Before::Started(..) => panic!("started without a launcher"),
    };
    assert!(
        (200..300).contains(&status) || (400..500).contains(&status) || status == 503,
        "{method} {path}: {status}"
    );
    match api.before_start(&request("GET", "/vm/config", b"")) {
        Before::Now(r) => {
            assert_eq!(r.status, 200);
            assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_ok());
        }
        Before::Started(..) => panic!("a GET started the VM"),
    }
});
