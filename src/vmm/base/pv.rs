//! The paravirtual interface between a guest and lwpvmm, defined once
//! (docs/pv-abi.md is its prose): the CPUID leaves that announce it and
//! their feature bits, the ports, the LWP state-call operations and
//! statuses, the power-port values, the 64-bit exception frame the
//! doorbells read, the saved-register frame (Linux's `pt_regs`) the register
//! calls read, the threshold lines, and the RFLAGS.CF reply protocol. Pure:
//! no KVM, no I/O.

use bitflags::bitflags;
use vm_memory::ByteValued;

/// First leaf of lwpvmm's hypervisor range.
pub const LEAF_PV_BASE: u32 = 0x4000_0100;
/// The paravirtual-interface leaf.
pub const LEAF_PV_INFO: u32 = 0x4000_0101;
/// The threshold-line leaf: EAX the first line's GSI, EBX how many lines.
pub const LEAF_PV_LINES: u32 = 0x4000_0102;
/// The GSI of vCPU 0's threshold line; vCPU `i` has `THRESHOLD_GSI + i`.
/// IOAPIC pins 16-23 (ioapic.rs): the legacy ones below are the serial
/// port's and the virtio devices'.
pub const THRESHOLD_GSI: u32 = 16;
/// How many vCPUs get a threshold line (the IOAPIC has 24 pins).
pub const THRESHOLD_LINES: u32 = 8;
/// Operation 6's RDI: bit 0 puts the vCPU's threshold interrupts on its
/// line.
pub const LINE_ON: u64 = 1;
/// Operation 6's RDI: bit 1 (with bit 0) answers the crossings of the
/// register calls' instructions in their replies (RDX = 1) instead.
pub const LINE_CROSSINGS_IN_REPLY: u64 = 2;
/// The signature in EBX, ECX, EDX of [`LEAF_PV_BASE`]: "LwpVmmLwpVmm".
pub const PV_SIGNATURE: [u32; 3] = [
    u32::from_le_bytes(*b"LwpV"),
    u32::from_le_bytes(*b"mmLw"),
    u32::from_le_bytes(*b"pVmm"),
];
/// The interface version.
pub const PV_ABI_VERSION: u32 = 1;

bitflags! {
    /// The features in EBX of [`LEAF_PV_INFO`].
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct PvFeatures: u32 {
        /// The #UD doorbell serves LWP instructions.
        const UD_DOORBELL = 1 << 0;
        /// The isa-debug-exit port ends the VM.
        const EXIT_PORT = 1 << 1;
        /// The LWP state calls (component 62 save and restore).
        const LWP_STATE = 1 << 2;
        /// The #DB doorbell, for precise events by single-stepping.
        const DB_DOORBELL = 1 << 3;
        /// The power port.
        const POWER = 1 << 4;
        /// The register calls: the #UD and #DB doorbells' work, for a
        /// saved-register frame at a guest address (state-call operations
        /// 4 and 5), so that a handler can call from anywhere in it.
        const REGS_CALLS = 1 << 5;
        /// Threshold interrupts on a per-vCPU IOAPIC line
        /// ([`LEAF_PV_LINES`], state-call operation 6).
        const THRESHOLD_LINES = 1 << 6;
        /// The guest names the executable mappings of an address space
        /// (state-call operation 9), for the host-side trace.
        const EXEC_MAPPINGS = 1 << 7;
        /// The restore call (state-call operation 2) checks the image's
        /// LWPCB but walks no ring page: a bad ring page shows at its
        /// first store, and a switch costs the same for any ring size.
        /// Without this bit, a restore also refused a ring that faults.
        const RESTORE_RING_AT_STORE = 1 << 8;
    }
}

