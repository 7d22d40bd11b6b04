//! Exit dispatch, in two steps. [`handle_exit`] takes KVM's exit while it
//! still borrows the kvm_run area: port and MSR exits are answered there
//! (the data KVM hands back lives in kvm_run), everything else becomes an
//! [`ExitAction`]. [`act`] then runs the handler the action names with the
//! vCPU's registers at hand ([`ExitCx`]). Both are plain functions of their
//! inputs, so tests feed them fabricated exits and a fake vCPU.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use kvm_bindings::kvm_debug_exit_arch;
use kvm_ioctls::VcpuExit;

use super::context::ExitCx;
use super::lwp_state::VcpuLwp;
use super::protocol::{VcpuError, VcpuStep};
use super::{doorbell, pf_entry, state_call, stepper};
use crate::guard::GuestMemory;
use crate::guest_warn;
use crate::vmm::base::metrics::VcpuMetrics;
use crate::vmm::devices::ioapic::IoapicDevice;
use crate::vmm::devices::port_bus::{PortAction, PortBus};
use crate::vmm::devices::virtio::VirtioBus;
use crate::vmm::vcpu::step::StepBackend;

/// What an exit asks for once KVM's exit data is answered.
#[derive(Debug, Clone, PartialEq)]
pub enum ExitAction {
    /// Nothing more (an MSR or a device port was answered).
    Done,
    /// A port write the vCPU's registers must answer (a doorbell, a state
    /// call), or that ends the VM or asks for a snapshot.
    Port(PortAction),
    /// A port access was answered; noted for stepping.
    PortDone,
    /// A Debug exit (the guest-debug stepping backend, or the breakpoint
    /// of the SYSCALL quirk's fixup).
    Debug(kvm_debug_exit_arch),
    /// KVM's emulator failed on an instruction.
    EmulationFailure,
    /// KVM_RUN returned early (a kick): sampling, pausing, stopping.
    Interrupted,
    /// The guest shut down (a triple fault).
    Shutdown,
    /// An exit lwpvmm does not handle, named.
    Unhandled(String),
}

/// What answering an exit's data needs.
pub struct Devices<'a> {
    /// The vCPU's index.
    pub id: u8,
    /// The port bus.
    pub bus: &'a Mutex<PortBus>,
    /// The virtio devices' register windows.
    pub virtio: &'a VirtioBus,
    /// The IOAPIC's window.
    pub ioapic: &'a IoapicDevice,
    /// Guest memory (a device checks its queues at DRIVER_OK).
    pub mem: &'a GuestMemory,
    /// The vCPU's LWP state (for the LWP MSRs).
    pub lwp: &'a mut VcpuLwp,
    /// Its counters.
    pub metrics: &'a VcpuMetrics,
}

