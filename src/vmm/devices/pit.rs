//! Channel 2 of the 8254 PIT and its gate port (0x61): the one timer of the
//! PC a kernel without kvmclock calibrates its TSC with. The machine has no
//! PIT otherwise (ioapic.rs: KVM's in-kernel PIT is gone with its teardown
//! cost), but Linux times its calibration window by channel 2 even when it
//! measures against the PM timer: it programs a count, raises the gate and
//! spins on 0x61 until the channel's output goes high. Without a counting
//! channel that window is empty and the calibration fails, leaving the
//! kernel without a TSC frequency.
//!
//! What is modelled: the mode/command register for channel 2 (counter
//! latch included), the count written LSB, MSB or both, a counter that
//! counts down at 1.193182 MHz of host time from the moment the count is
//! written with the gate high (or the gate rises), and the output going
//! high at terminal count (mode 0, what Linux uses; other modes count the
//! same way). Channels 0 and 1 have no interrupt line to drive and are not
//! modelled: their ports read 0 and drop writes. Not in a snapshot: a
//! kernel uses the channel only while it boots, and a restored one starts
//! idle.

use std::time::Duration;

/// The PIT's input clock.
const PIT_HZ: u128 = 1_193_182;
/// Channel 0's counter port; channel 1's is next, then channel 2's.
pub const CHANNEL0_PORT: u16 = 0x40;
/// Channel 2's counter.
pub const CHANNEL2_PORT: u16 = 0x42;
/// The mode/command register.
pub const COMMAND_PORT: u16 = 0x43;
/// NMI status and control: channel 2's gate (bit 0), the speaker's data
/// (bit 1) and the channel's output (bit 5).
pub const GATE_PORT: u16 = 0x61;
const GATE: u8 = 1 << 0;
const SPEAKER: u8 = 1 << 1;
const OUT2: u8 = 1 << 5;

/// How the count register is read and written (the command's bits 5-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Lsb,
    Msb,
    /// LSB then MSB.
    Word,
}

/// Channel 2 and its gate. Times are host time since the bus was made.
#[derive(Debug, Clone)]
pub struct Pit {
    access: Access,
    count: u16,
    /// The first byte of a word being written.
    low_written: Option<u8>,
    /// A word read half done: the MSB comes next.
    msb_next: bool,
    latched: Option<u16>,
    gate: bool,
    speaker: bool,
    /// Whether a count was written since the last mode command.
    armed: bool,
    /// When the counter started counting down from `count`.
    started: Option<Duration>,
}

impl Default for Pit {
    fn default() -> Self {
        Pit {
            access: Access::Word,
            count: 0,
            low_written: None,
            msb_next: false,
            latched: None,
            gate: false,
            speaker: false,
            armed: false,
            started: None,
        }
    }
}

impl Pit {
    /// Whether the PIT answers `port`.
    pub fn claims(port: u16) -> bool {
        (CHANNEL0_PORT..=COMMAND_PORT).contains(&port) || port == GATE_PORT
    }

    /// A write of `value` to `port` at `now`.
    pub fn write(&mut self, port: u16, value: u8, now: Duration) {
        match port {
            COMMAND_PORT if value >> 6 == 2 => self.command(value, now),
            CHANNEL2_PORT => self.write_count(value, now),
            GATE_PORT => {
                let rising = value & GATE != 0 && !self.gate;
                self.gate = value & GATE != 0;
                self.speaker = value & SPEAKER != 0;
                if rising && self.armed {
                    self.started = Some(now);
                }
            }
            _ => {}
        }
    }

    /// A read of `port` at `now`.
    pub fn read(&mut self, port: u16, now: Duration) -> u8 {
        match port {
            CHANNEL2_PORT => self.read_count(now),
            GATE_PORT => {
                u8::from(self.gate)
                    | (u8::from(self.speaker) << 1)
                    | if self.expired(now) { OUT2 } else { 0 }
            }
            _ => 0,
        }
    }

    fn command(&mut self, value: u8, now: Duration) {
        let access = match (value >> 4) & 3 {
            0 => {
                self.latched = Some(self.counter(now));
                self.msb_next = false;
                return;
            }
            1 => Access::Lsb,
            2 => Access::Msb,
            _ => Access::Word,
        };
        // A mode command stops the channel until a count is written.
        *self = Pit {
            access,
            gate: self.gate,
            speaker: self.speaker,
            ..Pit::default()
        };
    }

    fn write_count(&mut self, value: u8, now: Duration) {
        let count = match (self.access, self.low_written.take()) {
            (Access::Lsb, _) => u16::from(value),
            (Access::Msb, _) => u16::from(value) << 8,
            (Access::Word, None) => {
                self.low_written = Some(value);
                return;
            }
            (Access::Word, Some(low)) => u16::from(low) | (u16::from(value) << 8),
        };
        self.count = count;
        self.armed = true;
        self.started = self.gate.then_some(now);
    }

    fn read_count(&mut self, now: Duration) -> u8 {
        let value = self.latched.unwrap_or_else(|| self.counter(now));
        let [low, high] = value.to_le_bytes();
        match self.access {
            Access::Lsb => {
                self.latched = None;
                low
            }
            Access::Msb => {
                self.latched = None;
                high
            }
            Access::Word if self.msb_next => {
                self.msb_next = false;
                self.latched = None;
                high
            }
            Access::Word => {
                self.msb_next = true;
                low
            }
        }
    }

