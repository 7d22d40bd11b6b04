//! lwpvmm: a virtual machine monitor on KVM and the rust-vmm crates that gives
//! guests AMD Lightweight Profiling (LWP) on hosts without LWP hardware.
//!
//! The crate is layered so that the semantics can be tested without KVM:
//! - [`lwp`]: the LWP architecture model and the emulated LWP unit (pure);
//! - [`guard`]: every guest address the unit touches, translated through the
//!   guest's own page tables and checked against guest RAM;
//! - [`vmm`]: the KVM shell: VM, vCPU loop, CPUID, MSRs, boot, devices;
//! - [`profile`]: host-side traces of LWP records and reports from them;
//! - [`guests`]: lwpvmm's own guests, embedded;
//! - [`hostfs`]: every file opened by a name a user, a client or a guest
//!   gave (regular files only, bounded, no link out, outputs made fresh);
//! - [`cli`]: the user-facing commands;
//! - [`firecracker`]: Firecracker's command line and API, over the same VMM;
//! - [`log_sink`]: where the log lines go.

pub mod cli;
pub mod firecracker;
pub mod guard;
pub mod guests;
pub mod hostfs;
pub mod log_sink;
pub mod lwp;
pub mod profile;
pub mod vmm;
