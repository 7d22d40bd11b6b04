//! The control API's request parser (the head and the body's framing) on
//! bytes a client sends, fed as the connection feeds it: every prefix the
//! reads could end at. Nothing may panic, a request taken has its body
//! within the limit, and a request whole in a prefix is the same request
//! in any longer one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lwpvmm::vmm::api::http::parse_request;

/// The Firecracker front end's default body limit (51200) would let most
/// inputs end before the body; a small one reaches the oversize path too.
const MAX_BODY: usize = 64;

fuzz_target!(|data: &[u8]| {
    let mut first = None;
    for end in 0..=data.len() {
        match parse_request(&data[..end], MAX_BODY) {
            Ok(Some(r)) => {
                assert!(r.body.len() <= MAX_BODY);
                let again = (
                    r.method.clone(),
                    r.path.clone(),
                    r.query.clone(),
                    r.body.clone(),
                );
                match &first {
                    None => first = Some(again),
                    Some(seen) => assert_eq!(seen, &again, "a longer read changed the request"),
                }
            }
            Ok(None) => assert!(first.is_none(), "a longer read undid a whole request"),
            Err(_) => return,
        }
    }
});
