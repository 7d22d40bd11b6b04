//! The ACPI tables that describe the machine to a guest kernel: an RSDP, an
//! XSDT, a FADT pointing at the PM registers (pm.rs), a DSDT that names the
//! S5 sleep type and, for a kernel that finds them only there, the virtio
//! devices (`LNRO0005`, as Firecracker describes virtio-mmio devices on
//! x86), and a MADT listing one local APIC per vCPU
//! (APIC ID = vCPU index, as KVM gives its LAPICs and the CPUID topology
//! says, topology.rs) and the IOAPIC (ioapic.rs); its flags do not claim
//! 8259 PICs, which the machine does not have. Built with rust-vmm's
//! `acpi_tables`; the kernel gets the RSDP's address from the boot protocol
//! (PVH `rsdp_paddr`, `boot_params.acpi_rsdp_addr`), so it scans no memory.
//!
//! The platform is a full ACPI one, not hardware-reduced: a hardware-reduced
//! FADT has no PM timer, which is what a kernel calibrates its TSC against
//! under kvm_pvm's emulated CPL0 (pm.rs). docs/design.md has the whole
//! decision.
//!
//! Pure: tables are bytes at fixed guest-physical addresses, tested
//! without KVM.

use acpi_tables::Aml;
use acpi_tables::aml::{Device, Interrupt, Memory32Fixed, Name, Package, ResourceTemplate, Scope};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, MADT, ProcessorLocalApic,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;

use crate::vmm::devices::pm::{
    PM_TMR_LEN, PM_TMR_PORT, PM1_CNT_LEN, PM1_EVT_LEN, PM1A_CNT_PORT, PM1A_EVT_PORT, SLP_TYP_S5,
};

/// Where the tables live: the BIOS area below 1 MiB, which the memory map
/// reports as reserved.
pub const ACPI_START: u64 = 0xE_0000;
/// End of that area (exclusive).
pub const ACPI_END: u64 = 0x10_0000;
/// The RSDP, first in the area.
pub const RSDP_ADDR: u64 = ACPI_START;
/// The local APIC's base (KVM's default).
pub const LAPIC_ADDR: u32 = 0xFEE0_0000;
/// The IOAPIC's base (lwpvmm's IOAPIC, ioapic.rs).
pub const IOAPIC_ADDR: u32 = crate::vmm::devices::ioapic::IOAPIC_BASE as u32;
/// The IOAPIC's ID: what its ID register holds after reset.
pub const IOAPIC_ID: u8 = 0;

const OEM_ID: [u8; 6] = *b"LWPVMM";
const OEM_REVISION: u32 = 1;
/// FADT IA-PC boot architecture flags: no VGA (bit 2), no CMOS RTC (bit
/// 5): lwpvmm has neither.
const IAPC_BOOT_ARCH: u16 = (1 << 2) | (1 << 5);
/// The SCI's ISA IRQ (never raised: no fixed event fires).
const SCI_IRQ: u16 = 9;
const TABLE_ALIGN: u64 = 16;

/// The tables of one machine: each table's bytes and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcpiTables {
    /// (guest-physical address, bytes), RSDP first.
    pub tables: Vec<(u64, Vec<u8>)>,
}

fn bytes(table: &dyn Aml) -> Vec<u8> {
    let mut out = Vec::new();
    table.to_aml_bytes(&mut out);
    out
}

