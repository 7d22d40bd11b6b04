//! The port-I/O devices: the 8250 UART at 0x3f8 (vm-superio), the ACPI PM
//! registers (pm.rs), QEMU's isa-debug-exit port at 0xf4, the paravirtual
//! power port, the legacy ports a Linux guest needs answered (the CMOS
//! data port, the keyboard controller's reset command, and the ports of the
//! PICs this machine does not have), channel 2 of the PIT (pit.rs), and the
//! paravirtual doorbell ports, which only the vCPU loop can answer (they
//! need the vCPU's registers).

use std::io::{self, LineWriter, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use vm_superio::serial::{NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::hostfs::{self, Fifo, HostFsError, StreamMode};
use crate::vmm::base::pv::{
    DB_PORT, EXIT_PORT, POWER_PORT, PowerOp, SNAPSHOT_PORT, STATE_PORT, UD_PORT,
};
use crate::vmm::devices::pit::Pit;
use crate::vmm::devices::pm::{PM_LAST_PORT, PM1A_EVT_PORT, PmAction, PmRegisters, PmState};

/// The serial port's first register.
pub const SERIAL_BASE: u16 = 0x3f8;
/// The serial port's GSI.
pub const SERIAL_IRQ: u32 = 4;
/// The POST diagnostic port: writes are accepted and dropped (guests use it
/// as a cheap exit, e.g. for I/O delays).
pub const POST_PORT: u16 = 0x80;
/// The CMOS/RTC index and data ports. There is no RTC: the data port reads
/// 0, because Linux spins on the update-in-progress bit while it reads 1,
/// about 2 s of emulated boot on kvm_pvm, and writes are dropped (Linux
/// writes the warm-reset code before it starts each application processor).
const CMOS_INDEX_PORT: u16 = 0x70;
const CMOS_DATA_PORT: u16 = 0x71;
/// The keyboard controller (i8042), as an idle one with no keyboard: its
/// data port reads 0, its status port reads 0 (no input waiting, nothing
/// to read) so Linux's wait for an empty input buffer ends at once, other
/// commands are dropped, and 0xfe pulses the reset line, which is how
/// Linux reboots with `reboot=k` (a status of all ones made every reboot
/// and panic spin for about 2 s with a warning per read).
const KBD_DATA_PORT: u16 = 0x60;
const KBD_COMMAND_PORT: u16 = 0x64;
const KBD_RESET: u8 = 0xfe;
/// The two 8259 PICs' ports. The machine has no PICs (ioapic.rs): writes
/// are dropped and reads are all ones, which is how Linux's probe tells
/// that there is no PIC, without a warning for each.
const PIC_PORTS: [u16; 4] = [0x20, 0x21, 0xa0, 0xa1];
/// The PCI configuration mechanisms' ports (CONFIG_ADDRESS at 0xCF8,
/// CONFIG_DATA at 0xCFC, mechanism 2's at 0xCFA and 0xCFB). The machine
/// has no PCI bus, as a PC without a host bridge: writes are dropped and
/// reads are all ones, so a distribution kernel's probes (type 1, then
/// type 2) find no bus, without a warning for each.
const PCI_CONFIG_PORTS: std::ops::RangeInclusive<u16> = 0xcf8..=0xcff;

/// Where the guest's serial output goes.
#[derive(Debug, Clone)]
pub enum SerialOut {
    /// Standard output.
    Stdout,
    /// A file, created or truncated.
    File(PathBuf),
    /// A shared buffer (tests, the demo's summary).
    Capture(Arc<Mutex<Vec<u8>>>),
}

struct CaptureWriter(Arc<Mutex<Vec<u8>>>);

impl Write for CaptureWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("serial capture lock poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SerialOut {
    /// Opens the destination. Standard output and files are written through
    /// line by line, so that a run that is killed leaves its console behind.
    /// A file is a regular file (or a new one), never a device, a FIFO or
    /// a link (`crate::hostfs::open_stream`).
    pub fn writer(&self) -> Result<Box<dyn Write + Send>, HostFsError> {
        Ok(match self {
            SerialOut::Stdout => Box::new(io::stdout()),
            SerialOut::File(path) => Box::new(LineWriter::new(hostfs::open_stream(
                path,
                StreamMode::Truncate,
                Fifo::Refused,
            )?)),
            SerialOut::Capture(buf) => Box::new(CaptureWriter(Arc::clone(buf))),
        })
    }
}

/// Raises the serial interrupt through an irqfd.
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// How the guest ended the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestEnd {
    /// It wrote this value to the exit port.
    ExitPort(u8),
    /// It powered off, through the paravirtual power port or by entering
    /// ACPI S5.
    PowerOff,
    /// It asked for a reboot (keyboard-controller reset or the power port).
    /// lwpvmm does not restart guests: the VM ends.
    Reboot,
    /// Not the guest's doing: the console's reader went away (standard
    /// output is a pipe whose other end closed, as with `| head`). The VM
    /// ends cleanly, as on SIGHUP, with its trace and metrics written.
    OutputClosed,
    /// Not the guest's doing: a write to the console failed otherwise (the
    /// `--serial` file's file system is full, its size limit reached). The
    /// VM stops at the first byte lost, and the run fails with the error
    /// ([`PortBus::take_console_error`]) instead of going on without a
    /// console.
    ConsoleFailed,
}

impl std::fmt::Display for GuestEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestEnd::ExitPort(v) => write!(f, "the guest wrote {v} to the exit port"),
            GuestEnd::PowerOff => f.write_str("the guest powered off"),
            GuestEnd::Reboot => f.write_str("the guest asked for a reboot"),
            GuestEnd::OutputClosed => f.write_str("standard output was closed"),
            GuestEnd::ConsoleFailed => f.write_str("a write to the console failed"),
        }
    }
}

