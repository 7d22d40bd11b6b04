//! The guard over guest memory. Every guest-linear address the emulated LWP
//! unit (or a paravirtual call) touches is translated through the guest's own
//! page tables, with the checks the CPU would make for that kind of access,
//! and the physical range is checked to lie in guest RAM, page by page, on
//! every access. Nothing here reads or writes host memory outside guest RAM,
//! and no guest input can make it panic or loop without bound.

#![deny(missing_docs)]

mod access;
mod error;
pub mod pagetable;
pub mod paging;
mod ram;
pub mod reserved;
mod view;

pub use access::Access;
pub use error::{GuardError, Level};
pub use paging::{Paging, PagingCaps, Translation};
pub use ram::GuestMemory;
pub use reserved::Vendor;
pub use view::GuestView;
