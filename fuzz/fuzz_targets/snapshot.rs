//! The snapshot parser on arbitrary state files: decoding, and the LWP
//! section's validation for every profile. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lwpvmm::lwp::cpuid::LwpProfile;
use lwpvmm::lwp::unit::LwpUnit;
use lwpvmm::vmm::snapshot::decode;

fuzz_target!(|data: &[u8]| {
    let Ok(snap) = decode(data, std::path::Path::new("fuzz")) else { return };
    for vcpu in &snap.vcpus {
        let Some(lwp) = &vcpu.lwp else { continue };
        for profile in LwpProfile::ALL {
            if let Some(caps) = profile.caps()
                && let Ok(unit) = LwpUnit::from_state(caps, &lwp.unit)
            {
                let _ = unit.save_xsave();
            }
        }
    }
});
