//! Firecracker's command line and API over lwpvmm's VMM, so that an
//! orchestrator that runs `firecracker` can run lwpvmm in its place
//! (README: "Running under a Firecracker orchestrator"):
//! - [`args`]: Firecracker's options;
//! - [`model`]: the bodies of its OpenAPI description;
//! - [`setup`]: the machine a client configures before it starts (pure);
//! - [`frontend`]: the endpoints, on lwpvmm's API thread;
//! - [`launch`]: what the main thread does for them (opens files, builds
//!   the VM).
//!
//! It sits beside [`crate::cli`], above [`crate::vmm`]: the API imports
//! nothing from here, and reaches it through
//! [`crate::vmm::api::frontend::Frontend`].

pub mod args;
pub mod frontend;
pub mod launch;
pub mod model;
pub mod run;
pub mod setup;
