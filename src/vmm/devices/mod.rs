//! The devices part: what a guest reaches through ports and MMIO, apart
//! from the paravirtual doorbells the vCPUs answer. The port bus (serial,
//! PM, PIT channel 2, debug exit, the legacy ports), the IOAPIC, the ACPI
//! tables that describe them, and the virtio devices with their transport
//! and worker thread. It imports only from `base`; the vCPUs above route
//! their exits here.

pub mod acpi;
pub mod ioapic;
pub mod pit;
pub mod pm;
pub mod port_bus;
pub mod virtio;