/// The debug port of `--snapshot-on-port` (off by default): a write asks
/// for a snapshot at that exact point. For tests; not announced in CPUID.
pub const SNAPSHOT_PORT: u16 = 0x5a;
/// The port the guest's #DB handler writes to (its first instruction).
pub const DB_PORT: u16 = 0x5b;
/// The port the guest's #UD handler writes to (its first instruction).
pub const UD_PORT: u16 = 0x5c;
/// The port of the LWP state calls.
pub const STATE_PORT: u16 = 0x5d;
/// The power port: how a guest without ACPI powers off.
pub const POWER_PORT: u16 = 0x5e;
/// QEMU's isa-debug-exit port.
pub const EXIT_PORT: u16 = 0xf4;

/// RFLAGS.CF: the doorbells' reply, and LWPINS's result.
pub const RFLAGS_CF: u64 = 1 << 0;
/// RFLAGS.TF: the trap flag lwpvmm steps with.
pub const RFLAGS_TF: u64 = 1 << 8;

/// What a doorbell answers in the handler's RFLAGS.CF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    /// CF clear: done, the handler returns with IRETQ.
    Handled,
    /// CF set: not lwpvmm's; the guest's own handling runs.
    NotOurs,
}

impl Reply {
    /// The handler's RFLAGS with this reply.
    pub fn apply(self, rflags: u64) -> u64 {
        match self {
            Reply::Handled => rflags & !RFLAGS_CF,
            Reply::NotOurs => rflags | RFLAGS_CF,
        }
    }
}

/// An LWP state call's operation (AL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateOp {
    /// Save component 62 into the area at RDI.
    Save = 1,
    /// Restore component 62 from the area at RDI.
    Restore = 2,
    /// The guest reports single-step traps: its #DB handler starts with
    /// the #DB doorbell, or makes operation 5.
    DeclareDb = 3,
    /// The #UD doorbell's work for the saved-register frame at RDI.
    UdRegs = 4,
    /// The #DB doorbell's work for the saved-register frame at RDI.
    DbRegs = 5,
    /// This vCPU's threshold interrupts go to its line (RDI = 1) or are
    /// MSIs again (RDI = 0).
    ThresholdLine = 6,
    /// A task switches out: save into the area at RDI (as [`Save`]; RSI = 1
    /// skips the flush into the LWPCB, for a task whose address space is
    /// going away), turn LWP off, and stop stepping; RDX returns where
    /// stepping stood (the step origin, 0 for none).
    ///
    /// [`Save`]: StateOp::Save
    SwitchOut = 7,
    /// A task switches in: restore from the area at RDI (as [`Restore`]),
    /// and resume stepping at the origin in RSI (0: none) when the context
    /// is live; RDX returns 1 when stepping resumed.
    ///
    /// [`Restore`]: StateOp::Restore
    SwitchIn = 8,
    /// An executable mapping of the calling context's address space, the
    /// [`ExecMapping`] at RDI: it goes to the host-side trace, so that
    /// reports name each process's frames with its own files.
    ExecMapping = 9,
}

impl TryFrom<u8> for StateOp {
    type Error = u8;

    fn try_from(op: u8) -> Result<Self, u8> {
        match op {
            1 => Ok(StateOp::Save),
            2 => Ok(StateOp::Restore),
            3 => Ok(StateOp::DeclareDb),
            4 => Ok(StateOp::UdRegs),
            5 => Ok(StateOp::DbRegs),
            6 => Ok(StateOp::ThresholdLine),
            7 => Ok(StateOp::SwitchOut),
            8 => Ok(StateOp::SwitchIn),
            9 => Ok(StateOp::ExecMapping),
            other => Err(other),
        }
    }
}

/// The status an LWP state call returns in RAX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateStatus {
    /// Done.
    Ok = 0,
    /// The VM has no LWP.
    NoLwp = 1,
    /// The area cannot be read or written as supervisor memory.
    BadArea = 2,
    /// The image was refused (invalid, or its LWPCB or ring faults); LWP is
    /// now off. RDX holds the fault's vector, RCX the #PF address.
    Refused = 3,
    /// Unknown operation, or called from outside CPL0.
    BadCall = 4,
    /// A register call: not an LWP instruction, or not a step of lwpvmm's;
    /// the frame is untouched and the guest's own handling applies.
    NotOurs = 5,
    /// A register call: the LWP instruction raises a fault, which the guest
    /// delivers to the context (RDX the vector, RCX the #PF address, R8 the
    /// #PF error code); the frame is untouched.
    Fault = 6,
    /// Operation 6 on a vCPU that has no threshold line.
    NoLine = 7,
}

