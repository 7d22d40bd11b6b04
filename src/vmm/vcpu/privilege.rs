//! Privilege levels, defined once: the current privilege level (CPL) of a
//! vCPU is its SS.DPL, and the privilege of the context an exception frame
//! interrupted is the RPL of the frame's CS, accepted only when the frame is
//! one the CPU could have pushed. CS.DPL is not the CPL: a CPL3 program in
//! a DPL-0 conforming code segment has CS.DPL 0 (tests/cpl.rs shows which
//! register gives the true CPL on this host; docs/security.md).

use kvm_bindings::{kvm_segment, kvm_sregs};
use thiserror::Error;

use crate::guard::{Access, GuestView};
use crate::vmm::vcpu::lwp_insn::code_bitness;
use crate::vmm::vcpu::segment::segment;

/// A vCPU's current privilege level: SS.DPL, as KVM itself takes it on SVM
/// and VMX (the CPU keeps SS.DPL equal to the CPL).
pub fn cpl(sregs: &kvm_sregs) -> u8 {
    sregs.ss.dpl
}

/// True when the vCPU runs at CPL0.
pub fn is_kernel(sregs: &kvm_sregs) -> bool {
    cpl(sregs) == 0
}

/// True when the vCPU runs at CPL3.
pub fn is_user(sregs: &kvm_sregs) -> bool {
    cpl(sregs) == 3
}

/// Why an exception frame's CS and SS cannot be what the CPU pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FrameError {
    /// A selector wider than 16 bits.
    #[error("selector {0:#x} is not 16 bits")]
    Selector(u64),
    /// The saved CS.RPL and SS.RPL differ.
    #[error("CS.RPL {cs} and SS.RPL {ss} differ")]
    RplMismatch {
        /// CS.RPL.
        cs: u8,
        /// SS.RPL.
        ss: u8,
    },
    /// CS's descriptor cannot be read (LDT, past the GDT limit, unmapped).
    #[error("CS {0:#x} has no readable GDT descriptor")]
    Descriptor(u16),
    /// CS does not name a present code segment.
    #[error("CS {0:#x} is not a present code segment")]
    NotCode(u16),
    /// A non-conforming CS whose DPL is not its RPL, or a conforming one
    /// whose DPL is above its RPL.
    #[error("CS {selector:#x} has DPL {dpl}, which its RPL {rpl} cannot have")]
    DplMismatch {
        /// The selector.
        selector: u16,
        /// The descriptor's DPL.
        dpl: u8,
        /// The selector's RPL.
        rpl: u8,
    },
}

/// The context a 64-bit exception frame interrupted, as its code segment
/// gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameCode {
    /// Its privilege level: CS.RPL.
    pub cpl: u8,
    /// Its code size: 64 (CS.L), 32 or 16 (compatibility mode, CS.D).
    pub bitness: u32,
    /// Its code segment's base (used outside 64-bit mode).
    pub cs_base: u64,
}

/// The context a 64-bit exception frame interrupted (privilege CS.RPL),
/// after checking that the frame claims no more privilege than that context
/// had: CS.RPL equals SS.RPL, and CS names a present code segment whose DPL
/// equals the RPL (non-conforming) or is at most the RPL (conforming).
/// `gdt` is the vCPU's GDTR.
pub fn frame_privilege(
    view: &GuestView<'_>,
    sregs: &kvm_sregs,
    cs: u64,
    ss: u64,
) -> Result<FrameCode, FrameError> {
    let selector = u16::try_from(cs).map_err(|_| FrameError::Selector(cs))?;
    let ss = u16::try_from(ss).map_err(|_| FrameError::Selector(ss))?;
    let rpl = (selector & 3) as u8;
    if (ss & 3) as u8 != rpl {
        return Err(FrameError::RplMismatch {
            cs: rpl,
            ss: (ss & 3) as u8,
        });
    }
    let d = load_segment(view, sregs, selector).ok_or(FrameError::Descriptor(selector))?;
    const CODE: u8 = 0x8;
    const CONFORMING: u8 = 0x4;
    if d.present == 0 || d.s == 0 || d.type_ & CODE == 0 {
        return Err(FrameError::NotCode(selector));
    }
    let fits = if d.type_ & CONFORMING != 0 {
        d.dpl <= rpl
    } else {
        d.dpl == rpl
    };
    if !fits {
        return Err(FrameError::DplMismatch {
            selector,
            dpl: d.dpl,
            rpl,
        });
    }
    Ok(FrameCode {
        cpl: rpl,
        bitness: code_bitness(d.l, d.db),
        cs_base: d.base,
    })
}

