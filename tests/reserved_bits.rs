//! The CPU as the oracle for the guard's reserved bits (issue 44, item 1;
//! docs/security.md). The `reserved_bits` guest sets one bit at a time in
//! an entry of its own page tables, at every level, leaf and table, stores
//! through the mapping from CPL3 and records whether the CPU faulted with
//! PFEC.RSVD; the guard must refuse an LWP store through the same mapping
//! exactly there.
//!
//! On this project's hosts (kvm_pvm) CPL3 runs natively but KVM shadows the
//! guest's page tables, so KVM's MMU, keyed on the guest's CPUID vendor,
//! decides the fault; elsewhere the processor does. Neither test assumes a
//! vendor: the first runs the guest under lwpvmm with the host's vendor,
//! the second on a bare KVM VM with the other vendor's string, where KVM
//! walks the guest's tables in software (else with the host's own).
//!
//! Every machine of this project has /dev/kvm; these tests fail, loudly,
//! where it is missing.

// A test: a failed setup or expectation stops it with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::require_kvm;
use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_cpuid_entry2};
use kvm_ioctls::{Kvm, VcpuExit};
use lwpvmm::guard::{Access, GuestView, Vendor};
use lwpvmm::lwp::cpuid::{CpuidEntry, GuestLwpSupport, LwpProfile};
use lwpvmm::lwp::fault::{GuestFault, PF_RESERVED};
use lwpvmm::vmm::devices::port_bus::{GuestEnd, SerialOut};
use lwpvmm::vmm::vcpu::guest_paging::PagingSource;
use lwpvmm::vmm::{self, HostConfig, VmConfig, VmEnd, boot};

/// Cases the guest must run whatever the processor: the bits the issue
/// names, at each level (the MAXPHYADDR cases only run below 52 bits).
const REQUIRED: [&str; 12] = [
    "PML4E bit 7 (PS)",
    "PML4E bit 8",
    "PML4E bit 63, EFER.NXE off",
    "PDPTE bit 8",
    "1 GiB PDPTE (PS)",
    "2 MiB PDE bit 13",
    "2 MiB PDE bit 20",
    "PDE bit 8",
    "PTE bit 51",
    "PTE bit 63, EFER.NXE on",
    "PTE bit 63, EFER.NXE off",
    "PTE",
];

/// The vendor in /proc/cpuinfo: the processor lwpvmm runs on.
fn host_vendor() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("vendor_id"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// An answer as the guest prints it (0, a #PF error code, 0x10000 |
/// another vector, 0x20000 more for a #PF whose CR2 is not the address),
/// in words.
fn describe(code: u64) -> String {
    let low = code & 0xffff;
    match code >> 16 {
        0 if code == 0 => "stored".into(),
        0 if low & u64::from(PF_RESERVED) != 0 => format!("#PF {low:#x} (RSVD)"),
        0 => format!("#PF {low:#x}"),
        2 => format!("#PF {low:#x} with CR2 elsewhere"),
        _ => format!("vector {low}"),
    }
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim().trim_start_matches("0x"), 16)
        .unwrap_or_else(|_| panic!("not a hex number: {s:?}"))
}

/// The guest's `probe NAME: cpu X[ lwp Y]` lines: (name, X, Y).
fn probes(console: &str) -> Vec<(String, u64, Option<u64>)> {
    console
        .lines()
        .filter_map(|l| l.strip_prefix("probe "))
        .filter(|l| !l.ends_with("MAXPHYADDR is 52"))
        .map(|l| {
            let (name, rest) = l.split_once(": cpu ").expect("a probe line");
            let (cpu, lwp) = match rest.split_once(" lwp ") {
                Some((cpu, lwp)) => (hex(cpu), Some(hex(lwp))),
                None => (hex(rest), None),
            };
            (name.to_owned(), cpu, lwp)
        })
        .collect()
}

fn assert_required_ran(seen: &[String], console: &str, end: &dyn std::fmt::Debug) {
    for name in REQUIRED {
        assert!(
            seen.iter().any(|s| s == name),
            "the guest ran no case {name:?} (it ended {end:?}):\n{console}"
        );
    }
    if !console.contains("MAXPHYADDR is 52") {
        assert!(
            seen.iter().any(|s| s == "PML4E bit MAXPHYADDR"),
            "{console}"
        );
    }
}