/// A value written to the power port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerOp {
    /// Power off: `lwpvmm run` exits 0.
    Off = 0,
    /// Reboot: the VM ends, `lwpvmm run` exits 4.
    Reboot = 1,
    /// Halt until an interrupt: the vCPU sleeps in KVM (its MP state set
    /// to halted) until one is pending, as HLT would; for a kernel in
    /// native supervisor mode, where HLT does not sleep.
    Halt = 2,
}

impl TryFrom<u8> for PowerOp {
    type Error = u8;

    fn try_from(value: u8) -> Result<Self, u8> {
        match value {
            0 => Ok(PowerOp::Off),
            1 => Ok(PowerOp::Reboot),
            2 => Ok(PowerOp::Halt),
            other => Err(other),
        }
    }
}

/// The bytes of a 64-bit exception frame without an error code.
pub const FRAME_SIZE: u64 = 40;

/// A 64-bit exception frame without an error code, as the CPU pushes it
/// for #UD and #DB: what the doorbells find at RSP.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Frame {
    /// The interrupted instruction (a fault) or the next one (a trap).
    pub rip: u64,
    /// The interrupted context's CS.
    pub cs: u64,
    /// Its RFLAGS.
    pub rflags: u64,
    /// Its RSP.
    pub rsp: u64,
    /// Its SS.
    pub ss: u64,
}

// SAFETY: Frame is repr(C) and made only of u64 fields, so it has no padding
// and every byte pattern is a valid value.
unsafe impl ByteValued for Frame {}

/// The longest path an [`ExecMapping`] holds, with its NUL.
pub const MAPPING_PATH_MAX: usize = 256;
/// The longest build ID an [`ExecMapping`] holds (a GNU build ID is 20
/// bytes: SHA-1).
pub const BUILD_ID_MAX: usize = 20;
/// [`ExecMapping::flags`]: the first mapping of a report; the address
/// space's earlier mappings are forgotten.
pub const MAPPING_FIRST: u32 = 1 << 0;
/// [`ExecMapping::flags`]: [`ExecMapping::pid`] is the process's, and a
/// [`MappingProcess`] follows the mapping at RDI + 312. A module older than
/// the bit sends neither, and its mappings name no process.
pub const MAPPING_PROCESS: u32 = 1 << 1;
/// The longest process name a [`MappingProcess`] holds, with its NUL
/// (Linux's TASK_COMM_LEN).
pub const PROCESS_NAME_MAX: usize = 16;

/// An executable file mapping of an address space, as state-call
/// operation 9 reads it at RDI (312 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecMapping {
    /// Its first address.
    pub start: u64,
    /// The address past its last.
    pub end: u64,
    /// The file offset mapped at `start`.
    pub offset: u64,
    /// How many bytes of `build_id` are the file's build ID (0: none).
    pub build_id_len: u32,
    /// [`MAPPING_FIRST`], [`MAPPING_PROCESS`].
    pub flags: u32,
    /// The ELF build ID (NT_GNU_BUILD_ID).
    pub build_id: [u8; BUILD_ID_MAX],
    /// With [`MAPPING_PROCESS`], the process's id (Linux's tgid); else
    /// zero.
    pub pid: u32,
    /// The file's path in the guest, NUL-terminated.
    pub path: [u8; MAPPING_PATH_MAX],
}

impl Default for ExecMapping {
    fn default() -> Self {
        ExecMapping {
            start: 0,
            end: 0,
            offset: 0,
            build_id_len: 0,
            flags: 0,
            build_id: [0; BUILD_ID_MAX],
            pid: 0,
            path: [0; MAPPING_PATH_MAX],
        }
    }
}