fn madt(vcpus: u8) -> Vec<u8> {
    let mut madt = MADT::new(
        OEM_ID,
        *b"LWPVMMAP",
        OEM_REVISION,
        LocalInterruptController::Address(LAPIC_ADDR),
    );
    for id in 0..vcpus {
        madt.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    madt.add_structure(IoApic::new(IOAPIC_ID, IOAPIC_ADDR, 0));
    // The flags stay 0: no PCAT_COMPAT, since there are no 8259 PICs.
    bytes(&madt)
}

fn fadt(dsdt: u64) -> Vec<u8> {
    let mut fadt = FADTBuilder::new(OEM_ID, *b"LWPVMMFP", OEM_REVISION)
        .dsdt_64(dsdt)
        // WBINVD works (a full platform must say so); the PM timer is 32
        // bits wide; there are no fixed power and sleep buttons.
        .flag(Flags::Wbinvd)
        .flag(Flags::TmrValExt)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    // No SMI command port: the platform is always in ACPI mode.
    fadt.sci_int = SCI_IRQ.into();
    fadt.pm1a_evt_blk = u32::from(PM1A_EVT_PORT).into();
    fadt.pm1_evt_len = PM1_EVT_LEN;
    fadt.pm1a_cnt_blk = u32::from(PM1A_CNT_PORT).into();
    fadt.pm1_cnt_len = PM1_CNT_LEN;
    fadt.pm_tmr_blk = u32::from(PM_TMR_PORT).into();
    fadt.pm_tmr_len = PM_TMR_LEN;
    fadt.iapc_boot_arch = IAPC_BOOT_ARCH.into();
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"LWPVMM\0\0").into();
    bytes(&fadt.finalize())
}

/// A virtio-mmio device as the DSDT describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioDevice {
    /// Its register window's guest-physical address.
    pub base: u32,
    /// The window's length.
    pub len: u32,
    /// Its interrupt (a GSI of the IOAPIC).
    pub gsi: u32,
}

/// The DSDT: `_S5`, the sleep type that powers the VM off (pm.rs), and a
/// device `Vnnn` under `\_SB` for each of `devices`: `_HID` "LNRO0005"
/// (Linux's virtio_mmio driver matches it), its window and its
/// edge-triggered, active-high interrupt in `_CRS`.
fn dsdt(devices: &[MmioDevice]) -> Vec<u8> {
    let mut dsdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, *b"LWPVMMDS", OEM_REVISION);
    let typ = SLP_TYP_S5 as u8;
    let mut aml = Vec::new();
    Name::new("_S5_".into(), &Package::new(vec![&typ, &typ, &0u8, &0u8])).to_aml_bytes(&mut aml);
    if !devices.is_empty() {
        let names: Vec<String> = (0..devices.len()).map(|i| format!("V{i:03X}")).collect();
        let uids: Vec<u32> = (0..devices.len() as u32).collect();
        let windows: Vec<Memory32Fixed> = devices
            .iter()
            .map(|d| Memory32Fixed::new(true, d.base, d.len))
            .collect();
        let irqs: Vec<Interrupt> = devices
            .iter()
            .map(|d| Interrupt::new(true, true, false, false, d.gsi))
            .collect();
        let resources: Vec<ResourceTemplate> = windows
            .iter()
            .zip(&irqs)
            .map(|(w, i)| ResourceTemplate::new(vec![w, i]))
            .collect();
        let hid = "LNRO0005";
        let fields: Vec<[Name; 3]> = uids
            .iter()
            .zip(&resources)
            .map(|(uid, crs)| {
                [
                    Name::new("_HID".into(), &hid),
                    Name::new("_UID".into(), uid),
                    Name::new("_CRS".into(), crs),
                ]
            })
            .collect();
        let devices: Vec<Device> = names
            .iter()
            .zip(&fields)
            .map(|(name, f)| {
                Device::new(
                    name.as_str().into(),
                    f.iter().map(|n| n as &dyn Aml).collect(),
                )
            })
            .collect();
        Scope::new(
            "\\_SB_".into(),
            devices.iter().map(|d| d as &dyn Aml).collect(),
        )
        .to_aml_bytes(&mut aml);
    }
    dsdt.append_slice(&aml);
    dsdt.as_slice().to_vec()
}

fn align(addr: u64) -> u64 {
    addr.div_ceil(TABLE_ALIGN) * TABLE_ALIGN
}

