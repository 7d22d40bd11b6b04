//! The IOAPIC, in userspace: KVM runs a split irqchip (local APICs in the
//! kernel, no in-kernel IOAPIC, PIC or PIT), as Cloud Hypervisor does, and
//! this module holds the IOAPIC's registers at 0xFEC0_0000 and turns its
//! redirection table into KVM's GSI routes: one MSI route per unmasked pin.
//! Every interrupt source of the machine (the serial and virtio irqfds, the
//! threshold lines' KVM_IRQ_LINE) is a GSI, so KVM delivers each straight
//! from its route to the local APICs without leaving the kernel; a vCPU
//! exits here only when the guest programs the IOAPIC.
//!
//! Why split: KVM's in-kernel PIT and IOAPIC wait out SRCU grace periods
//! when the VM is torn down, which was most of lwpvmm's start-up on the
//! nested host (`cargo bench --bench vmm -- starts` times both machines).
//!
//! Every source is a pulse (an irqfd write, a threshold edge), so every
//! route is an edge MSI, whatever trigger mode the guest programs: a
//! level-triggered pin then behaves as an edge one, as on a real IOAPIC
//! whose interrupt the local APIC takes as edge. The version is 0x20, so
//! Linux acknowledges such a pin by writing the EOI register (accepted, and
//! nothing to do, since no remote IRR is ever set) instead of rewriting
//! the entry. An interrupt that arrives while its pin is masked is lost, as
//! an edge on a masked pin of KVM's IOAPIC is. Only fixed, lowest-priority
//! and NMI delivery are routed: the other modes (SMI, INIT, ExtINT and the
//! reserved ones) have no source here, and a pin programmed with one stays
//! without a route.
//!
//! [`Ioapic`] is the register model, pure and tested without KVM;
//! [`IoapicDevice`] shares it between vCPU threads and hands its routes to
//! KVM when they change.

use std::sync::Mutex;

use kvm_bindings::{
    KVM_IRQ_ROUTING_MSI, KvmIrqRouting, kvm_irq_routing_entry, kvm_irq_routing_msi,
};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Where the IOAPIC's registers are (the MADT says so too).
pub const IOAPIC_BASE: u64 = 0xFEC0_0000;
/// The register window the IOAPIC claims.
pub const IOAPIC_WINDOW: u64 = 0x1000;
/// Its input pins, GSIs 0-23: what KVM's IOAPIC had and the MADT implies.
pub const IOAPIC_PINS: usize = 24;

const REG_SELECT: u64 = 0x00;
const REG_WINDOW: u64 = 0x10;
const REG_EOI: u64 = 0x40;
const INDEX_ID: u8 = 0x00;
const INDEX_VERSION: u8 = 0x01;
const INDEX_ARBITRATION: u8 = 0x02;
const INDEX_REDIRECTION: u8 = 0x10;
/// Version 0x20 (an EOI register) and the highest pin, 23, in bits 16-23.
const VERSION: u32 = 0x20 | ((IOAPIC_PINS as u32 - 1) << 16);
const ID_SHIFT: u32 = 24;
const ID_MASK: u32 = 0xF << ID_SHIFT;
/// A redirection entry's bits the guest writes: vector, delivery mode,
/// destination mode, polarity, trigger mode, mask and the destination.
/// Delivery status (12) and remote IRR (14) are read-only, and stay 0.
const RTE_WRITABLE: u64 = 0xFF00_0000_0001_AFFF;
const RTE_MASKED: u64 = 1 << 16;
const MSI_ADDRESS: u32 = 0xFEE0_0000;
const DELIVERY_FIXED: u64 = 0;
const DELIVERY_LOWEST: u64 = 1;
const DELIVERY_NMI: u64 = 4;
/// Vectors 0-15 are the exceptions': a local APIC refuses them as fixed
/// interrupts.
const FIRST_INTERRUPT_VECTOR: u64 = 16;

/// The IOAPIC's state, as a snapshot holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoapicState {
    /// The ID register's ID (bits 24-27).
    pub id: u8,
    /// IOREGSEL: the register IOWIN reaches.
    pub select: u8,
    /// The redirection table, one 64-bit entry per pin.
    pub redirection: [u64; IOAPIC_PINS],
}