// SAFETY: ExecMapping is repr(C) with u64 fields first, then two u32s, a
// 20-byte array, a u32 (at offset 52, 4-aligned) and a 256-byte array, so
// it has no padding (312 bytes, 8-byte aligned at its end), and every byte
// pattern is a valid value.
unsafe impl ByteValued for ExecMapping {}

/// What follows an [`ExecMapping`] with [`MAPPING_PROCESS`]: the name of
/// the process the mapping belongs to.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MappingProcess {
    /// The process's name (Linux's `comm`), NUL-terminated unless it fills
    /// the array.
    pub name: [u8; PROCESS_NAME_MAX],
}

// SAFETY: MappingProcess is repr(C) and one byte array, so it has no
// padding and every byte pattern is a valid value.
unsafe impl ByteValued for MappingProcess {}

impl MappingProcess {
    /// The name, up to its first NUL, with bytes that are not UTF-8 (a
    /// process names itself) replaced.
    pub fn name(&self) -> String {
        let end = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(PROCESS_NAME_MAX);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

impl ExecMapping {
    /// Its path, up to the first NUL (`None` without one, or empty).
    pub fn path(&self) -> Option<String> {
        let end = self.path.iter().position(|&b| b == 0)?;
        (end > 0).then(|| String::from_utf8_lossy(&self.path[..end]).into_owned())
    }

    /// Its build ID, when it has one of a valid length.
    pub fn build_id(&self) -> Option<&[u8]> {
        let len = usize::try_from(self.build_id_len).ok()?;
        (1..=BUILD_ID_MAX)
            .contains(&len)
            .then(|| &self.build_id[..len])
    }
}

/// The bytes of a saved-register frame.
pub const REGS_SIZE: u64 = 168;
/// Where the exception frame starts in a saved-register frame.
pub const REGS_FRAME_OFFSET: u64 = 128;

/// A saved-register frame, laid out as Linux's x86-64 `struct pt_regs`:
/// the general registers as the kernel's entry code pushes them, then the
/// exception frame the CPU pushed. What the register calls read at RDI.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SavedRegs {
    /// R15.
    pub r15: u64,
    /// R14.
    pub r14: u64,
    /// R13.
    pub r13: u64,
    /// R12.
    pub r12: u64,
    /// RBP.
    pub rbp: u64,
    /// RBX.
    pub rbx: u64,
    /// R11.
    pub r11: u64,
    /// R10.
    pub r10: u64,
    /// R9.
    pub r9: u64,
    /// R8.
    pub r8: u64,
    /// RAX.
    pub rax: u64,
    /// RCX.
    pub rcx: u64,
    /// RDX.
    pub rdx: u64,
    /// RSI.
    pub rsi: u64,
    /// RDI.
    pub rdi: u64,
    /// The syscall number or error code slot; lwpvmm leaves it alone.
    pub orig_rax: u64,
    /// The exception frame.
    pub frame: Frame,
}

// SAFETY: SavedRegs is repr(C) and made only of u64 fields (Frame too), so
// it has no padding and every byte pattern is a valid value.
unsafe impl ByteValued for SavedRegs {}

impl SavedRegs {
    /// The general registers as KVM's `kvm_regs` (RSP, RIP and RFLAGS from
    /// the exception frame).
    pub fn to_kvm(&self) -> kvm_bindings::kvm_regs {
        kvm_bindings::kvm_regs {
            rax: self.rax,
            rbx: self.rbx,
            rcx: self.rcx,
            rdx: self.rdx,
            rsi: self.rsi,
            rdi: self.rdi,
            rsp: self.frame.rsp,
            rbp: self.rbp,
            r8: self.r8,
            r9: self.r9,
            r10: self.r10,
            r11: self.r11,
            r12: self.r12,
            r13: self.r13,
            r14: self.r14,
            r15: self.r15,
            rip: self.frame.rip,
            rflags: self.frame.rflags,
        }
    }

