//! The native supervisor mode of kvm_pvm hosts (docs/pv-abi.md, "Native
//! supervisor mode"; docs/linux-guest.md for what was measured): once MSR
//! 0x4b564d10 holds the guest-physical address of a per-vCPU page, the
//! host's KVM runs the guest's CPL0 code on the CPU (in hardware ring 3)
//! instead of in its instruction emulator. The host offers it when MSR
//! 0x4b564d11 reads "PVM"; ordinary KVM has neither MSR, and nothing here
//! runs there.

use kvm_bindings::{Msrs, kvm_msr_entry};
use kvm_ioctls::VcpuFd;
use thiserror::Error;
use vm_memory::{Bytes, GuestAddress};

use crate::guard::GuestMemory;
use crate::lwp::cpuid::CpuidEntry;

/// The per-vCPU page's address and the mode's flag bits.
pub const MSR_NATIVE: u32 = 0x4b56_4d10;
/// Reads [`SIGNATURE`] where the host has the mode.
pub const MSR_SIGNATURE: u32 = 0x4b56_4d11;
/// "PVM".
pub const SIGNATURE: u64 = 0x4d_5650;
/// Set in every host write of [`MSR_NATIVE`] (KVM_SET_MSRS refuses a value
/// without it).
pub const HOST_WRITE: u64 = 0x400;
/// Where the vCPUs' pages lie: the legacy video hole below the ACPI area,
/// guest RAM that the memory map gives the guest no use of.
pub const PAGES_START: u64 = 0xA_0000;
/// The end of that area (exclusive).
pub const PAGES_END: u64 = 0xE_0000;
/// The vCPUs native mode takes: one page each in the area.
pub const MAX_VCPUS: u8 = ((PAGES_END - PAGES_START) / 4096) as u8;

/// Where in each vCPU's page lwpvmm puts the VM's CPUID table for the
/// kernel (the host uses the first 16 bytes), which cannot read it with
/// CPUID in the mode: a header, then the entries.
pub const INFO_OFFSET: u64 = 0x100;
/// The header's first word: "LWPN".
pub const INFO_MAGIC: u32 = u32::from_le_bytes(*b"LWPN");
/// The layout's version.
pub const INFO_VERSION: u32 = 1;
/// Bytes of the header (magic, version, count, reserved) and of an entry
/// (leaf, subleaf, EAX, EBX, ECX, EDX, each a u32).
const INFO_HEADER: u64 = 16;
const INFO_ENTRY: u64 = 24;
// The table must lie after the host's `struct pvm_vif` (16 bytes).
const _: () = assert!(INFO_OFFSET >= 16);

/// The entries that fit in the page.
pub const INFO_CAPACITY: usize = ((4096 - INFO_OFFSET - INFO_HEADER) / INFO_ENTRY) as usize;

/// Why native mode could not be set up on a vCPU.
#[derive(Debug, Error)]
pub enum NativeError {
    /// KVM refused the MSR write.
    #[error("vCPU {vcpu}: KVM_SET_MSRS of the native supervisor page failed: {source}")]
    Set {
        /// The vCPU.
        vcpu: u8,
        /// Why.
        source: kvm_ioctls::Error,
    },
    /// The vCPU's CPUID table does not fit its page.
    #[error(
        "vCPU {vcpu}: its CPUID table has {entries} entries, more than the {INFO_CAPACITY} its native page holds"
    )]
    TableTooLarge {
        /// The vCPU.
        vcpu: u8,
        /// The table's entries.
        entries: usize,
    },
    /// The page could not be written.
    #[error("vCPU {vcpu}: writing its native page failed: {why}")]
    Page {
        /// The vCPU.
        vcpu: u8,
        /// Why.
        why: String,
    },
    /// KVM took none of the MSR.
    #[error("vCPU {vcpu}: KVM did not take the native supervisor page {value:#x}")]
    Refused {
        /// The vCPU.
        vcpu: u8,
        /// The value written.
        value: u64,
    },
}

/// The bytes of vCPU `index`'s CPUID table as its page holds it at
/// [`INFO_OFFSET`] (docs/pv-abi.md, "Native supervisor mode").
pub fn info_bytes(index: u8, table: &[CpuidEntry]) -> Result<Vec<u8>, NativeError> {
    if table.len() > INFO_CAPACITY {
        return Err(NativeError::TableTooLarge {
            vcpu: index,
            entries: table.len(),
        });
    }
    let count = u32::try_from(table.len()).unwrap_or(u32::MAX);
    let header = [INFO_MAGIC, INFO_VERSION, count, 0];
    let words = table
        .iter()
        .flat_map(|e| [e.leaf, e.subleaf, e.eax, e.ebx, e.ecx, e.edx]);
    Ok(header
        .into_iter()
        .chain(words)
        .flat_map(u32::to_le_bytes)
        .collect())
}

