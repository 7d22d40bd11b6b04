//! The ACPI power-management registers the FADT points at (acpi.rs): the
//! PM1a event block (status and enable), the PM1a control block and the PM
//! timer, at fixed ports. They make lwpvmm a full (not hardware-reduced)
//! ACPI platform: a hardware-reduced one has no PM timer, and the PM timer
//! is the reference a kernel without kvmclock calibrates its TSC against
//! here (its PIT calibration fails under kvm_pvm's emulated CPL0, and there
//! is no HPET; cpuid.rs says why our own Linux uses kvmclock instead).
//!
//! The system is always in ACPI mode (the FADT has no SMI command port, so
//! SCI_EN reads 1) and no fixed event ever fires, so no SCI is raised.
//! Writing SLP_EN with the S5 sleep type the DSDT's `_S5` names powers the
//! VM off; the other sleep states are not offered.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// First port of the PM1a event block (PM1_STS, then PM1_EN).
pub const PM1A_EVT_PORT: u16 = 0x600;
/// Bytes of the PM1a event block.
pub const PM1_EVT_LEN: u8 = 4;
/// The PM1a control block (PM1_CNT).
pub const PM1A_CNT_PORT: u16 = 0x604;
/// Bytes of the PM1a control block.
pub const PM1_CNT_LEN: u8 = 2;
/// The PM timer.
pub const PM_TMR_PORT: u16 = 0x608;
/// Bytes of the PM timer.
pub const PM_TMR_LEN: u8 = 4;
/// Last port of the three blocks.
pub const PM_LAST_PORT: u16 = PM_TMR_PORT + PM_TMR_LEN as u16 - 1;
/// The SLP_TYP value of S5 (soft off), as the DSDT's `_S5` gives it.
pub const SLP_TYP_S5: u16 = 5;
/// The PM timer's frequency (ACPI: 3.579545 MHz).
const PM_TIMER_HZ: u128 = 3_579_545;
const SCI_EN: u16 = 1 << 0;
const SLP_TYP_SHIFT: u16 = 10;
const SLP_TYP_MASK: u16 = 7 << SLP_TYP_SHIFT;
const SLP_EN: u16 = 1 << 13;

/// What a PM register access asks of the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmAction {
    /// Done.
    Handled,
    /// The guest entered S5.
    PowerOff,
    /// The guest asked for a sleep state lwpvmm does not offer (its SLP_TYP).
    UnsupportedSleep(u16),
}

/// The registers' state, as a snapshot holds it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmState {
    /// PM1_EN.
    pub enable: u16,
    /// PM1_CNT's sleep type field, as last written.
    pub sleep_type: u16,
    /// The PM timer's value when the state was taken.
    pub timer: u32,
}

/// The PM registers.
#[derive(Debug)]
pub struct PmRegisters {
    state: PmState,
    since: Instant,
}

impl PmRegisters {
    /// Registers that continue from `state` (a fresh VM's is the default).
    pub fn new(state: PmState) -> Self {
        PmRegisters {
            state,
            since: Instant::now(),
        }
    }

    fn timer(&self) -> u32 {
        let ticks = self.since.elapsed().as_nanos() * PM_TIMER_HZ / 1_000_000_000;
        // The timer is 32 bits wide (FADT TMR_VAL_EXT) and wraps.
        self.state.timer.wrapping_add(ticks as u32)
    }

    /// The registers' state now.
    pub fn state(&self) -> PmState {
        PmState {
            timer: self.timer(),
            ..self.state
        }
    }

    /// The 12 bytes of the three blocks as reads see them (the gap between
    /// the control block and the timer reads 0).
    fn bytes(&self) -> [u8; 12] {
        let mut b = [0u8; 12];
        // PM1_STS (0..2) stays 0: no fixed event ever happens.
        b[2..4].copy_from_slice(&self.state.enable.to_le_bytes());
        let control = SCI_EN | (self.state.sleep_type << SLP_TYP_SHIFT);
        b[4..6].copy_from_slice(&control.to_le_bytes());
        b[8..12].copy_from_slice(&self.timer().to_le_bytes());
        b
    }

