//! The instructions kvm_pvm's CPL0 emulator is known not to run, and what
//! makes a kernel stop using them: a VM that ends on one says the cause and
//! the fix, not only the instruction's bytes. Pure: decodes bytes.

/// An instruction the emulator cannot run, and the CPU feature whose
/// CPUID bit makes a kernel use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// The instruction, as a reader looks it up.
    pub instruction: &'static str,
    /// The feature (its name in /proc/cpuinfo).
    pub feature: &'static str,
    /// The `clearcpuid=` bits that hide it (Linux's X86_FEATURE numbers,
    /// word * 32 + bit, as `boot::LINUX_CMDLINE` spells them).
    pub clearcpuid: &'static str,
}

impl Gap {
    /// The sentence an error appends to the instruction's bytes.
    pub fn explain(&self) -> String {
        format!(
            "; that is {} at CPL0, which this host's CPL0 emulator (kvm_pvm) cannot run: the kernel uses it because the CPU offers {}. Boot it with `clearcpuid={}` on its command line (lwpvmm's default command lines have it, and lwpvmm adds it for its own kernel; docs/linux-guest.md, \"The command line\")",
            self.instruction, self.feature, self.clearcpuid
        )
    }
}

const XSAVE: &str = "xsave";
const XSAVE_BIT: &str = "154";

/// The known gap `bytes` (an instruction, from its first byte) is, if any.
pub fn known(bytes: &[u8]) -> Option<Gap> {
    let gap = |instruction, feature, clearcpuid| {
        Some(Gap {
            instruction,
            feature,
            clearcpuid,
        })
    };
    let (mut f3, mut o66, mut at) = (false, false, 0);
    // Legacy prefixes, then at most one REX.
    while let Some(&b) = bytes.get(at) {
        match b {
            0xf3 => f3 = true,
            0x66 => o66 = true,
            0xf2 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65 | 0x67 | 0xf0 => {}
            _ => break,
        }
        at += 1;
    }
    if bytes.get(at).is_some_and(|b| b & 0xf0 == 0x40) {
        at += 1;
    }
    let rest = bytes.get(at..)?;
    let modrm = |i: usize| rest.get(i).map(|m| (m >> 6, (m >> 3) & 7));
    match rest {
        [0xc4 | 0xc5, ..] => gap(
            "a VEX-encoded instruction (BMI1, BMI2 or AVX)",
            "bmi1, bmi2 and avx (avx goes with xsave)",
            "154,291,296",
        ),
        [0x0f, 0xae, ..] => match modrm(2)? {
            (m, 4) if m != 3 && !f3 && !o66 => gap("XSAVE", XSAVE, XSAVE_BIT),
            (m, 5) if m != 3 && !f3 && !o66 => gap("XRSTOR", XSAVE, XSAVE_BIT),
            (m, 6) if m != 3 && !f3 && !o66 => gap("XSAVEOPT", XSAVE, XSAVE_BIT),
            (3, 0..=3) if f3 => gap("RDFSBASE/RDGSBASE/WRFSBASE/WRGSBASE", "fsgsbase", "288"),
            _ => None,
        },
        [0x0f, 0xc7, ..] => match modrm(2)? {
            (m, 3) if m != 3 => gap("XRSTORS", XSAVE, XSAVE_BIT),
            (m, 4 | 5) if m != 3 => gap("XSAVEC/XSAVES", XSAVE, XSAVE_BIT),
            (3, 7) if f3 => gap("RDPID", "rdpid", "534"),
            _ => None,
        },
        [0x0f, 0x01, 0xd0 | 0xd1, ..] => gap("XGETBV/XSETBV", XSAVE, XSAVE_BIT),
        [0x0f, 0x01, 0xca | 0xcb, ..] => gap("CLAC/STAC", "smap", "308"),
        [0x0f, 0xb8, ..] if f3 => gap("POPCNT", "popcnt", "151"),
        [0x0f, 0x38, 0x82, ..] if o66 => gap("INVPCID", "invpcid", "298"),
        [0x0f, 0x38, 0xf0 | 0xf1, ..] if !o66 => gap("MOVBE", "movbe", "150"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_gaps_are_named_and_others_are_not() {
        // (bytes, the instruction named, or None)
        let table: &[(&[u8], Option<&str>)] = &[
            // The failure: xrstor64 [rdi] (REX.W 0F AE /5).
            (&[0x48, 0x0f, 0xae, 0x2f], Some("XRSTOR")),
            (&[0x0f, 0xae, 0x27], Some("XSAVE")),
            (&[0x48, 0x0f, 0xae, 0x37], Some("XSAVEOPT")),
            (&[0x48, 0x0f, 0xc7, 0x1f], Some("XRSTORS")),
            (&[0x0f, 0x01, 0xd0], Some("XGETBV/XSETBV")),
            (&[0x0f, 0x01, 0xcb], Some("CLAC/STAC")),
            (
                &[0xf3, 0x48, 0x0f, 0xae, 0xd8],
                Some("RDFSBASE/RDGSBASE/WRFSBASE/WRGSBASE"),
            ),
            (&[0xf3, 0x0f, 0xc7, 0xf8], Some("RDPID")),
            (&[0xf3, 0x48, 0x0f, 0xb8, 0xc7], Some("POPCNT")),
            (&[0x66, 0x0f, 0x38, 0x82, 0x07], Some("INVPCID")),
            (&[0x0f, 0x38, 0xf0, 0x07], Some("MOVBE")),
            (
                &[0xc4, 0xe2, 0x78, 0xf2, 0xc1],
                Some("a VEX-encoded instruction (BMI1, BMI2 or AVX)"),
            ),
            // Not gaps: LFENCE (0F AE E8), FXSAVE (0F AE /0), CMPXCHG16B
            // (0F C7 /1), a plain MOV, nothing.
            (&[0x0f, 0xae, 0xe8], None),
            (&[0x0f, 0xae, 0x07], None),
            (&[0x48, 0x0f, 0xc7, 0x0f], None),
            (&[0x48, 0x89, 0xc7], None),
            (&[], None),
            (&[0xf3], None),
        ];
        for (bytes, want) in table {
            assert_eq!(known(bytes).map(|g| g.instruction), *want, "{bytes:02x?}");
        }
        let xrstor = known(&[0x48, 0x0f, 0xae, 0x2f]).unwrap().explain();
        assert!(
            xrstor.contains("XRSTOR at CPL0") && xrstor.contains("`clearcpuid=154`"),
            "{xrstor}"
        );
    }
}