/// Writes vCPU `index`'s CPUID table into its page.
pub fn write_info(mem: &GuestMemory, index: u8, table: &[CpuidEntry]) -> Result<(), NativeError> {
    let page = page_of(index).ok_or(NativeError::Refused {
        vcpu: index,
        value: 0,
    })?;
    mem.write_slice(&info_bytes(index, table)?, GuestAddress(page + INFO_OFFSET))
        .map_err(|e| NativeError::Page {
            vcpu: index,
            why: e.to_string(),
        })
}

/// The page of vCPU `index`.
pub fn page_of(index: u8) -> Option<u64> {
    (index < MAX_VCPUS).then(|| PAGES_START + u64::from(index) * 4096)
}

/// The value of [`MSR_NATIVE`] that puts vCPU `index` in native mode, as
/// the host writes it.
pub fn host_value(index: u8) -> Option<u64> {
    page_of(index).map(|gpa| gpa | HOST_WRITE)
}

fn read(vcpu: &VcpuFd, index: u32) -> Option<u64> {
    let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
        index,
        ..Default::default()
    }])
    .ok()?;
    match vcpu.get_msrs(&mut msrs) {
        Ok(1) => msrs.as_slice().first().map(|e| e.data),
        _ => None,
    }
}

/// Whether the host's KVM offers native supervisor mode.
pub fn host_offers(vcpu: &VcpuFd) -> bool {
    read(vcpu, MSR_SIGNATURE) == Some(SIGNATURE)
}

/// The host's view of [`MSR_NATIVE`] (0 where the host has no such MSR),
/// for snapshots.
pub fn state(vcpu: &VcpuFd) -> u64 {
    read(vcpu, MSR_NATIVE).unwrap_or(0)
}

/// Writes `value` (a host view of [`MSR_NATIVE`], [`HOST_WRITE`] set) to
/// vCPU `index`, before it first runs.
pub fn set(vcpu: &VcpuFd, index: u8, value: u64) -> Result<(), NativeError> {
    let msrs = Msrs::from_entries(&[kvm_msr_entry {
        index: MSR_NATIVE,
        data: value,
        ..Default::default()
    }])
    .map_err(|_| NativeError::Refused { vcpu: index, value })?;
    match vcpu.set_msrs(&msrs) {
        Ok(1) => Ok(()),
        Ok(_) => Err(NativeError::Refused { vcpu: index, value }),
        Err(source) => Err(NativeError::Set {
            vcpu: index,
            source,
        }),
    }
}

/// Puts vCPU `index` in native mode with its page.
pub fn enable(vcpu: &VcpuFd, index: u8) -> Result<(), NativeError> {
    let value = host_value(index).ok_or(NativeError::Refused {
        vcpu: index,
        value: 0,
    })?;
    set(vcpu, index, value)
}

/// The host-view bits a saved [`MSR_NATIVE`] may carry besides its page:
/// [`HOST_WRITE`], and the state bit the host adds once the vCPU ran.
const SAVED_FLAGS: u64 = HOST_WRITE | 0x800;

/// Checks the [`MSR_NATIVE`] a snapshot saved for vCPU `index` (hostile
/// input): 0 (emulated), or that vCPU's own page with only host-view state
/// bits; never another page or a flag bit (bit 0 would make every guest
/// exception a shutdown).
pub fn check_saved(index: u8, value: u64) -> Result<(), String> {
    let page = value & !0xfff;
    if value == 0 || (Some(page) == page_of(index) && value & 0xfff & !SAVED_FLAGS == 0) {
        Ok(())
    } else {
        Err(format!(
            "vCPU {index}: MSR {MSR_NATIVE:#x} = {value:#x} is not its native supervisor page ({:#x})",
            page_of(index).unwrap_or(0)
        ))
    }
}

/// How often the control thread looks at each vCPU of a native guest.
pub const WATCH_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

/// A vCPU of a native guest that KVM_RUN no longer leaves on its own: the
/// host's native mode spins, with no exit, on a kernel page mapped without
/// U=1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stuck {
    /// Where it spins.
    pub rip: u64,
    /// The paging level whose entry keeps the page from user mode.
    pub level: crate::guard::Level,
}