/// What a port access asks of the vCPU loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortAction {
    /// Done.
    Handled,
    /// The guest ended the VM.
    End(GuestEnd),
    /// The #UD doorbell: the vCPU loop emulates the LWP instruction.
    UdDoorbell,
    /// An LWP state call (save or restore component 62).
    LwpStateCall,
    /// The #DB doorbell: a single-step trap for precise events.
    DbDoorbell,
    /// The guest asks for a snapshot at this point (`--snapshot-on-port`).
    SnapshotPoint,
    /// The guest halts the vCPU until an interrupt (the power port's
    /// [`PowerOp::Halt`]).
    Halt,
    /// The guest asked for an ACPI sleep state that is not offered (its
    /// SLP_TYP): the write is ignored.
    UnsupportedSleep(u16),
    /// No device at this port.
    Unclaimed,
}

/// The devices on the port bus.
pub struct PortBus {
    serial: Serial<IrqTrigger, NoEvents, Box<dyn Write + Send>>,
    pm: PmRegisters,
    pit: Pit,
    /// What the PIT's time counts from.
    since: Instant,
    snapshot_port: bool,
    /// The first error writing the console met, until the run takes it.
    console_error: Option<io::Error>,
}

impl PortBus {
    /// The bus with its serial output going to `out`; `irq` is the eventfd
    /// wired to the serial GSI.
    pub fn new(out: Box<dyn Write + Send>, irq: EventFd) -> Self {
        PortBus {
            serial: Serial::new(IrqTrigger(irq), out),
            pm: PmRegisters::new(PmState::default()),
            pit: Pit::default(),
            since: Instant::now(),
            snapshot_port: false,
            console_error: None,
        }
    }

    /// Claims the snapshot debug port (docs/pv-abi.md): off by default.
    pub fn claim_snapshot_port(&mut self) {
        self.snapshot_port = true;
    }

    /// The bus with the UART's and the PM registers restored from a
    /// snapshot.
    pub fn from_state(
        out: Box<dyn Write + Send>,
        irq: EventFd,
        state: &SerialSnapshot,
        pm: PmState,
    ) -> io::Result<Self> {
        let s = SerialState {
            baud_divisor_low: state.baud_divisor_low,
            baud_divisor_high: state.baud_divisor_high,
            interrupt_enable: state.interrupt_enable,
            interrupt_identification: state.interrupt_identification,
            line_control: state.line_control,
            line_status: state.line_status,
            modem_control: state.modem_control,
            modem_status: state.modem_status,
            scratch: state.scratch,
            in_buffer: state.in_buffer.clone(),
        };
        let serial = Serial::from_state(&s, IrqTrigger(irq), NoEvents, out)
            .map_err(|e| io::Error::other(format!("serial state: {e:?}")))?;
        Ok(PortBus {
            serial,
            pm: PmRegisters::new(pm),
            pit: Pit::default(),
            since: Instant::now(),
            snapshot_port: false,
            console_error: None,
        })
    }

    /// The PM registers' state, for a snapshot.
    pub fn pm_state(&self) -> PmState {
        self.pm.state()
    }

    /// The UART's registers, for a snapshot.
    pub fn serial_state(&self) -> SerialSnapshot {
        let s = self.serial.state();
        SerialSnapshot {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer,
        }
    }

    /// What an OUT to a paravirtual doorbell port asks for: the vCPU loop
    /// answers these with the vCPU alone, without the bus or its lock, which
    /// the vCPUs share.
    pub fn doorbell(port: u16) -> Option<PortAction> {
        match port {
            UD_PORT => Some(PortAction::UdDoorbell),
            STATE_PORT => Some(PortAction::LwpStateCall),
            DB_PORT => Some(PortAction::DbDoorbell),
            _ => None,
        }
    }

