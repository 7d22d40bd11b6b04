//! The pure core: a model of the AMD LWP architecture and the emulated LWP
//! unit. Nothing here touches KVM, files or clocks; guest memory is reached
//! only through the [`memory::UserMemory`] trait.

#![deny(missing_docs)]

pub mod cpuid;
pub mod fault;
pub mod flat;
pub mod lwpcb;
pub mod memory;
pub mod msr;
pub mod record;
pub mod unit;
pub mod xsave;
