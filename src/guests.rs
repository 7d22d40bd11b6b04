//! lwpvmm's own guests, built from resources/guests by build.rs and embedded
//! in the binary: the demo, a minimal guest, and the integration-test guests.

include!(concat!(env!("OUT_DIR"), "/guests/guests.rs"));

/// The ELF image of the embedded guest `name`.
pub fn get(name: &str) -> Option<&'static [u8]> {
    ALL.iter().find(|(n, _)| *n == name).map(|(_, elf)| *elf)
}

/// The names of every embedded guest.
pub fn names() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|(n, _)| *n)
}