/// What one vCPU's watch saw at the last look (each [`WATCH_PERIOD`]).
#[derive(Debug, Default)]
pub struct Watch {
    last: Option<u64>,
}

impl Watch {
    /// One look, at a watch kick: `rip` and what the guard says of a CPL3
    /// fetch there. The same RIP at two looks in a row, on a page only
    /// supervisor mode may use, is the spin; an RIP that moved, or a page
    /// user mode may fetch (a kernel waiting in HLT), is not.
    pub fn look(&mut self, rip: u64, fetch: Result<(), crate::guard::GuardError>) -> Option<Stuck> {
        let again = self.last.replace(rip) == Some(rip);
        match fetch {
            Err(crate::guard::GuardError::SupervisorOnly { level, .. }) if again => {
                Some(Stuck { rip, level })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::{Access, GuardError, Level};

    #[test]
    fn the_page_holds_the_cpuid_table_after_the_hosts_bytes() {
        let entry = |leaf| CpuidEntry {
            leaf,
            subleaf: 0,
            eax: 1,
            ebx: 2,
            ecx: 3,
            edx: 4,
        };
        let bytes = info_bytes(0, &[entry(0x4000_0100), entry(0x8000_001c)]).unwrap();
        let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(bytes.len(), 16 + 2 * 24);
        assert_eq!([word(0), word(1), word(2)], [INFO_MAGIC, 1, 2]);
        assert_eq!([word(10), word(11), word(15)], [0x8000_001c, 0, 4]);
        let too_many = vec![entry(0); INFO_CAPACITY + 1];
        assert!(matches!(
            info_bytes(3, &too_many),
            Err(NativeError::TableTooLarge { vcpu: 3, .. })
        ));
        assert!(info_bytes(3, &too_many[1..]).is_ok());
    }

    #[test]
    fn a_saved_msr_names_its_own_page_and_no_flag() {
        // (vCPU, saved value, accepted)
        let table = [
            (0, 0, true),
            (0, PAGES_START | HOST_WRITE, true),
            (0, PAGES_START | HOST_WRITE | 0x800, true),
            (1, (PAGES_START + 4096) | HOST_WRITE, true),
            (1, PAGES_START | HOST_WRITE, false),
            (0, PAGES_START | HOST_WRITE | 1, false),
            (0, 0x1234_5000 | HOST_WRITE, false),
            (MAX_VCPUS, PAGES_END | HOST_WRITE, false),
        ];
        for (index, value, ok) in table {
            assert_eq!(
                check_saved(index, value).is_ok(),
                ok,
                "vCPU {index} {value:#x}"
            );
        }
    }

    #[test]
    fn a_spin_is_the_same_rip_twice_on_a_supervisor_page() {
        let fetch = |supervisor_only: bool| {
            if supervisor_only {
                Err(GuardError::SupervisorOnly {
                    address: 0x10_0000,
                    level: Level::Pd,
                    access: Access::UserFetch,
                })
            } else {
                Ok(())
            }
        };
        // (RIPs looked at, the page supervisor-only, stuck at the end)
        let table: [(&[u64], bool, bool); 4] = [
            (&[0x10_0000], true, false),
            (&[0x10_0000, 0x10_0000], true, true),
            (&[0x10_0000, 0x10_0004], true, false),
            (&[0x10_0000, 0x10_0000], false, false),
        ];
        for (rips, supervisor_only, stuck) in table {
            let mut watch = Watch::default();
            let last = rips
                .iter()
                .map(|&rip| watch.look(rip, fetch(supervisor_only)))
                .last();
            assert_eq!(last.flatten().is_some(), stuck, "{rips:x?}");
        }
    }

    #[test]
    fn every_vcpu_gets_its_own_page_in_the_reserved_area() {
        // (vCPU, its page)
        let table = [
            (0, Some(PAGES_START)),
            (1, Some(PAGES_START + 4096)),
            (MAX_VCPUS - 1, Some(PAGES_END - 4096)),
            (MAX_VCPUS, None),
        ];
        for (index, page) in table {
            assert_eq!(page_of(index), page, "vCPU {index}");
        }
        assert_eq!(MAX_VCPUS, 64);
        assert_eq!(host_value(2), Some((PAGES_START + 0x2000) | HOST_WRITE));
    }
}
