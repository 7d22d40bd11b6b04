//! Profiles from the host side: the trace of every record the emulated LWP
//! units store, and the reports built from it.

pub mod report;
pub mod trace;