/// Under lwpvmm, with the CPUID it gives every guest (the host's vendor):
/// for each case the CPU's own store and LLWPCB's ring check, which goes
/// through the guard, give the same answer.
#[test]
fn the_guard_refuses_exactly_where_the_cpu_faults() {
    require_kvm();
    let console = Arc::new(Mutex::new(Vec::new()));
    let config = VmConfig {
        kernel: lwpvmm::guests::get("reserved_bits").unwrap().to_vec(),
        memory_mib: 64,
        vcpus: 1,
        profile: LwpProfile::Emulated,
        guest: GuestLwpSupport::Shim,
        host: HostConfig {
            serial: SerialOut::Capture(Arc::clone(&console)),
            ..HostConfig::default()
        },
        ..VmConfig::default()
    };
    let outcome = vmm::run(&config).unwrap_or_else(|e| panic!("guest reserved_bits: {e}"));
    let text = String::from_utf8_lossy(&console.lock().unwrap()).into_owned();
    let guest = text
        .lines()
        .find_map(|l| l.strip_prefix("reserved_bits: guest vendor "))
        .unwrap_or_else(|| panic!("the guest names its vendor:\n{text}"));
    println!("host vendor {}; guest vendor {guest}", host_vendor());
    let seen = probes(&text);
    for (name, cpu, lwp) in &seen {
        let lwp = lwp.unwrap_or_else(|| panic!("{name}: no LWP answer:\n{text}"));
        println!(
            "{name:<34} CPU {:<18} LWP {}",
            describe(*cpu),
            describe(lwp)
        );
        assert_eq!(
            lwp, *cpu,
            "{name}: the guard and the CPU disagree (guest vendor {guest})"
        );
    }
    let names: Vec<String> = seen.into_iter().map(|(n, ..)| n).collect();
    assert_required_ran(&names, &text, &outcome.end);
    assert!(
        outcome.end == VmEnd::Guest(GuestEnd::ExitPort(0)) && text.contains(" 0 failed"),
        "ended {:?}:\n{text}",
        outcome.end
    );
}

/// The vendor string of a leaf-0 entry (EBX, EDX, ECX).
fn vendor_name(e: &kvm_cpuid_entry2) -> [u8; 12] {
    let mut name = [0u8; 12];
    for (chunk, reg) in name.chunks_exact_mut(4).zip([e.ebx, e.edx, e.ecx]) {
        chunk.copy_from_slice(&reg.to_le_bytes());
    }
    name
}

/// Whether KVM walks a guest's page tables itself (shadow paging): on
/// kvm_pvm always, on kvm_intel and kvm_amd only without EPT or NPT. Only
/// there does the guest's CPUID vendor, not the processor's, decide.
fn kvm_shadows_guest_paging() -> bool {
    let param = |p: &str| std::fs::read_to_string(p).map(|v| v.trim().to_owned());
    std::path::Path::new("/sys/module/kvm_pvm").exists()
        || param("/sys/module/kvm_intel/parameters/ept").is_ok_and(|v| v == "N")
        || param("/sys/module/kvm_amd/parameters/npt").is_ok_and(|v| v == "0" || v == "N")
}

