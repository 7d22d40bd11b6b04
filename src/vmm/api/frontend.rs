//! The hook through which a front end (Firecracker's API, src/firecracker)
//! serves on the API's socket before the VM exists: it answers every
//! request until it has started a VM, and after that it may answer a
//! request first (its own endpoints, or its refusals of pre-boot requests)
//! and leaves the rest to lwpvmm's endpoints. It sits below the front end,
//! which implements it, so that the API imports nothing above it.

use std::sync::Arc;

use super::http::{Request, Response};
use super::routes::KernelSymbols;
use crate::profile::sysroot::Sysroot;
use crate::vmm::base::request::VmmHandle;

/// A VM a front end started: the handle the API drives it with, and what
/// names the frames of its profiles.
pub struct Started {
    /// The VM.
    pub vm: VmmHandle,
    /// The guest's files (its initramfs), when known.
    pub sysroot: Option<Arc<Sysroot>>,
    /// The guest kernel's symbols, when its image has them.
    pub kernel: Option<KernelSymbols>,
}

/// What a front end answers before the VM runs.
pub enum Before {
    /// This response; the VM is still not started.
    Now(Response),
    /// This response: the VM is started.
    Started(Response, Started),
}

/// A front end of the API.
pub trait Frontend: Send {
    /// Answers a request before any VM runs.
    fn before_start(&mut self, request: &Request) -> Before;
    /// Answers a request once the VM runs, or `None` to let lwpvmm's own
    /// endpoints answer it.
    fn after_start(&mut self, request: &Request, vm: &VmmHandle) -> Option<Response>;
}
