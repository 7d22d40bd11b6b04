//! Which of the segment registers KVM reports gives a vCPU's true privilege
//! level (CPL) on this host, at CPL0 (run by KVM's emulator on kvm_pvm) and
//! at CPL3 (native there), including in a DPL-0 conforming code segment,
//! where CS.DPL is 0 whatever the CPL. lwpvmm takes the CPL from SS.DPL
//! (`lwpvmm::vmm::vcpu::privilege::cpl`, docs/security.md); this test is the
//! evidence, so it drives KVM directly: a bare VM, the `cplprobe` guest, and
//! the segment registers at each of its marks on the POST port.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kvm_ioctls::{Kvm, VcpuExit};
use lwpvmm::vmm::boot;
use lwpvmm::vmm::vcpu::privilege::cpl;

/// (mark, the CPL the guest runs at there, in a conforming segment)
const STAGES: [(u8, u8, bool); 4] = [(0, 0, false), (1, 0, true), (2, 3, false), (3, 3, true)];

#[test]
fn ss_dpl_is_the_cpl_and_cs_dpl_is_not() {
    assert!(
        std::path::Path::new("/dev/kvm").exists(),
        "this test runs a guest on /dev/kvm, which is missing on this machine"
    );
    let kvm = Kvm::new().expect("open /dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let mem = boot::create_memory(64).expect("guest memory");
    lwpvmm::vmm::machine::register_memory(&vm, &mem).expect("memory slots");
    vm.set_tss_address(0xfffb_d000).expect("TSS address");
    vm.create_irq_chip().expect("irqchip");
    let mut vcpu = vm.create_vcpu(0).expect("vCPU");
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .expect("supported CPUID");
    vcpu.set_cpuid2(&cpuid).expect("CPUID");
    let kernel = boot::load_kernel(&mem, lwpvmm::guests::get("cplprobe").unwrap()).unwrap();
    boot::write_boot_info(&mem, &kernel, "", None, 1, &[]).unwrap();
    boot::write_gdt(&mem).unwrap();
    let (regs, sregs) = boot::initial_state(kernel.entry, vcpu.get_sregs().unwrap());
    vcpu.set_sregs(&sregs).unwrap();
    vcpu.set_regs(&regs).unwrap();

    let mut seen = Vec::new();
    let mut console = Vec::new();
    let end = loop {
        match vcpu.run().expect("KVM_RUN") {
            VcpuExit::IoOut(0x80, data) => {
                let mark = data[0];
                let s = vcpu.get_sregs().unwrap();
                seen.push((mark, s));
            }
            VcpuExit::IoOut(0x3f8, data) => console.extend_from_slice(data),
            VcpuExit::IoOut(0xf4, data) => break data[0],
            VcpuExit::IoOut(..) | VcpuExit::IoIn(..) => {}
            other => panic!("unexpected exit {other:?}"),
        }
    };
    let console = String::from_utf8_lossy(&console);
    assert_eq!(end, 0, "the probe ended with {end:#x}: {console}");
    assert_eq!(seen.len(), STAGES.len(), "{console}");
    for ((mark, s), (want_mark, want_cpl, conforming)) in seen.iter().zip(STAGES) {
        let line = format!(
            "mark {mark}: CS {:#x} (DPL {}, RPL {}), SS {:#x} (DPL {}), true CPL {want_cpl}",
            s.cs.selector,
            s.cs.dpl,
            s.cs.selector & 3,
            s.ss.selector,
            s.ss.dpl
        );
        println!("{line}");
        assert_eq!(*mark, want_mark);
        assert_eq!(s.ss.dpl, want_cpl, "SS.DPL: {line}");
        assert_eq!(cpl(s), want_cpl, "lwpvmm's definition: {line}");
        assert_eq!((s.cs.selector & 3) as u8, want_cpl, "CS.RPL: {line}");
        if conforming {
            assert_eq!(s.cs.dpl, 0, "a conforming segment's DPL: {line}");
        }
    }
}
