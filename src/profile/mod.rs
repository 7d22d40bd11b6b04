//! Profiles from the host side: the trace of every record the emulated LWP
//! units store, with the call stack of the context it was stored for, and
//! the reports built from it.

pub mod capture;
pub mod objects;
pub mod pprof;
pub mod report;
pub mod stack;
pub mod sysroot;
pub mod trace;