/// On a bare KVM VM whose CPUID names the other vendor (AuthenticAMD on an
/// Intel host, GenuineIntel on an AMD one) where KVM's MMU decides the
/// guest's faults, so both vendors' rules meet the oracle on whatever host
/// CI lands on; with the host's own vendor where the processor decides.
/// At each case the guest marks port 0x80 and the test runs the guard on
/// the VM's memory and registers as LLWPCB would.
#[test]
fn the_other_vendors_reserved_bits_hold_against_kvm() {
    require_kvm();
    let kvm = Kvm::new().expect("open /dev/kvm");
    let vm = kvm.create_vm().expect("KVM_CREATE_VM");
    let mem = boot::create_memory(64).expect("guest memory");
    vmm::machine::register_memory(&vm, &mem).expect("memory slots");
    vm.set_tss_address(0xfffb_d000).expect("TSS address");
    vm.create_irq_chip().expect("irqchip");
    let mut vcpu = vm.create_vcpu(0).expect("vCPU");
    let mut cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .expect("supported CPUID");
    let shadow = kvm_shadows_guest_paging();
    let leaf0 = cpuid
        .as_mut_slice()
        .iter_mut()
        .find(|e| e.function == 0)
        .expect("leaf 0");
    let host = vendor_name(leaf0);
    let other: &[u8; 12] = if Vendor::from_name(&host) == Vendor::Amd {
        b"GenuineIntel"
    } else {
        b"AuthenticAMD"
    };
    let guest: &[u8; 12] = if shadow { other } else { &host };
    let reg = |i: usize| u32::from_le_bytes(guest[i..i + 4].try_into().unwrap());
    (leaf0.ebx, leaf0.edx, leaf0.ecx) = (reg(0), reg(4), reg(8));
    vcpu.set_cpuid2(&cpuid).expect("KVM_SET_CPUID2");
    let seen: Vec<CpuidEntry> = vcpu
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .expect("KVM_GET_CPUID2")
        .as_slice()
        .iter()
        .map(lwpvmm::vmm::machine::from_kvm)
        .collect();
    let source = PagingSource::new(&seen);
    println!(
        "host vendor {} (/proc/cpuinfo), KVM's {}; guest vendor {}{}",
        host_vendor(),
        String::from_utf8_lossy(&host),
        String::from_utf8_lossy(guest),
        if shadow {
            " (KVM shadows the guest's page tables: its MMU follows the guest's vendor)"
        } else {
            " (the processor walks the guest's page tables: its own vendor's rules)"
        }
    );
    let kernel = boot::load_kernel(&mem, lwpvmm::guests::get("reserved_bits").unwrap()).unwrap();
    boot::write_boot_info(&mem, &kernel, "bare=1", None, 1, &[]).unwrap();
    boot::write_gdt(&mem).unwrap();
    let (regs, sregs) = boot::initial_state(kernel.entry, vcpu.get_sregs().unwrap());
    vcpu.set_sregs(&sregs).unwrap();
    vcpu.set_regs(&regs).unwrap();

    // (the CPU's answer, the guard's), a pair per case
    let mut answers = Vec::new();
    let mut console = Vec::new();
    let end = loop {
        match vcpu.run().expect("KVM_RUN") {
            VcpuExit::IoOut(0x80, _) => {
                let (r, s) = (vcpu.get_regs().unwrap(), vcpu.get_sregs().unwrap());
                let paging = source.paging(&s, None).expect("the guest's paging");
                let guard = match GuestView::new(&mem, paging).check(r.rdi, 4096, Access::UserWrite)
                {
                    Ok(()) => 0,
                    Err(e) => match e.fault() {
                        GuestFault::PageFault {
                            address,
                            error_code,
                        } => u64::from(error_code) | if address == r.rdi { 0 } else { 0x20000 },
                        GuestFault::GeneralProtection => 0x1000d,
                        other => panic!("{:#x}: the guard gave {other:?} ({e})", r.rdi),
                    },
                };
                answers.push((r.rsi, guard));
            }
            VcpuExit::IoOut(0x3f8, data) => console.extend_from_slice(data),
            VcpuExit::IoOut(0xf4, data) => break data[0],
            VcpuExit::IoOut(..) | VcpuExit::IoIn(..) => {}
            other => panic!(
                "unexpected exit {other:?}:\n{}",
                String::from_utf8_lossy(&console)
            ),
        }
    };
    let console = String::from_utf8_lossy(&console).into_owned();
    let lines = probes(&console);
    assert_eq!(lines.len(), answers.len(), "a mark per case:\n{console}");
    for ((name, printed, _), (cpu, guard)) in lines.iter().zip(&answers) {
        assert_eq!(printed, cpu, "{name}");
        println!(
            "{name:<34} CPU {:<18} guard {}",
            describe(*cpu),
            describe(*guard)
        );
        assert_eq!(
            guard,
            cpu,
            "{name}: the guard and the CPU disagree (guest vendor {})",
            String::from_utf8_lossy(guest)
        );
    }
    let names: Vec<String> = lines.into_iter().map(|(n, ..)| n).collect();
    assert_required_ran(&names, &console, &end);
    assert_eq!(end, 0, "the guest ended with {end:#x}:\n{console}");
}
