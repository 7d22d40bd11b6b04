//! The kind of access a guest-memory translation is for: who makes it
//! (CPL3 or supervisor) and what it does (load, store, fetch). The guard's
//! checks and its errors both name it, so it sits below them.

/// The kind of access a translation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// A CPL3 load (LWPCB reads).
    UserRead,
    /// A CPL3 store (LWPCB updates, ring records).
    UserWrite,
    /// A supervisor load (exception frames, paravirtual call areas).
    SupervisorRead,
    /// A supervisor store.
    SupervisorWrite,
    /// A CPL3 instruction fetch.
    UserFetch,
    /// A supervisor instruction fetch.
    SupervisorFetch,
}

impl Access {
    /// True for CPL3 accesses.
    pub fn is_user(self) -> bool {
        matches!(
            self,
            Access::UserRead | Access::UserWrite | Access::UserFetch
        )
    }

    /// True for stores.
    pub fn is_write(self) -> bool {
        matches!(self, Access::UserWrite | Access::SupervisorWrite)
    }

    /// True for instruction fetches.
    pub fn is_fetch(self) -> bool {
        matches!(self, Access::UserFetch | Access::SupervisorFetch)
    }
}