    /// An IN of `data.len()` bytes at `port` (within the blocks).
    pub fn read(&self, port: u16, data: &mut [u8]) {
        let regs = self.bytes();
        for (i, d) in data.iter_mut().enumerate() {
            let at = usize::from(port - PM1A_EVT_PORT) + i;
            *d = regs.get(at).copied().unwrap_or(0xff);
        }
    }

    /// An OUT of `data` at `port` (within the blocks).
    pub fn write(&mut self, port: u16, data: &[u8]) -> PmAction {
        let mut action = PmAction::Handled;
        for (i, &byte) in data.iter().enumerate() {
            let at = usize::from(port - PM1A_EVT_PORT) + i;
            let shift = 8 * (at % 2);
            let keep = !(0xffu16 << shift);
            let value = u16::from(byte) << shift;
            match at {
                2 | 3 => self.state.enable = (self.state.enable & keep) | value,
                4 | 5 => {
                    let control = (self.state.sleep_type << SLP_TYP_SHIFT & keep) | value;
                    self.state.sleep_type = (control & SLP_TYP_MASK) >> SLP_TYP_SHIFT;
                    if value & SLP_EN != 0 {
                        action = match self.state.sleep_type {
                            SLP_TYP_S5 => PmAction::PowerOff,
                            other => PmAction::UnsupportedSleep(other),
                        };
                    }
                }
                // PM1_STS is write-1-to-clear and always 0; the timer is
                // read-only.
                _ => {}
            }
        }
        action
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pm: &PmRegisters, port: u16, len: usize) -> u32 {
        let mut d = [0u8; 4];
        pm.read(port, &mut d[..len]);
        u32::from_le_bytes(d)
    }

    #[test]
    fn registers_read_and_write_as_the_fadt_describes_them() {
        let mut pm = PmRegisters::new(PmState::default());
        // (port, bytes written, action, port read, width, value read)
        type Row = (u16, &'static [u8], PmAction, u16, usize, u32);
        let table: [Row; 8] = [
            (0x602, &[0x21, 0x01], PmAction::Handled, 0x602, 2, 0x0121),
            (0x603, &[0x00], PmAction::Handled, 0x602, 2, 0x0021),
            (0x600, &[0xff, 0xff], PmAction::Handled, 0x600, 2, 0),
            (0x604, &[0x01, 0x00], PmAction::Handled, 0x604, 2, 1),
            (0x605, &[0x0c], PmAction::Handled, 0x604, 2, 0x0c01),
            (0x604, &[0x00, 0x14], PmAction::Handled, 0x604, 2, 0x1401),
            (0x604, &[0x00, 0x34], PmAction::PowerOff, 0x605, 1, 0x14),
            (
                0x604,
                &[0x00, 0x24],
                PmAction::UnsupportedSleep(1),
                0x604,
                2,
                0x0401,
            ),
        ];
        for (i, (port, bytes, action, rport, width, value)) in table.into_iter().enumerate() {
            assert_eq!(pm.write(port, bytes), action, "row {i}");
            assert_eq!(read(&pm, rport, width), value, "row {i}");
        }
    }

    #[test]
    fn the_timer_runs_at_3_58_mhz_and_continues_from_a_snapshot() {
        let pm = PmRegisters::new(PmState {
            timer: u32::MAX - 50_000,
            ..PmState::default()
        });
        let first = read(&pm, PM_TMR_PORT, 4);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let second = read(&pm, PM_TMR_PORT, 4);
        let ticks = second.wrapping_sub(first);
        // 20 ms is 71,591 ticks; a loaded host only sleeps longer.
        assert!((71_000..3_579_545).contains(&ticks), "{ticks} ticks");
        assert!(second < 3_579_545, "wrapped at 32 bits: {second:#x}");
        let later = PmRegisters::new(pm.state());
        assert!(read(&later, PM_TMR_PORT, 4).wrapping_sub(second) < 3_579_545);
        let mut d = [0u8; 2];
        pm.read(0x606, &mut d);
        assert_eq!(d, [0, 0], "the gap reads 0");
    }
}