    /// An OUT of `data` (1, 2 or 4 bytes; only the PM registers take more
    /// than the first).
    pub fn write(&mut self, port: u16, data: &[u8]) -> PortAction {
        if let Some(action) = Self::doorbell(port) {
            return action;
        }
        let value = data.first().copied().unwrap_or(0);
        match port {
            PM1A_EVT_PORT..=PM_LAST_PORT => match self.pm.write(port, data) {
                PmAction::Handled => PortAction::Handled,
                PmAction::PowerOff => PortAction::End(GuestEnd::PowerOff),
                PmAction::UnsupportedSleep(typ) => PortAction::UnsupportedSleep(typ),
            },
            SERIAL_BASE..=0x3ff => match self.serial.write((port - SERIAL_BASE) as u8, value) {
                // Nobody reads the console any more: the end of the output
                // is the end of the run.
                Err(vm_superio::serial::Error::IOError(e))
                    if e.kind() == io::ErrorKind::BrokenPipe =>
                {
                    PortAction::End(GuestEnd::OutputClosed)
                }
                // Any other failed write would lose the rest of the
                // console without a word: the run stops here instead,
                // with the error.
                Err(vm_superio::serial::Error::IOError(e)) => {
                    self.console_error.get_or_insert(e);
                    PortAction::End(GuestEnd::ConsoleFailed)
                }
                // A failed interrupt trigger (the irqfd) loses no output.
                _ => PortAction::Handled,
            },
            EXIT_PORT => PortAction::End(GuestEnd::ExitPort(value)),
            POST_PORT | CMOS_INDEX_PORT | CMOS_DATA_PORT => PortAction::Handled,
            p if Pit::claims(p) => {
                self.pit.write(p, value, self.since.elapsed());
                PortAction::Handled
            }
            p if PIC_PORTS.contains(&p) || PCI_CONFIG_PORTS.contains(&p) => PortAction::Handled,
            KBD_COMMAND_PORT if value == KBD_RESET => PortAction::End(GuestEnd::Reboot),
            KBD_COMMAND_PORT | KBD_DATA_PORT => PortAction::Handled,
            POWER_PORT => match PowerOp::try_from(value) {
                Ok(PowerOp::Off) => PortAction::End(GuestEnd::PowerOff),
                Ok(PowerOp::Reboot) => PortAction::End(GuestEnd::Reboot),
                Ok(PowerOp::Halt) => PortAction::Halt,
                Err(_) => PortAction::Unclaimed,
            },
            SNAPSHOT_PORT if self.snapshot_port => PortAction::SnapshotPoint,
            _ => PortAction::Unclaimed,
        }
    }

    /// An IN: unclaimed ports read as all ones, as on a PC bus.
    pub fn read(&mut self, port: u16, data: &mut [u8]) -> PortAction {
        match port {
            CMOS_DATA_PORT | KBD_DATA_PORT | KBD_COMMAND_PORT => {
                data.fill(0);
                PortAction::Handled
            }
            p if Pit::claims(p) => {
                let v = self.pit.read(p, self.since.elapsed());
                data.fill(v);
                PortAction::Handled
            }
            p if PIC_PORTS.contains(&p) || PCI_CONFIG_PORTS.contains(&p) => {
                data.fill(0xff);
                PortAction::Handled
            }
            PM1A_EVT_PORT..=PM_LAST_PORT => {
                self.pm.read(port, data);
                PortAction::Handled
            }
            SERIAL_BASE..=0x3ff => {
                let v = self.serial.read((port - SERIAL_BASE) as u8);
                data.iter_mut().for_each(|b| *b = v);
                PortAction::Handled
            }
            _ => {
                data.iter_mut().for_each(|b| *b = 0xff);
                PortAction::Unclaimed
            }
        }
    }

    /// Feeds console input to the guest.
    pub fn serial_input(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.serial
            .enqueue_raw_bytes(bytes)
            .map(|_| ())
            .map_err(|e| io::Error::other(format!("{e:?}")))
    }

    /// Flushes console output; an error (but a closed reader's) is kept
    /// for [`PortBus::take_console_error`].
    pub fn flush(&mut self) {
        if let Err(e) = self.serial.writer_mut().flush()
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            self.console_error.get_or_insert(e);
        }
    }

    /// The first error writing the console met ([`GuestEnd::ConsoleFailed`]),
    /// once.
    pub fn take_console_error(&mut self) -> Option<io::Error> {
        self.console_error.take()
    }
}