    /// Ticks since the counter started, if it did.
    fn ticks(&self, now: Duration) -> Option<u128> {
        self.started
            .map(|start| now.saturating_sub(start).as_nanos() * PIT_HZ / 1_000_000_000)
    }

    /// The count register: 0 stands for 65536, and past terminal count the
    /// counter wraps and goes on counting down.
    fn counter(&self, now: Duration) -> u16 {
        match self.ticks(now) {
            Some(ticks) => (u128::from(self.count).wrapping_sub(ticks) & 0xffff) as u16,
            None => self.count,
        }
    }

    fn expired(&self, now: Duration) -> bool {
        let full = if self.count == 0 {
            0x1_0000
        } else {
            u128::from(self.count)
        };
        self.ticks(now).is_some_and(|t| t >= full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn linux_s_calibration_window_lasts_the_programmed_count() {
        // pit_calibrate_tsc: gate up, speaker off, mode 0 word, a 10 ms
        // latch (11932 ticks), then spin on OUT2.
        let mut pit = Pit::default();
        let gate = pit.read(GATE_PORT, us(0));
        pit.write(GATE_PORT, (gate & !SPEAKER) | GATE, us(0));
        pit.write(COMMAND_PORT, 0xb0, us(1));
        pit.write(CHANNEL2_PORT, (11932 & 0xff) as u8, us(2));
        pit.write(CHANNEL2_PORT, (11932 >> 8) as u8, us(3));
        // (time in us, OUT2 expected)
        for (t, high) in [(3, false), (5_000, false), (10_002, false), (10_004, true)] {
            assert_eq!(pit.read(GATE_PORT, us(t)) & OUT2 != 0, high, "{t} us");
            assert_eq!(pit.read(GATE_PORT, us(t)) & GATE, GATE);
        }
    }

    #[test]
    fn the_counter_counts_down_and_reads_lsb_then_msb() {
        // quick_pit_calibrate: count 0xffff, then MSB by MSB.
        let mut pit = Pit::default();
        pit.write(GATE_PORT, GATE, us(0));
        pit.write(COMMAND_PORT, 0xb0, us(0));
        pit.write(CHANNEL2_PORT, 0xff, us(0));
        pit.write(CHANNEL2_PORT, 0xff, us(0));
        let word = |pit: &mut Pit, t| {
            let low = pit.read(CHANNEL2_PORT, us(t));
            let high = pit.read(CHANNEL2_PORT, us(t));
            u16::from_le_bytes([low, high])
        };
        // 1 ms is 1193 ticks.
        assert_eq!(word(&mut pit, 0), 0xffff);
        assert_eq!(word(&mut pit, 1000), 0xffff - 1193);
        // The latch command freezes the value until it is read.
        pit.write(COMMAND_PORT, 0x80, us(2000));
        assert_eq!(word(&mut pit, 5000), 0xffff - 2386);
        assert_eq!(word(&mut pit, 5000), 0xffff - 5965);
        // Past terminal count it wraps.
        assert_eq!(
            word(&mut pit, 60_000),
            (0xffffu32 + 0x10000 - 71_590) as u16
        );
    }

    #[test]
    fn counting_waits_for_the_gate_and_other_channels_are_absent() {
        let mut pit = Pit::default();
        pit.write(COMMAND_PORT, 0x90, us(0)); // channel 2, LSB only
        pit.write(CHANNEL2_PORT, 100, us(0));
        assert_eq!(pit.read(CHANNEL2_PORT, us(500)), 100, "gate low: stopped");
        assert_eq!(pit.read(GATE_PORT, us(500)) & OUT2, 0);
        pit.write(GATE_PORT, GATE | SPEAKER, us(500));
        assert_eq!(pit.read(GATE_PORT, us(500)), GATE | SPEAKER);
        assert_eq!(pit.read(CHANNEL2_PORT, us(550)), 41);
        assert_ne!(
            pit.read(GATE_PORT, us(600)) & OUT2,
            0,
            "100 ticks are 84 us"
        );
        // MSB-only access; a new mode command stops the channel.
        pit.write(COMMAND_PORT, 0xa0, us(600));
        assert_eq!(pit.read(GATE_PORT, us(700)) & OUT2, 0);
        pit.write(CHANNEL2_PORT, 2, us(700));
        assert_eq!(pit.read(CHANNEL2_PORT, us(700)), 2);
        // Channels 0 and 1 and their commands change nothing.
        let before = format!("{pit:?}");
        for (port, value) in [(0x40, 1), (0x41, 2), (0x43, 0x34), (0x43, 0x74)] {
            pit.write(port, value, us(800));
        }
        assert_eq!(format!("{pit:?}"), before);
        assert_eq!((pit.read(0x40, us(800)), pit.read(0x41, us(800))), (0, 0));
        assert!(Pit::claims(0x40) && Pit::claims(0x43) && Pit::claims(0x61));
        assert!(!Pit::claims(0x44) && !Pit::claims(0x60));
    }
}
