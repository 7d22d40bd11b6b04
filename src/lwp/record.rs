//! LWP event records: the 32-byte layout the unit stores into the ring and
//! the EventIds with their payloads (fact sheet §5).

use vm_memory::ByteValued;

/// The record size every profile uses.
pub const RECORD_SIZE: usize = 32;

/// EventIds the unit can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventId {
    /// 1: LWPVAL programmed sample.
    Val = 1,
    /// 2: instructions retired.
    Ire = 2,
    /// 3: branches retired.
    Bre = 3,
    /// 4: data-cache misses.
    Dme = 4,
    /// 5: CPU clocks not halted.
    Cnh = 5,
    /// 6: CPU reference clocks not halted.
    Rnh = 6,
    /// 255: LWPINS programmed event.
    Ins = 255,
}

impl EventId {
    /// Decodes a record's first byte.
    pub fn from_u8(id: u8) -> Option<EventId> {
        Some(match id {
            1 => EventId::Val,
            2 => EventId::Ire,
            3 => EventId::Bre,
            4 => EventId::Dme,
            5 => EventId::Cnh,
            6 => EventId::Rnh,
            255 => EventId::Ins,
            _ => return None,
        })
    }
}

/// BRE EventFlags bit: the branch was taken.
pub const BRANCH_TAKEN: u16 = 1 << 0;
/// BRE EventFlags bit: the branch was predicted correctly.
pub const BRANCH_PREDICTED: u16 = 1 << 1;
/// BRE EventFlags bit: the prediction bit is valid.
pub const BRANCH_PREDICTION_VALID: u16 = 1 << 2;

/// One event record, byte for byte as it lies in the ring.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventRecord {
    /// EventId.
    pub event_id: u8,
    /// CoreId from LWP_CFG[39:32].
    pub core_id: u8,
    /// EventFlags.
    pub event_flags: u16,
    /// Data1.
    pub data1: u32,
    /// Address of the instruction the event belongs to.
    pub instruction_address: u64,
    /// Data2.
    pub data2: u64,
    /// Performance TSC when PTSC is on, otherwise 0.
    pub timestamp: u64,
}

const _: () = assert!(std::mem::size_of::<EventRecord>() == RECORD_SIZE);

// SAFETY: EventRecord is repr(C) and made only of integers with no padding
// (the size assertion pins 32 bytes, the sum of the fields), so every byte
// pattern is a valid value.
unsafe impl ByteValued for EventRecord {}

/// What an LWPINS or LWPVAL supplies for its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProgrammedEvent {
    /// The r/m32 operand.
    pub data1: u32,
    /// The vvvv register operand, zero-extended when 32-bit.
    pub data2: u64,
    /// The imm32 operand; bits 15:0 become EventFlags.
    pub flags: u32,
    /// Address of the LWPINS or LWPVAL instruction.
    pub instruction_address: u64,
}

impl EventRecord {
    /// An LWPINS (255) or LWPVAL (1) record.
    pub fn programmed(id: EventId, core_id: u8, ev: &ProgrammedEvent, timestamp: u64) -> Self {
        EventRecord {
            event_id: id as u8,
            core_id,
            event_flags: ev.flags as u16,
            data1: ev.data1,
            instruction_address: ev.instruction_address,
            data2: ev.data2,
            timestamp,
        }
    }

    /// A hardware-style record with no payload (IRE, CNH, RNH).
    pub fn hardware(id: EventId, core_id: u8, ip: u64, timestamp: u64) -> Self {
        EventRecord {
            event_id: id as u8,
            core_id,
            instruction_address: ip,
            timestamp,
            ..Default::default()
        }
    }

    /// A branch-retired record: Data2 is the target.
    pub fn branch(core_id: u8, ip: u64, target: u64, taken: bool, timestamp: u64) -> Self {
        EventRecord {
            event_id: EventId::Bre as u8,
            core_id,
            event_flags: if taken { BRANCH_TAKEN } else { 0 },
            instruction_address: ip,
            data2: target,
            timestamp,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_fact_sheet() {
        let ev = ProgrammedEvent {
            data1: 0x4433_2211,
            data2: 0x8877_6655_0000_0000,
            flags: 0xDEAD_BEEF,
            instruction_address: 0x0040_1000,
        };
        let r = EventRecord::programmed(EventId::Ins, 0x07, &ev, 0x1234);
        let b = r.as_slice();
        assert_eq!(b[0], 255, "EventId");
        assert_eq!(b[1], 0x07, "CoreId");
        assert_eq!(
            &b[2..4],
            &0xBEEFu16.to_le_bytes(),
            "EventFlags: imm32[15:0]"
        );
        assert_eq!(&b[4..8], &0x4433_2211u32.to_le_bytes(), "Data1");
        assert_eq!(
            &b[8..16],
            &0x0040_1000u64.to_le_bytes(),
            "InstructionAddress"
        );
        assert_eq!(&b[16..24], &0x8877_6655_0000_0000u64.to_le_bytes(), "Data2");
        assert_eq!(&b[24..32], &0x1234u64.to_le_bytes(), "TimeStamp");
    }

    #[test]
    fn record_kinds() {
        let table = [
            (EventRecord::hardware(EventId::Cnh, 1, 0x10, 0), 5, 0, 0),
            (
                EventRecord::branch(1, 0x10, 0x99, true, 0),
                3,
                BRANCH_TAKEN,
                0x99,
            ),
            (EventRecord::branch(1, 0x10, 0x12, false, 0), 3, 0, 0x12),
        ];
        for (rec, id, flags, data2) in table {
            assert_eq!(rec.event_id, id);
            assert_eq!(rec.event_flags, flags);
            assert_eq!(rec.data2, data2);
            assert_eq!(rec.instruction_address, 0x10);
        }
    }

    #[test]
    fn event_ids() {
        for id in [1u8, 2, 3, 4, 5, 6, 255] {
            assert_eq!(EventId::from_u8(id).map(|e| e as u8), Some(id));
        }
        for id in [0u8, 7, 254] {
            assert_eq!(EventId::from_u8(id), None);
        }
    }
}
