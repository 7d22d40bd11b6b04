//! A bzImage's payload decompressed on the host (`lwpvmm run --kernel` of
//! a file a user names): locating it from the setup header, every format's
//! decoder and the framing lwpvmm reads itself (LZ4 legacy, lzop). Nothing
//! may panic, and nothing may grow past the size the image announces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lwpvmm::vmm::boot::payload::{MAX_KERNEL_BYTES, decompress};

fuzz_target!(|data: &[u8]| {
    if let Ok(kernel) = decompress(data) {
        assert!(kernel.bytes.len() as u64 <= MAX_KERNEL_BYTES);
    }
});