/// Answers what KVM hands back in kvm_run and names what remains to do.
pub fn handle_exit(
    exit: Result<VcpuExit<'_>, kvm_ioctls::Error>,
    dev: &mut Devices<'_>,
) -> Result<ExitAction, VcpuError> {
    let (id, m) = (dev.id, dev.metrics);
    Ok(match exit {
        Ok(VcpuExit::IoOut(port, data)) => {
            m.exits_io.fetch_add(1, Ordering::Relaxed);
            let action = PortBus::doorbell(port).unwrap_or_else(|| {
                dev.bus
                    .lock()
                    .map_or(PortAction::Handled, |mut b| b.write(port, data))
            });
            match action {
                PortAction::Handled => ExitAction::PortDone,
                PortAction::Unclaimed => {
                    guest_warn!(
                        m.unclaimed_ports,
                        "vCPU {id}: write to unclaimed port {port:#x}"
                    );
                    ExitAction::PortDone
                }
                PortAction::UnsupportedSleep(typ) => {
                    guest_warn!(
                        m.guest_warnings,
                        "vCPU {id}: ACPI sleep type {typ} requested; only S5 (power-off) is offered, the request is ignored"
                    );
                    ExitAction::PortDone
                }
                other => ExitAction::Port(other),
            }
        }
        Ok(VcpuExit::IoIn(port, data)) => {
            m.exits_io.fetch_add(1, Ordering::Relaxed);
            let action = dev
                .bus
                .lock()
                .map_or(PortAction::Handled, |mut b| b.read(port, data));
            if action == PortAction::Unclaimed {
                guest_warn!(
                    m.unclaimed_ports,
                    "vCPU {id}: read of unclaimed port {port:#x}"
                );
            }
            ExitAction::PortDone
        }
        Ok(VcpuExit::X86Rdmsr(exit)) => {
            m.exits_msr.fetch_add(1, Ordering::Relaxed);
            match dev.lwp.msr_read(exit.index) {
                Some(v) => {
                    *exit.data = v;
                    *exit.error = 0;
                }
                None => *exit.error = 1,
            }
            ExitAction::Done
        }
        Ok(VcpuExit::X86Wrmsr(exit)) => {
            m.exits_msr.fetch_add(1, Ordering::Relaxed);
            let ok = dev.lwp.msr_write(exit.index, exit.data);
            *exit.error = u8::from(!ok);
            if !ok {
                guest_warn!(
                    m.msr_gp,
                    "vCPU {id}: WRMSR {:#x} <- {:#x} refused with #GP",
                    exit.index,
                    exit.data
                );
            }
            ExitAction::Done
        }
        Ok(VcpuExit::Debug(exit)) => ExitAction::Debug(exit),
        Ok(VcpuExit::MmioRead(addr, data)) => {
            m.exits_mmio.fetch_add(1, Ordering::Relaxed);
            if IoapicDevice::claims(addr) {
                dev.ioapic.read(addr, data);
                ExitAction::Done
            } else if dev.virtio.read(addr, data) {
                ExitAction::Done
            } else {
                ExitAction::Unhandled(describe(&VcpuExit::MmioRead(addr, data)))
            }
        }
        Ok(VcpuExit::MmioWrite(addr, data)) => {
            m.exits_mmio.fetch_add(1, Ordering::Relaxed);
            if IoapicDevice::claims(addr) {
                dev.ioapic.write(addr, data).map_err(|e| VcpuError::Ioctl {
                    vcpu: id,
                    what: "KVM_SET_GSI_ROUTING",
                    source: e.0,
                })?;
                ExitAction::Done
            } else if dev.virtio.write(addr, data, dev.mem) {
                ExitAction::Done
            } else {
                ExitAction::Unhandled(describe(&VcpuExit::MmioWrite(addr, data)))
            }
        }
        // Only for a level-triggered route's vector, and every route is an
        // edge one (ioapic.rs): nothing waits for this EOI.
        Ok(VcpuExit::IoapicEoi(_)) => ExitAction::Done,
        Ok(VcpuExit::Shutdown) => ExitAction::Shutdown,
        Ok(VcpuExit::InternalError) => ExitAction::EmulationFailure,
        Ok(other) => ExitAction::Unhandled(describe(&other)),
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => ExitAction::Interrupted,
        Err(source) => return Err(VcpuError::Run { vcpu: id, source }),
    })
}