impl AcpiTables {
    /// The tables for a machine of `vcpus` vCPUs whose DSDT describes
    /// `devices`.
    pub fn new(vcpus: u8, devices: &[MmioDevice]) -> Self {
        let xsdt_addr = align(RSDP_ADDR + Rsdp::len() as u64);
        // The XSDT lists two tables; its size is known before they are placed.
        let xsdt_len = 36 + 2 * 8;
        let dsdt_addr = align(xsdt_addr + xsdt_len);
        let dsdt = dsdt(devices);
        let fadt_addr = align(dsdt_addr + dsdt.len() as u64);
        let fadt = fadt(dsdt_addr);
        let madt_addr = align(fadt_addr + fadt.len() as u64);
        let madt = madt(vcpus);
        let mut xsdt = XSDT::new(OEM_ID, *b"LWPVMMXS", OEM_REVISION);
        xsdt.add_entry(fadt_addr);
        xsdt.add_entry(madt_addr);
        let xsdt = bytes(&xsdt);
        debug_assert_eq!(xsdt.len() as u64, xsdt_len);
        AcpiTables {
            tables: vec![
                (RSDP_ADDR, bytes(&Rsdp::new(OEM_ID, xsdt_addr))),
                (xsdt_addr, xsdt),
                (dsdt_addr, dsdt),
                (fadt_addr, fadt),
                (madt_addr, madt),
            ],
        }
    }

    /// The first byte after the last table.
    pub fn end(&self) -> u64 {
        self.tables
            .iter()
            .map(|(addr, t)| addr + t.len() as u64)
            .max()
            .unwrap_or(ACPI_START)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, b| s.wrapping_add(*b))
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    fn table(t: &AcpiTables, addr: u64) -> &[u8] {
        &t.tables
            .iter()
            .find(|(a, _)| *a == addr)
            .expect("a table there")
            .1
    }

    /// (type, bytes) of each MADT structure.
    fn madt_structures(madt: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 44;
        while at < madt.len() {
            let len = usize::from(madt[at + 1]);
            out.push((madt[at], madt[at..at + len].to_vec()));
            at += len;
        }
        out
    }

