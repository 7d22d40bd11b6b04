//! Precise events by single-stepping: what one step retires (shared by both
//! stepping backends), which backend a host supports, and how a guest-debug
//! Debug exit is read. docs/profiling.md.

use kvm_bindings::kvm_debug_exit_arch;

use crate::lwp::cpuid::LwpFeatures;
use crate::lwp::memory::UserMemory;
use crate::lwp::record::EventId;
use crate::lwp::unit::LwpUnit;
use crate::vmm::vcpu::lwp_insn::{MAX_INSN_LEN, retired_branch};

/// How lwpvmm single-steps a CPL3 context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepBackend {
    /// KVM_GUESTDBG_SINGLESTEP: a Debug exit after every guest instruction.
    /// Ordinary KVM hosts.
    GuestDebug,
    /// RFLAGS.TF set by lwpvmm, the trap taken by the guest's #DB handler,
    /// which rings the #DB doorbell. Hosts like kvm_pvm, where KVM's
    /// single-step never exits for CPL3 code.
    TrapFlag,
}

impl StepBackend {
    /// The backend's name, as printed and recorded.
    pub fn name(self) -> &'static str {
        match self {
            StepBackend::GuestDebug => "guest-debug",
            StepBackend::TrapFlag => "trap-flag",
        }
    }
}

/// #DB.
const DB_VECTOR: u32 = 1;
/// DR6.BS: the #DB was a single step.
const DR6_BS: u64 = 1 << 14;

/// The address control reached after a guest-debug single step, or `None`
/// when the Debug exit is something else (a breakpoint, a debug register).
pub fn debug_exit_step(exit: &kvm_debug_exit_arch) -> Option<u64> {
    (exit.exception == DB_VECTOR && exit.dr6 & DR6_BS != 0).then_some(exit.pc)
}

/// Charges the instruction at `prev` that retired with control now at
/// `next`: one IRE, and one BRE when it is a branch (Data2 = the target,
/// EventFlags bit 0 = taken). The instruction's bytes are read as the CPL3
/// context would read them and decoded as code of `bitness`.
pub fn retire(
    unit: &mut LwpUnit,
    mem: &mut dyn UserMemory,
    bitness: u32,
    prev: u64,
    next: u64,
    tsc: u64,
) {
    unit.count(mem, EventId::Ire, 1, prev, tsc);
    if !unit.counts(LwpFeatures::BRE) {
        return;
    }
    let mut bytes = [0u8; MAX_INSN_LEN];
    let len = if mem.read_user(prev, &mut bytes).is_ok() {
        MAX_INSN_LEN
    } else {
        let in_page = (0x1000 - (prev & 0xfff)).min(MAX_INSN_LEN as u64) as usize;
        if mem.read_user(prev, &mut bytes[..in_page]).is_err() {
            return;
        }
        in_page
    };
    if let Some(b) = retired_branch(&bytes[..len], bitness, prev, next) {
        unit.retire_branch(mem, prev, b.target, b.taken, tsc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::lwp::flat::{FlatMemory, PAGE, PagePerm};
    use crate::lwp::lwpcb::LwpcbFixed;
    use crate::lwp::record::{BRANCH_TAKEN, EventRecord};
    use vm_memory::ByteValued;

    const CB: u64 = 0x1000;
    const RING: u64 = 0x10000;
    const CODE: u64 = 0x40_0000;

    fn rig() -> (LwpUnit, FlatMemory) {
        let mut unit = LwpUnit::new(LwpProfile::Precise.caps().unwrap());
        unit.write_cfg(0xC).unwrap();
        let mut mem = FlatMemory::new();
        mem.map(CB, PAGE, PagePerm::ReadWrite);
        mem.map(RING, 4096, PagePerm::ReadWrite);
        mem.map(CODE, PAGE, PagePerm::ReadOnly);
        // dec ecx; jnz -4 (back to the dec)
        mem.poke(CODE, &[0xff, 0xc9, 0x75, 0xfc]);
        let fixed = LwpcbFixed {
            flags: 0xC,
            buffer_size_random: 4096,
            buffer_base: RING,
            ..Default::default()
        };
        mem.poke(CB, fixed.as_slice());
        unit.llwpcb(&mut mem, CB).unwrap();
        (unit, mem)
    }

    fn records(mem: &FlatMemory, n: u64) -> Vec<EventRecord> {
        (0..n)
            .map(|i| {
                let mut r = EventRecord::default();
                mem.peek(RING + 32 * i, r.as_mut_slice());
                r
            })
            .collect()
    }

    /// Fabricated steps through `dec; jnz` (counters 0: the first
    /// instruction and the first branch record at once).
    #[test]
    fn steps_charge_ire_and_bre() {
        let (mut unit, mut mem) = rig();
        // (retired instruction, control now at)
        let steps = [
            (CODE, CODE + 2),
            (CODE + 2, CODE),
            (CODE, CODE + 2),
            (CODE + 2, CODE + 4),
        ];
        for (prev, next) in steps {
            retire(&mut unit, &mut mem, 64, prev, next, 0);
        }
        let recs = records(&mem, 2);
        assert_eq!((recs[0].event_id, recs[0].instruction_address), (2, CODE));
        let b = recs[1];
        assert_eq!(
            (b.event_id, b.instruction_address, b.data2),
            (3, CODE + 2, CODE)
        );
        assert_eq!(b.event_flags & BRANCH_TAKEN, BRANCH_TAKEN);
        assert_eq!(
            unit.stats().records_stored,
            2,
            "intervals of 15 after the first"
        );
    }

    #[test]
    fn debug_exits_read_as_steps_or_not() {
        // (exception, DR6, pc, step?)
        let table = [
            (1, DR6_BS, 0x1234, Some(0x1234)),
            (1, 0, 0x1234, None),
            (3, DR6_BS, 0x1234, None),
        ];
        for (exception, dr6, pc, want) in table {
            let exit = kvm_debug_exit_arch {
                exception,
                dr6,
                pc,
                ..Default::default()
            };
            assert_eq!(debug_exit_step(&exit), want);
        }
    }
}