/// Runs what an exit asks for.
pub fn act(action: ExitAction, cx: &mut ExitCx<'_>) -> Result<VcpuStep, VcpuError> {
    let port = matches!(action, ExitAction::Port(_) | ExitAction::PortDone);
    if port && cx.lwp.stepper.state().step_from.is_some() {
        stepper::note_pio_step(cx);
    }
    match action {
        ExitAction::Done | ExitAction::PortDone => Ok(VcpuStep::Continue),
        ExitAction::Port(PortAction::End(end)) => Ok(VcpuStep::End(end)),
        ExitAction::Port(PortAction::SnapshotPoint) => Ok(VcpuStep::SnapshotPoint),
        ExitAction::Port(PortAction::UdDoorbell) => {
            doorbell::ud_doorbell(cx)?;
            Ok(VcpuStep::Continue)
        }
        ExitAction::Port(PortAction::LwpStateCall) => {
            state_call::lwp_state_call(cx);
            Ok(VcpuStep::Continue)
        }
        ExitAction::Port(PortAction::DbDoorbell) => {
            stepper::db_doorbell(cx);
            Ok(VcpuStep::Continue)
        }
        ExitAction::Port(PortAction::Halt) => {
            cx.vcpu.halt()?;
            Ok(VcpuStep::Continue)
        }
        ExitAction::Port(
            PortAction::Handled | PortAction::Unclaimed | PortAction::UnsupportedSleep(_),
        ) => Ok(VcpuStep::Continue),
        ExitAction::Debug(exit) => {
            if pf_entry::owns(&*cx.vcpu, &exit) {
                pf_entry::stop(cx)?;
            } else if cx.lwp.stepper.backend() == Some(StepBackend::GuestDebug) {
                stepper::debug_exit(cx, &exit)?;
            } else {
                return Err(VcpuError::Unhandled {
                    vcpu: cx.vcpu.id(),
                    exit: format!("{:?}", VcpuExit::Debug(exit)),
                    rip: cx.vcpu.regs().rip,
                    bytes: String::new(),
                });
            }
            Ok(VcpuStep::Continue)
        }
        ExitAction::EmulationFailure => doorbell::emulation_failure(cx),
        ExitAction::Interrupted => Ok(VcpuStep::Interrupted),
        ExitAction::Shutdown => Err(VcpuError::Shutdown {
            vcpu: cx.vcpu.id(),
            rip: cx.vcpu.regs().rip,
        }),
        ExitAction::Unhandled(exit) => Err(VcpuError::Unhandled {
            vcpu: cx.vcpu.id(),
            exit,
            rip: cx.vcpu.regs().rip,
            bytes: String::new(),
        }),
    }
}