    #[test]
    fn the_tables_chain_from_the_rsdp_and_check_out() {
        for vcpus in [1u8, 2, 4, 254] {
            let t = AcpiTables::new(vcpus, &[]);
            assert!(t.end() <= ACPI_END, "{vcpus}: tables fit the area");
            let rsdp = table(&t, RSDP_ADDR);
            assert_eq!(&rsdp[..8], b"RSD PTR ");
            assert_eq!(sum(&rsdp[..20]), 0, "v1 checksum");
            assert_eq!(sum(rsdp), 0, "extended checksum");
            let xsdt = table(&t, u64_at(rsdp, 24));
            assert_eq!(&xsdt[..4], b"XSDT");
            assert_eq!(u32_at(xsdt, 4) as usize, xsdt.len());
            let entries: Vec<u64> = (36..xsdt.len())
                .step_by(8)
                .map(|o| u64_at(xsdt, o))
                .collect();
            let sigs: Vec<&[u8]> = entries.iter().map(|&a| &table(&t, a)[..4]).collect();
            assert_eq!(sigs, [b"FACP", b"APIC"]);
            for (addr, bytes) in &t.tables[1..] {
                assert_eq!(sum(bytes), 0, "{vcpus}: table at {addr:#x} sums to 0");
                assert_eq!(u32_at(bytes, 4) as usize, bytes.len(), "length field");
                assert_eq!(addr % TABLE_ALIGN, 0);
            }
            let mut spans: Vec<(u64, u64)> = t
                .tables
                .iter()
                .map(|(a, b)| (*a, a + b.len() as u64))
                .collect();
            spans.sort();
            assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "no overlap");
            let fadt = table(&t, entries[0]);
            let dsdt = table(&t, u64_at(fadt, 140));
            assert_eq!(&dsdt[..4], b"DSDT", "X_DSDT");
            // Name (_S5, Package (4) { 5, 5, 0, 0 })
            assert_eq!(&dsdt[36..], b"\x08_S5_\x12\x08\x04\x0a\x05\x0a\x05\x00\x00");
            assert_eq!(
                u32_at(fadt, 112) & Flags::HwReducedAcpi as u32,
                0,
                "a full platform"
            );
            let ports = (u32_at(fadt, 56), u32_at(fadt, 64), u32_at(fadt, 76));
            assert_eq!(ports, (0x600, 0x604, 0x608), "PM1a event, control, timer");
            assert_eq!(&fadt[88..92], [4, 2, 0, 4], "their lengths");
            assert_eq!((u32_at(fadt, 48), fadt[46]), (0, 9), "no SMI port, SCI 9");
        }
    }

    #[test]
    fn the_dsdt_describes_each_virtio_device_as_firecracker_does() {
        let devices = [
            MmioDevice {
                base: 0xd000_0000,
                len: 0x1000,
                gsi: 5,
            },
            MmioDevice {
                base: 0xd000_1000,
                len: 0x1000,
                gsi: 6,
            },
        ];
        let t = AcpiTables::new(2, &devices);
        let rsdp = table(&t, RSDP_ADDR);
        let xsdt = table(&t, u64_at(rsdp, 24));
        let fadt = table(&t, u64_at(xsdt, 36));
        let dsdt = table(&t, u64_at(fadt, 140));
        assert_eq!(sum(dsdt), 0);
        assert_eq!(u32_at(dsdt, 4) as usize, dsdt.len());
        assert!(t.end() <= ACPI_END);
        let find = |needle: &[u8]| dsdt.windows(needle.len()).filter(|w| *w == needle).count();
        assert_eq!(find(b"LNRO0005\0"), 2, "a _HID string each");
        assert_eq!(find(b"_SB_"), 1, "under \\_SB");
        for (i, d) in devices.iter().enumerate() {
            assert_eq!(find(format!("V{i:03X}").as_bytes()), 1);
            // Memory32Fixed (ReadWrite, base, length).
            let mut window = vec![0x86, 9, 0, 1];
            window.extend_from_slice(&d.base.to_le_bytes());
            window.extend_from_slice(&d.len.to_le_bytes());
            assert_eq!(find(&window), 1, "device {i}'s window");
            // Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive).
            let mut irq = vec![0x89, 6, 0, 0b0011, 1];
            irq.extend_from_slice(&d.gsi.to_le_bytes());
            assert_eq!(find(&irq), 1, "device {i}'s interrupt");
        }
        // Without devices the DSDT is as before: `_S5` alone.
        let plain = AcpiTables::new(2, &[]);
        let fadt = table(
            &plain,
            u64_at(table(&plain, u64_at(table(&plain, RSDP_ADDR), 24)), 36),
        );
        assert_eq!(
            &table(&plain, u64_at(fadt, 140))[36..],
            b"\x08_S5_\x12\x08\x04\x0a\x05\x0a\x05\x00\x00"
        );
    }

    #[test]
    fn the_madt_lists_every_vcpu_and_the_ioapic() {
        for vcpus in [1u8, 2, 3, 4, 254] {
            let t = AcpiTables::new(vcpus, &[]);
            let madt = table(&t, t.tables[4].0);
            assert_eq!(&madt[..4], b"APIC");
            assert_eq!(u32_at(madt, 36), LAPIC_ADDR);
            assert_eq!(u32_at(madt, 40), 0, "no PCAT_COMPAT: no 8259 PICs");
            let s = madt_structures(madt);
            let lapics: Vec<(u8, u8, u32)> = s
                .iter()
                .filter(|(ty, _)| *ty == 0)
                .map(|(_, b)| (b[2], b[3], u32_at(b, 4)))
                .collect();
            let want: Vec<(u8, u8, u32)> = (0..vcpus).map(|i| (i, i, 1)).collect();
            assert_eq!(lapics, want, "{vcpus}: uid = APIC ID = vCPU index, enabled");
            let ioapics: Vec<&Vec<u8>> = s
                .iter()
                .filter(|(ty, _)| *ty == 1)
                .map(|(_, b)| b)
                .collect();
            assert_eq!(ioapics.len(), 1);
            assert_eq!(
                (ioapics[0][2], u32_at(ioapics[0], 4), u32_at(ioapics[0], 8)),
                (IOAPIC_ID, IOAPIC_ADDR, 0)
            );
        }
    }
}
