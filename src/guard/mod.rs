//! The guard over guest memory. Every guest-linear address the emulated LWP
//! unit (or a paravirtual call) touches is translated through the guest's own
//! page tables, with the checks the CPU would make for that kind of access,
//! and the physical range is checked to lie in guest RAM, page by page, on
//! every access. Nothing here reads or writes host memory outside guest RAM,
//! and no guest input can make it panic or loop without bound.

#![deny(missing_docs)]

mod error;
pub mod pagetable;
pub mod paging;
mod ram;
pub mod reserved;
mod view;

pub use error::{GuardError, Level};
pub use paging::{Access, Paging, PagingCaps, Translation};
pub use reserved::Vendor;
pub use view::GuestView;

/// The guest memory type the VMM uses. Each region keeps a bitmap of the
/// pages lwpvmm itself wrote (vm-memory marks it on every write), which
/// diff snapshots merge with KVM's dirty log of the guest's own writes.
pub type GuestMemory = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;