/// The segment register a selector loads, read from the guest's GDT as
/// supervisor memory; `None` for an LDT selector or one past the limit.
pub fn load_segment(view: &GuestView<'_>, sregs: &kvm_sregs, selector: u16) -> Option<kvm_segment> {
    let index = u64::from(selector & !7);
    if selector & 4 != 0 || index + 7 > u64::from(sregs.gdt.limit) {
        return None;
    }
    let mut d = [0u8; 8];
    view.read(
        sregs.gdt.base.checked_add(index)?,
        &mut d,
        Access::SupervisorRead,
    )
    .ok()?;
    Some(segment(selector, u64::from_le_bytes(d)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lwp::cpuid::LwpProfile;
    use crate::vmm::vcpu::ops::VcpuOps;
    use crate::vmm::vcpu::testing::Rig;

    #[test]
    fn cpl_is_ss_dpl() {
        // (CS.DPL, SS.DPL, CPL): a conforming DPL-0 CS at CPL3 is CPL3
        let table = [(0, 0, 0), (3, 3, 3), (0, 3, 3)];
        for (cs, ss, want) in table {
            let mut s = kvm_sregs::default();
            s.cs.dpl = cs;
            s.ss.dpl = ss;
            assert_eq!(cpl(&s), want);
            assert_eq!(is_user(&s), want == 3);
            assert_eq!(is_kernel(&s), want == 0);
        }
    }

    #[test]
    fn frames_claim_no_more_than_their_context_had() {
        let r = Rig::new(LwpProfile::Off, None);
        let sregs = r.vcpu.sregs();
        let view = GuestView::new(&r.mem, r.vcpu.paging(&sregs).unwrap());
        // (CS, SS, result: CPL and code size) over the rig's GDT
        // (crate::vmm::vcpu::testing)
        type Case = (u64, u64, Result<(u8, u32), FrameError>);
        let table: [Case; 14] = [
            (0x08, 0x10, Ok((0, 64))),
            (0x43, 0x1b, Ok((3, 32))),
            (0x08, 0, Ok((0, 64))),
            (0x23, 0x1b, Ok((3, 64))),
            (0x53, 0x1b, Ok((3, 64))),
            (0x50, 0x10, Ok((0, 64))),
            (0x23, 0x10, Err(FrameError::RplMismatch { cs: 3, ss: 0 })),
            (0x08, 0x1b, Err(FrameError::RplMismatch { cs: 0, ss: 3 })),
            (
                0x0b,
                0x1b,
                Err(FrameError::DplMismatch {
                    selector: 0x0b,
                    dpl: 0,
                    rpl: 3,
                }),
            ),
            (
                0x20,
                0x18,
                Err(FrameError::DplMismatch {
                    selector: 0x20,
                    dpl: 3,
                    rpl: 0,
                }),
            ),
            (0x28, 0x10, Err(FrameError::NotCode(0x28))),
            (0x30, 0x10, Err(FrameError::NotCode(0x30))),
            (0x5b, 0x1b, Err(FrameError::Descriptor(0x5b))),
            (0x0c, 0x10, Err(FrameError::Descriptor(0x0c))),
        ];
        for (cs, ss, want) in table {
            assert_eq!(
                frame_privilege(&view, &sregs, cs, ss).map(|c| (c.cpl, c.bitness)),
                want,
                "CS {cs:#x} SS {ss:#x}"
            );
        }
        assert_eq!(
            frame_privilege(&view, &sregs, 0x1_0008, 0x10),
            Err(FrameError::Selector(0x1_0008))
        );
    }
}