impl Default for IoapicState {
    /// After reset: ID 0 (what the MADT gives), every pin masked.
    fn default() -> Self {
        IoapicState {
            id: 0,
            select: 0,
            redirection: [RTE_MASKED; IOAPIC_PINS],
        }
    }
}

/// The MSI a GSI is routed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsiRoute {
    /// The pin.
    pub gsi: u32,
    /// The MSI address (destination, destination mode).
    pub address: u32,
    /// The MSI data (vector, delivery mode; always edge).
    pub data: u32,
}

/// The register model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ioapic {
    state: IoapicState,
}

impl Ioapic {
    /// An IOAPIC that continues from `state`: entries' read-only bits are
    /// cleared, since this IOAPIC never sets them.
    pub fn new(mut state: IoapicState) -> Self {
        for entry in &mut state.redirection {
            *entry &= RTE_WRITABLE;
        }
        state.id &= 0xF;
        Ioapic { state }
    }

    /// Its state, for a snapshot.
    pub fn state(&self) -> IoapicState {
        self.state
    }

    /// Answers a read at `offset` in the window: the 32-bit register there,
    /// of which `data` takes the bytes it covers (a short read takes the
    /// register's low bytes, as the bus would).
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let value = match offset & !3 {
            REG_SELECT => u32::from(self.state.select),
            REG_WINDOW => self.indexed(),
            _ => 0,
        };
        let bytes = value.to_le_bytes();
        let start = (offset & 3) as usize;
        for (i, b) in data.iter_mut().enumerate() {
            *b = bytes.get(start + i).copied().unwrap_or(0);
        }
    }

    /// Takes a write at `offset` in the window. Returns true when the
    /// routes changed.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> bool {
        let mut bytes = [0u8; 4];
        let len = data.len().min(4);
        bytes[..len].copy_from_slice(&data[..len]);
        let value = u32::from_le_bytes(bytes);
        match offset {
            REG_SELECT => {
                self.state.select = bytes[0];
                false
            }
            // The window is a 32-bit register: a partial write of it would
            // leave the rest of the entry undefined, so it is dropped.
            REG_WINDOW if data.len() == 4 => self.write_indexed(value),
            // Nothing to do: no remote IRR is ever set (module docs).
            REG_EOI => false,
            _ => false,
        }
    }

    fn indexed(&self) -> u32 {
        match self.state.select {
            INDEX_ID => u32::from(self.state.id) << ID_SHIFT,
            INDEX_VERSION => VERSION,
            INDEX_ARBITRATION => u32::from(self.state.id) << ID_SHIFT,
            index => match self.entry_of(index) {
                Some((pin, high)) => {
                    let entry = self.state.redirection[pin];
                    if high {
                        (entry >> 32) as u32
                    } else {
                        entry as u32
                    }
                }
                None => 0,
            },
        }
    }

    fn write_indexed(&mut self, value: u32) -> bool {
        match self.state.select {
            INDEX_ID => {
                self.state.id = ((value & ID_MASK) >> ID_SHIFT) as u8;
                false
            }
            index => match self.entry_of(index) {
                Some((pin, high)) => {
                    let before = self.route(pin);
                    let entry = &mut self.state.redirection[pin];
                    *entry = if high {
                        (*entry & 0xFFFF_FFFF) | (u64::from(value) << 32)
                    } else {
                        (*entry & !0xFFFF_FFFF) | u64::from(value)
                    } & RTE_WRITABLE;
                    before != self.route(pin)
                }
                None => false,
            },
        }
    }

    /// The pin and half (high dword or not) an IOREGSEL index names.
    fn entry_of(&self, index: u8) -> Option<(usize, bool)> {
        let n = usize::from(index.checked_sub(INDEX_REDIRECTION)?);
        (n / 2 < IOAPIC_PINS).then_some((n / 2, n % 2 == 1))
    }

    /// The MSI `pin` is routed to, if it has one.
    fn route(&self, pin: usize) -> Option<MsiRoute> {
        let entry = self.state.redirection[pin];
        let vector = entry & 0xFF;
        let delivery = (entry >> 8) & 7;
        let routed = match delivery {
            DELIVERY_FIXED | DELIVERY_LOWEST => vector >= FIRST_INTERRUPT_VECTOR,
            DELIVERY_NMI => true,
            _ => false,
        };
        if entry & RTE_MASKED != 0 || !routed {
            return None;
        }
        let logical = (entry >> 11) & 1;
        let destination = entry >> 56;
        Some(MsiRoute {
            gsi: pin as u32,
            address: MSI_ADDRESS | ((destination as u32) << 12) | ((logical as u32) << 2),
            data: (vector | (delivery << 8)) as u32,
        })
    }

    /// Every routed pin's MSI, in pin order.
    pub fn routes(&self) -> Vec<MsiRoute> {
        (0..IOAPIC_PINS).filter_map(|pin| self.route(pin)).collect()
    }
}

