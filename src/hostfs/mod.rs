//! Every file lwpvmm opens by a name that a user, an API client or a guest
//! gave it goes through here, so that one module decides what may be
//! opened (tests/hostfs.rs fails when another file of src opens a path):
//! - an input is a regular file: its type is checked by path before it is
//!   opened, so no FIFO or device is ever opened (a FIFO would block the
//!   opening thread, a device can act on being opened); it is opened
//!   without blocking and never as a controlling terminal, checked again on
//!   the descriptor (the same file, still regular) and read only up to a
//!   limit its caller states, refused before reading when it is larger;
//! - beneath a directory lwpvmm holds (a snapshot, a sysroot) no symbolic
//!   link is followed at any component ([`Dir`]);
//! - an output is created under a fresh name with `O_CREAT | O_EXCL |
//!   O_NOFOLLOW` beneath its directory's descriptor and renamed over its
//!   name, so a link or a special file planted there is replaced, never
//!   written through ([`Dir::create_new`], [`Rewrite`]); a stream (the
//!   console, the trace, the log) is never opened through a final symbolic
//!   link, never a device, and a FIFO only where its caller allows one and
//!   only with a reader ([`open_stream`]).
//!
//! A path the user names outside such a directory (`--kernel`, a drive's
//! `path_on_host`) may run through symbolic links, as any program's
//! argument does; what it ends at must still be a regular file.

mod dir;
mod input;
mod stream;

pub use dir::{Dir, NewFile, Rewrite, TempDir};
pub use input::{
    Access, DIR_WALK_FLAGS, HostFsError, INPUT_BELOW_FLAGS, INPUT_FLAGS, Input, Kind, check_input,
    is_dir, open_image, open_input, read_input,
};
pub use stream::{Fifo, StreamMode, open_stream};

#[cfg(test)]
mod tests;