/// The 8250's registers (vm-superio's `SerialState`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct SerialSnapshot {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports() {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let mut bus = PortBus::new(
            SerialOut::Capture(Arc::clone(&buf)).writer().unwrap(),
            EventFd::new(0).unwrap(),
        );
        for b in b"hi" {
            assert_eq!(bus.write(0x3f8, &[*b]), PortAction::Handled);
        }
        assert_eq!(&*buf.lock().unwrap(), b"hi");
        // (port, byte written, action)
        let table = [
            (0xf4, 3, PortAction::End(GuestEnd::ExitPort(3))),
            (0x5e, 0, PortAction::End(GuestEnd::PowerOff)),
            (0x5e, 1, PortAction::End(GuestEnd::Reboot)),
            (0x5e, 2, PortAction::Halt),
            (0x5e, 3, PortAction::Unclaimed),
            (0x64, 0xfe, PortAction::End(GuestEnd::Reboot)),
            (0x64, 0xad, PortAction::Handled),
            (0x60, 0xf4, PortAction::Handled),
            (0x70, 0x0a, PortAction::Handled),
            (0x71, 0x0a, PortAction::Handled),
            (0x5c, 0, PortAction::UdDoorbell),
            (0x5d, 1, PortAction::LwpStateCall),
            (0x5b, 0, PortAction::DbDoorbell),
            (0x80, 0, PortAction::Handled),
            (0x81, 0, PortAction::Unclaimed),
            (0x5a, 0, PortAction::Unclaimed),
        ];
        for (port, value, want) in table {
            assert_eq!(bus.write(port, &[value]), want, "{port:#x}");
        }
        assert_eq!(
            bus.write(0x604, &[0x00, 0x34]),
            PortAction::End(GuestEnd::PowerOff),
            "S5"
        );
        assert_eq!(
            bus.write(0x604, &[0x00, 0x2c]),
            PortAction::UnsupportedSleep(3),
            "S3 is not offered"
        );
        let mut cnt = [0u8; 2];
        assert_eq!(bus.read(0x604, &mut cnt), PortAction::Handled);
        assert_eq!(cnt[0] & 1, 1, "SCI_EN: always in ACPI mode");
        bus.claim_snapshot_port();
        assert_eq!(bus.write(0x5a, &[0]), PortAction::SnapshotPoint);
        let mut d = [0u8; 1];
        assert_eq!(bus.read(0x62, &mut d), PortAction::Unclaimed);
        assert_eq!(d, [0xff]);
        // The PIT's ports (an idle channel 2) and the absent PICs: (port,
        // what a read gives).
        for (port, want) in [
            (0x40, 0),
            (0x41, 0),
            (0x42, 0),
            (0x43, 0),
            (0x61, 0),
            (0x20, 0xff),
            (0x21, 0xff),
            (0xa0, 0xff),
            (0xa1, 0xff),
            // No PCI bus: CONFIG_ADDRESS does not keep what is written,
            // CONFIG_DATA reads as no device.
            (0xcf8, 0xff),
            (0xcfa, 0xff),
            (0xcfc, 0xff),
            (0xcff, 0xff),
            // The idle i8042: nothing to read, input buffer empty.
            (0x60, 0),
            (0x64, 0),
        ] {
            let mut d = [0x5au8; 1];
            assert_eq!(bus.read(port, &mut d), PortAction::Handled, "{port:#x}");
            assert_eq!(d, [want], "{port:#x}");
            assert_eq!(bus.write(port, &[0x11]), PortAction::Handled, "{port:#x}");
        }
        assert_eq!(bus.read(0x71, &mut d), PortAction::Handled);
        assert_eq!(d, [0], "no RTC update in progress");
        assert_eq!(bus.read(0x3fd, &mut d), PortAction::Handled);
        assert_ne!(d[0] & 0x20, 0, "transmitter empty");
    }

    /// A console that fails with `kind`.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_console_write_that_fails_ends_the_vm() {
        // (how the write fails, how the VM ends, whether the error is kept)
        let table = [
            (io::ErrorKind::BrokenPipe, GuestEnd::OutputClosed, false),
            (io::ErrorKind::StorageFull, GuestEnd::ConsoleFailed, true),
            (io::ErrorKind::FileTooLarge, GuestEnd::ConsoleFailed, true),
        ];
        for (kind, end, kept) in table {
            let mut bus = PortBus::new(Box::new(Failing(kind)), EventFd::new(0).unwrap());
            assert_eq!(bus.write(0x3f8, b"x"), PortAction::End(end), "{kind:?}");
            let error = bus.take_console_error();
            assert_eq!(error.map(|e| e.kind()), kept.then_some(kind), "{kind:?}");
            assert!(bus.take_console_error().is_none(), "{kind:?}: taken once");
        }
    }
}