    /// Takes the general registers (not RSP, RIP, RFLAGS) from `regs`.
    pub fn set_gprs(&mut self, regs: &kvm_bindings::kvm_regs) {
        self.rax = regs.rax;
        self.rbx = regs.rbx;
        self.rcx = regs.rcx;
        self.rdx = regs.rdx;
        self.rsi = regs.rsi;
        self.rdi = regs.rdi;
        self.rbp = regs.rbp;
        self.r8 = regs.r8;
        self.r9 = regs.r9;
        self.r10 = regs.r10;
        self.r11 = regs.r11;
        self.r12 = regs.r12;
        self.r13 = regs.r13;
        self.r14 = regs.r14;
        self.r15 = regs.r15;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_values_decode() {
        // (byte, state operation, power operation)
        let table = [
            (0, Err(0), Ok(PowerOp::Off)),
            (1, Ok(StateOp::Save), Ok(PowerOp::Reboot)),
            (2, Ok(StateOp::Restore), Ok(PowerOp::Halt)),
            (3, Ok(StateOp::DeclareDb), Err(3)),
            (4, Ok(StateOp::UdRegs), Err(4)),
            (5, Ok(StateOp::DbRegs), Err(5)),
            (6, Ok(StateOp::ThresholdLine), Err(6)),
            (7, Ok(StateOp::SwitchOut), Err(7)),
            (8, Ok(StateOp::SwitchIn), Err(8)),
            (9, Ok(StateOp::ExecMapping), Err(9)),
            (10, Err(10), Err(10)),
            (0xff, Err(0xff), Err(0xff)),
        ];
        for (byte, state, power) in table {
            assert_eq!(StateOp::try_from(byte), state, "{byte}");
            assert_eq!(PowerOp::try_from(byte), power, "{byte}");
        }
    }

    #[test]
    fn replies_set_or_clear_cf_only() {
        // (RFLAGS before, reply, after)
        let table = [
            (0x2, Reply::NotOurs, 0x3),
            (0x3, Reply::Handled, 0x2),
            (0x246, Reply::Handled, 0x246),
            (0x247, Reply::NotOurs, 0x247),
        ];
        for (before, reply, after) in table {
            assert_eq!(reply.apply(before), after, "{before:#x} {reply:?}");
        }
    }

    #[test]
    fn the_frame_is_forty_bytes_in_push_order() {
        let f = Frame {
            rip: 1,
            cs: 2,
            rflags: 3,
            rsp: 4,
            ss: 5,
        };
        assert_eq!(f.as_slice().len() as u64, FRAME_SIZE);
        assert_eq!(&f.as_slice()[8..16], &2u64.to_le_bytes(), "CS second");
        assert_eq!(&f.as_slice()[32..40], &5u64.to_le_bytes(), "SS last");
    }

    #[test]
    fn saved_regs_are_linux_pt_regs() {
        let r = SavedRegs {
            r15: 1,
            rax: 11,
            orig_rax: 16,
            frame: Frame {
                rip: 17,
                ss: 21,
                ..Frame::default()
            },
            ..SavedRegs::default()
        };
        let b = r.as_slice();
        assert_eq!(b.len() as u64, REGS_SIZE);
        // (offset, value): pt_regs's r15, ax, orig_ax, ip, ss.
        for (at, v) in [(0, 1u64), (80, 11), (120, 16), (128, 17), (160, 21)] {
            assert_eq!(&b[at..at + 8], &v.to_le_bytes(), "offset {at}");
        }
        assert_eq!(REGS_FRAME_OFFSET, 128);
        let k = r.to_kvm();
        assert_eq!((k.r15, k.rax, k.rip), (1, 11, 17));
        let mut back = SavedRegs::default();
        back.set_gprs(&k);
        assert_eq!((back.r15, back.rax, back.orig_rax), (1, 11, 0));
    }
}