/// An exit, named for an error message (addresses in hex).
fn describe(exit: &VcpuExit<'_>) -> String {
    match exit {
        VcpuExit::MmioRead(addr, data) => format!(
            "MmioRead ({} bytes at guest-physical {addr:#x}, which no device backs)",
            data.len()
        ),
        VcpuExit::MmioWrite(addr, data) => format!(
            "MmioWrite ({} bytes at guest-physical {addr:#x}, which no device backs)",
            data.len()
        ),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use kvm_ioctls::{MsrExitReason, ReadMsrExit, WriteMsrExit};
    use vmm_sys_util::eventfd::EventFd;

    use crate::lwp::cpuid::LwpProfile;
    use crate::lwp::msr::MSR_LWP_CFG;
    use crate::vmm::devices::port_bus::{GuestEnd, SerialOut};
    use crate::vmm::vcpu::testing::Rig;

    fn bus() -> (Mutex<PortBus>, Arc<Mutex<Vec<u8>>>) {
        let console = Arc::new(Mutex::new(Vec::new()));
        let out = SerialOut::Capture(Arc::clone(&console)).writer().unwrap();
        (
            Mutex::new(PortBus::new(out, EventFd::new(0).unwrap())),
            console,
        )
    }

    fn devices<'a>(
        bus: &'a Mutex<PortBus>,
        lwp: &'a mut VcpuLwp,
        metrics: &'a VcpuMetrics,
    ) -> Devices<'a> {
        static VIRTIO: std::sync::LazyLock<VirtioBus> =
            std::sync::LazyLock::new(VirtioBus::default);
        static MEM: std::sync::LazyLock<GuestMemory> = std::sync::LazyLock::new(|| {
            GuestMemory::from_ranges(&[(vm_memory::GuestAddress(0), 0x1000)]).unwrap()
        });
        static IOAPIC: std::sync::LazyLock<IoapicDevice> = std::sync::LazyLock::new(|| {
            IoapicDevice::new(Default::default(), Box::new(|_| Ok(()))).unwrap()
        });
        Devices {
            id: 0,
            bus,
            virtio: &VIRTIO,
            ioapic: &IOAPIC,
            mem: &MEM,
            lwp,
            metrics,
        }
    }

    #[test]
    fn port_exits() {
        let (bus, console) = bus();
        let mut lwp = VcpuLwp::new(LwpProfile::Emulated.caps(), true, None, None).unwrap();
        let metrics = VcpuMetrics::default();
        let mut dev = devices(&bus, &mut lwp, &metrics);
        // (port, byte written, action)
        let writes = [
            (0x3f8, b'x', ExitAction::PortDone),
            (
                0xf4,
                3,
                ExitAction::Port(PortAction::End(GuestEnd::ExitPort(3))),
            ),
            (
                0x5e,
                0,
                ExitAction::Port(PortAction::End(GuestEnd::PowerOff)),
            ),
            (0x5e, 2, ExitAction::Port(PortAction::Halt)),
            (0x5c, 0, ExitAction::Port(PortAction::UdDoorbell)),
            (0x5d, 1, ExitAction::Port(PortAction::LwpStateCall)),
            (0x5b, 0, ExitAction::Port(PortAction::DbDoorbell)),
            (0x81, 0, ExitAction::PortDone),
        ];
        for (port, value, want) in writes {
            let got = handle_exit(Ok(VcpuExit::IoOut(port, &[value])), &mut dev).unwrap();
            assert_eq!(got, want, "out {port:#x}");
        }
        assert_eq!(console.lock().unwrap().as_slice(), b"x");
        // The power port's halt halts the vCPU in KVM, and the run goes on.
        let mut rig = crate::vmm::vcpu::testing::Rig::new(LwpProfile::Emulated, None);
        let step = act(ExitAction::Port(PortAction::Halt), &mut rig.cx()).unwrap();
        assert!(matches!(step, VcpuStep::Continue));
        assert_eq!(rig.vcpu.halts, 1);
        // (port, value read, unclaimed)
        for (port, want, unclaimed) in [(0x71, 0, false), (0x62, 0xff, true)] {
            let before = metrics.counters().unclaimed_ports;
            let mut data = [0x55u8];
            let got = handle_exit(Ok(VcpuExit::IoIn(port, &mut data)), &mut dev).unwrap();
            assert_eq!((got, data[0]), (ExitAction::PortDone, want), "in {port:#x}");
            assert_eq!(metrics.counters().unclaimed_ports > before, unclaimed);
        }
        assert_eq!(
            metrics.counters().unclaimed_ports,
            2,
            "out 0x81 and in 0x62"
        );
        assert_eq!(metrics.counters().exits_io, 10);
    }

    #[test]
    fn msr_exits() {
        let (bus, _) = bus();
        let mut lwp = VcpuLwp::new(LwpProfile::Bulldozer.caps(), true, None, None).unwrap();
        let metrics = VcpuMetrics::default();
        let mut dev = devices(&bus, &mut lwp, &metrics);
        // (index, value written, error on the write, error on the read, value read)
        let table = [
            (
                MSR_LWP_CFG,
                0x0000_4000_8000_000E,
                0,
                0,
                0x0000_4000_8000_000E,
            ),
            (MSR_LWP_CFG, 1 << 5, 1, 0, 0x0000_4000_8000_000E),
            (0xC000_0107, 0, 1, 1, 0),
        ];
        for (index, value, write_error, read_error, read) in table {
            let mut error = 9;
            let exit = WriteMsrExit {
                error: &mut error,
                reason: MsrExitReason::Filter,
                index,
                data: value,
            };
            let got = handle_exit(Ok(VcpuExit::X86Wrmsr(exit)), &mut dev).unwrap();
            assert_eq!(
                (got, error),
                (ExitAction::Done, write_error),
                "wrmsr {index:#x}"
            );
            let (mut error, mut data) = (9, 0);
            let exit = ReadMsrExit {
                error: &mut error,
                reason: MsrExitReason::Filter,
                index,
                data: &mut data,
            };
            handle_exit(Ok(VcpuExit::X86Rdmsr(exit)), &mut dev).unwrap();
            assert_eq!((error, data), (read_error, read), "rdmsr {index:#x}");
        }
        assert_eq!(metrics.counters().msr_gp, 2);
    }

    #[test]
    fn the_ioapic_window_is_answered_and_a_failed_route_update_is_an_error() {
        use crate::vmm::devices::ioapic::{IOAPIC_BASE, RoutingError};
        let (bus, _) = bus();
        let mut lwp = VcpuLwp::new(LwpProfile::Off.caps(), false, None, None).unwrap();
        let metrics = VcpuMetrics::default();
        let mut dev = devices(&bus, &mut lwp, &metrics);
        let write = |dev: &mut Devices<'_>, offset: u64, value: u32| {
            handle_exit(
                Ok(VcpuExit::MmioWrite(
                    IOAPIC_BASE + offset,
                    &value.to_le_bytes(),
                )),
                dev,
            )
        };
        // IOREGSEL = 1 (the version register), then IOWIN.
        assert_eq!(write(&mut dev, 0, 1).unwrap(), ExitAction::Done);
        let mut data = [0u8; 4];
        let read = handle_exit(
            Ok(VcpuExit::MmioRead(IOAPIC_BASE + 0x10, &mut data)),
            &mut dev,
        );
        assert_eq!(read.unwrap(), ExitAction::Done);
        assert_eq!(u32::from_le_bytes(data), 0x0017_0020);
        let eoi = handle_exit(Ok(VcpuExit::IoapicEoi(0x30)), &mut dev);
        assert_eq!(eoi.unwrap(), ExitAction::Done);
        assert_eq!(metrics.counters().exits_mmio, 2);
        let failing = IoapicDevice::new(
            Default::default(),
            Box::new(|routes| match routes {
                [] => Ok(()),
                _ => Err(RoutingError(kvm_ioctls::Error::new(libc::ENOMEM))),
            }),
        )
        .unwrap();
        dev.ioapic = &failing;
        write(&mut dev, 0, 0x10).unwrap();
        let err = write(&mut dev, 0x10, 0x30).unwrap_err();
        assert!(err.to_string().contains("KVM_SET_GSI_ROUTING"), "{err}");
    }

    #[test]
    fn other_exits_are_named_errors() {
        let (bus, _) = bus();
        let mut r = Rig::new(LwpProfile::Emulated, None);
        r.vcpu.regs.rip = 0x1234;
        let mut mmio = [0u8; 4];
        // A breakpoint's Debug exit where no breakpoint is set and nothing
        // steps.
        let debug = kvm_debug_exit_arch {
            pc: 0x1234,
            dr6: 1,
            ..Default::default()
        };
        // (exit, action, error text when acted on)
        let table: [(
            Result<VcpuExit<'_>, kvm_ioctls::Error>,
            ExitAction,
            Option<&str>,
        ); 7] = [
            (
                Ok(VcpuExit::Debug(debug)),
                ExitAction::Debug(debug),
                Some("unhandled exit Debug"),
            ),
            (
                Ok(VcpuExit::Hlt),
                ExitAction::Unhandled("Hlt".into()),
                Some("unhandled exit Hlt at RIP 0x1234"),
            ),
            (
                Ok(VcpuExit::MmioRead(0xfed0_0000, &mut mmio)),
                ExitAction::Unhandled(
                    "MmioRead (4 bytes at guest-physical 0xfed00000, which no device backs)".into(),
                ),
                Some("which no device backs"),
            ),
            (
                Ok(VcpuExit::Shutdown),
                ExitAction::Shutdown,
                Some("the guest shut down"),
            ),
            (
                Ok(VcpuExit::InternalError),
                ExitAction::EmulationFailure,
                Some("suberror 1"),
            ),
            (
                Err(kvm_ioctls::Error::new(libc::EINTR)),
                ExitAction::Interrupted,
                None,
            ),
            (
                Err(kvm_ioctls::Error::new(libc::EAGAIN)),
                ExitAction::Interrupted,
                None,
            ),
        ];
        for (exit, want, error) in table {
            let mut dev = devices(&bus, &mut r.lwp, &r.metrics);
            let action = handle_exit(exit, &mut dev).unwrap();
            assert_eq!(action, want);
            match (act(action, &mut r.cx()), error) {
                (Err(e), Some(text)) => assert!(e.to_string().contains(text), "{e}"),
                (Ok(VcpuStep::Interrupted), None) => {}
                (got, want) => panic!("{got:?}, want an error with {want:?}"),
            }
        }
        let mut dev = devices(&bus, &mut r.lwp, &r.metrics);
        let failed = handle_exit(Err(kvm_ioctls::Error::new(libc::EBADF)), &mut dev);
        assert!(matches!(failed, Err(VcpuError::Run { .. })));
    }
}