/// Why the routes could not be given to KVM.
#[derive(Debug, Error)]
#[error("KVM_SET_GSI_ROUTING failed: {0}")]
pub struct RoutingError(#[source] pub kvm_ioctls::Error);

/// Where routes go: KVM's GSI routing table, or a test's record.
pub type RouteSink = Box<dyn Fn(&[MsiRoute]) -> Result<(), RoutingError> + Send + Sync>;

/// The IOAPIC the vCPU threads share.
pub struct IoapicDevice {
    ioapic: Mutex<Ioapic>,
    sink: RouteSink,
}

impl IoapicDevice {
    /// The device continuing from `state`; its routes are given to `sink`
    /// before it returns.
    pub fn new(state: IoapicState, sink: RouteSink) -> Result<Self, RoutingError> {
        let ioapic = Ioapic::new(state);
        sink(&ioapic.routes())?;
        Ok(IoapicDevice {
            ioapic: Mutex::new(ioapic),
            sink,
        })
    }

    /// Routes into `vm`'s GSI routing table.
    pub fn kvm_sink(vm: std::sync::Arc<VmFd>) -> RouteSink {
        Box::new(move |routes| {
            let entries: Vec<kvm_irq_routing_entry> = routes.iter().map(to_kvm).collect();
            let table = KvmIrqRouting::from_entries(&entries)
                .map_err(|_| RoutingError(kvm_ioctls::Error::new(libc::E2BIG)))?;
            vm.set_gsi_routing(&table).map_err(RoutingError)
        })
    }

    /// Whether `addr` is in the IOAPIC's window.
    pub fn claims(addr: u64) -> bool {
        (IOAPIC_BASE..IOAPIC_BASE + IOAPIC_WINDOW).contains(&addr)
    }

    /// A read of the window (`addr` must be in it).
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        self.lock().read(addr - IOAPIC_BASE, data);
    }

    /// A write of the window (`addr` must be in it); KVM gets the new
    /// routes when they changed.
    pub fn write(&self, addr: u64, data: &[u8]) -> Result<(), RoutingError> {
        let mut ioapic = self.lock();
        if ioapic.write(addr - IOAPIC_BASE, data) {
            // Under the lock: two vCPUs' writes reach KVM in their order.
            (self.sink)(&ioapic.routes())?;
        }
        Ok(())
    }

    /// Its state, for a snapshot.
    pub fn state(&self) -> IoapicState {
        self.lock().state()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ioapic> {
        // The model has no invariant a panicking holder could break.
        self.ioapic
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn to_kvm(route: &MsiRoute) -> kvm_irq_routing_entry {
    let mut entry = kvm_irq_routing_entry {
        gsi: route.gsi,
        type_: KVM_IRQ_ROUTING_MSI,
        ..Default::default()
    };
    entry.u.msi = kvm_irq_routing_msi {
        address_lo: route.address,
        address_hi: 0,
        data: route.data,
        ..Default::default()
    };
    entry
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn select(io: &mut Ioapic, index: u8) {
        assert!(!io.write(REG_SELECT, &[index, 0, 0, 0]));
    }

    fn write_reg(io: &mut Ioapic, index: u8, value: u32) -> bool {
        select(io, index);
        io.write(REG_WINDOW, &value.to_le_bytes())
    }

    fn read_reg(io: &mut Ioapic, index: u8) -> u32 {
        select(io, index);
        let mut b = [0u8; 4];
        io.read(REG_WINDOW, &mut b);
        u32::from_le_bytes(b)
    }

    #[test]
    fn registers_read_back_as_an_ioapic_s() {
        let mut io = Ioapic::new(IoapicState::default());
        assert_eq!(read_reg(&mut io, INDEX_VERSION), 0x0017_0020);
        write_reg(&mut io, INDEX_ID, 0xFFFF_FFFF);
        assert_eq!(read_reg(&mut io, INDEX_ID), 0x0F00_0000);
        assert_eq!(read_reg(&mut io, INDEX_ARBITRATION), 0x0F00_0000);
        // Read-only registers and unknown indices ignore writes.
        write_reg(&mut io, INDEX_VERSION, 0);
        assert_eq!(read_reg(&mut io, INDEX_VERSION), 0x0017_0020);
        for index in [0x03u8, 0x0F, 0x40, 0xFF] {
            assert!(!write_reg(&mut io, index, 0x30));
            assert_eq!(read_reg(&mut io, index), 0, "index {index:#x}");
        }
        // Every pin starts masked; the last pin is 23 (index 0x3E/0x3F).
        for pin in 0..IOAPIC_PINS as u8 {
            assert_eq!(read_reg(&mut io, 0x10 + 2 * pin), 1 << 16);
            assert_eq!(read_reg(&mut io, 0x11 + 2 * pin), 0);
        }
        // IOREGSEL reads back; a byte read takes its low byte.
        select(&mut io, 0x2A);
        let mut b = [0u8; 1];
        io.read(REG_SELECT, &mut b);
        assert_eq!(b[0], 0x2A);
        // Outside the registers: zeros, and writes change nothing.
        let before = io.clone();
        assert!(!io.write(0x800, &[1, 2, 3, 4]));
        let mut b = [0xAAu8; 4];
        io.read(0x800, &mut b);
        assert_eq!((b, &io), ([0; 4], &before));
    }

    #[test]
    fn entries_keep_only_their_writable_bits() {
        let mut io = Ioapic::new(IoapicState::default());
        // Delivery status (12) and remote IRR (14) stay clear; bits 17-31
        // and the high dword's 0-23 are reserved.
        write_reg(&mut io, 0x10, 0xFFFF_FFFF);
        write_reg(&mut io, 0x11, 0xFFFF_FFFF);
        assert_eq!(read_reg(&mut io, 0x10), 0x0001_AFFF);
        assert_eq!(read_reg(&mut io, 0x11), 0xFF00_0000);
        // A restored state with read-only bits set loses them.
        let mut state = IoapicState::default();
        state.redirection[3] = u64::MAX;
        state.id = 0xFF;
        let io = Ioapic::new(state);
        assert_eq!(io.state().redirection[3], RTE_WRITABLE);
        assert_eq!(io.state().id, 0xF);
    }

    #[test]
    fn routes_follow_the_unmasked_entries() {
        struct Case {
            low: u32,
            high: u32,
            route: Option<(u32, u32)>,
        }
        let table = [
            // Fixed, vector 0x30, physical destination 1, edge.
            Case {
                low: 0x30,
                high: 1 << 24,
                route: Some((0xFEE0_1000, 0x30)),
            },
            // Level-triggered, active low: still an edge MSI.
            Case {
                low: 0xA041,
                high: 2 << 24,
                route: Some((0xFEE0_2000, 0x41)),
            },
            // Lowest priority to logical destination 0x0F.
            Case {
                low: 0x0952,
                high: 0x0F << 24,
                route: Some((0xFEE0_F004, 0x152)),
            },
            // NMI: its vector does not matter.
            Case {
                low: 0x0400,
                high: 0,
                route: Some((0xFEE0_0000, 0x400)),
            },
            // Masked.
            Case {
                low: 0x1_0030,
                high: 0,
                route: None,
            },
            // An exception vector as a fixed interrupt.
            Case {
                low: 0x0F,
                high: 0,
                route: None,
            },
            // SMI, INIT, ExtINT and the reserved modes.
            Case {
                low: 0x0230,
                high: 0,
                route: None,
            },
            Case {
                low: 0x0330,
                high: 0,
                route: None,
            },
            Case {
                low: 0x0530,
                high: 0,
                route: None,
            },
            Case {
                low: 0x0630,
                high: 0,
                route: None,
            },
            Case {
                low: 0x0730,
                high: 0,
                route: None,
            },
        ];
        for (i, case) in table.iter().enumerate() {
            let mut io = Ioapic::new(IoapicState::default());
            let pin = (i % IOAPIC_PINS) as u8;
            write_reg(&mut io, 0x11 + 2 * pin, case.high);
            let changed = write_reg(&mut io, 0x10 + 2 * pin, case.low);
            let want: Vec<MsiRoute> = case
                .route
                .map(|(address, data)| MsiRoute {
                    gsi: u32::from(pin),
                    address,
                    data,
                })
                .into_iter()
                .collect();
            assert_eq!(io.routes(), want, "case {i}");
            assert_eq!(changed, case.route.is_some(), "case {i}");
        }
    }

    #[test]
    fn only_a_change_of_an_effective_route_asks_for_new_routes() {
        let mut io = Ioapic::new(IoapicState::default());
        // Masked: the destination and vector can change freely.
        assert!(!write_reg(&mut io, 0x19, 3 << 24));
        assert!(!write_reg(&mut io, 0x18, 0x1_0033));
        assert!(write_reg(&mut io, 0x18, 0x33), "unmasking");
        assert!(!write_reg(&mut io, 0x18, 0x33), "the same entry again");
        // Polarity and trigger mode do not change the MSI.
        assert!(!write_reg(&mut io, 0x18, 0xA033));
        assert!(write_reg(&mut io, 0x19, 1 << 24), "a new destination");
        // The EOI register and short writes of the window change nothing.
        assert!(!io.write(REG_EOI, &[0x33, 0, 0, 0]));
        select(&mut io, 0x18);
        assert!(!io.write(REG_WINDOW, &[0x44]));
        assert_eq!(io.routes()[0].data, 0x33);
        assert!(write_reg(&mut io, 0x18, 0x1_A033), "masking");
        assert!(io.routes().is_empty());
    }

    #[test]
    fn the_device_gives_its_sink_every_new_table_and_restores_routes() {
        let seen: Arc<Mutex<Vec<Vec<MsiRoute>>>> = Arc::default();
        let sink = {
            let seen = Arc::clone(&seen);
            Box::new(move |r: &[MsiRoute]| {
                seen.lock().unwrap().push(r.to_vec());
                Ok(())
            })
        };
        let mut state = IoapicState::default();
        state.redirection[4] = 0x31;
        let dev = IoapicDevice::new(state, sink).unwrap();
        let four = MsiRoute {
            gsi: 4,
            address: 0xFEE0_0000,
            data: 0x31,
        };
        assert_eq!(*seen.lock().unwrap(), vec![vec![four]]);
        let at = |index: u64| IOAPIC_BASE + index;
        dev.write(at(REG_SELECT), &[0x30, 0, 0, 0]).unwrap();
        dev.write(at(REG_WINDOW), &0x40u32.to_le_bytes()).unwrap();
        dev.write(at(REG_WINDOW), &0x40u32.to_le_bytes()).unwrap();
        let sixteen = MsiRoute {
            gsi: 16,
            address: 0xFEE0_0000,
            data: 0x40,
        };
        assert_eq!(seen.lock().unwrap().len(), 2, "one table per change");
        assert_eq!(seen.lock().unwrap()[1], vec![four, sixteen]);
        let mut b = [0u8; 4];
        dev.read(at(REG_WINDOW), &mut b);
        assert_eq!(u32::from_le_bytes(b), 0x40);
        assert_eq!(dev.state().redirection[16], 0x40);
        assert!(IoapicDevice::claims(at(0xFFF)) && !IoapicDevice::claims(at(0x1000)));
        let failing: RouteSink =
            Box::new(|_| Err(RoutingError(kvm_ioctls::Error::new(libc::ENOMEM))));
        assert!(IoapicDevice::new(state, failing).is_err());
    }
}
