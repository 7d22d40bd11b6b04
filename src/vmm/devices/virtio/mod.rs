//! virtio devices over MMIO, the transport Firecracker gives microVMs: raw
//! disk images as virtio block devices, host taps as virtio network
//! devices, a vsock device with Firecracker's host side and an entropy
//! device fed from the host's getrandom. Each device has a 4 KiB register window in the MMIO hole, an
//! interrupt line (an irqfd on a GSI, which KVM delivers by the MSI route
//! the guest programmed into the IOAPIC, ioapic.rs) and one ioeventfd per
//! queue on its QueueNotify register, so a notification never leaves KVM
//! for a vCPU thread: the device thread (`worker`) takes it, under its own
//! seccomp filter. The guest learns of the devices from the kernel command
//! line (`virtio_mmio.device=4K@ADDR:IRQ`, which any Linux with
//! CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES reads) when its kernel names that
//! parameter, as the project's does, and from the DSDT otherwise, as a
//! distribution kernel finds them (boot/, docs/design.md).
//!
//! Everything a device reads from the guest (queue addresses, descriptor
//! chains, lengths) is hostile: queues and chains come from the
//! `virtio-queue` crate, whose accessors check every address against guest
//! RAM and bound every chain by the queue's size, and a request the device
//! cannot make sense of ends in a status or a device error, never a panic.

pub mod block;
pub mod bus;
pub mod device;
pub mod drain;
pub mod mmio;
pub mod net;
pub mod rate_limiter;
pub mod rng;
pub mod vsock;
pub mod worker;

pub use bus::{DeviceSnapshot, Slot, VirtioBus};
pub use device::{
    DeviceError, DeviceOverrides, DeviceSpec, DiskConfig, MAX_DEVICES, MMIO_BASE, NetConfig,
    VirtioError, WINDOW,
};
